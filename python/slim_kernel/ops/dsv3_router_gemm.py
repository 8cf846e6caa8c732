"""dsv3_router_gemm: (M, K) bf16 hidden states @ (E, K) bf16 router weight^T -> (M, E) fp32 or bf16."""

from __future__ import annotations

import torch

from .. import registry
from ..backends import flashinfer as _fi
from ..backends import jit as _jit
from ..names import ROUTER as OP
from ..registry import KernelBackend, KernelSpec
from . import _validate as v
from ._dispatch import Op

OUT_DTYPES = (torch.float32, torch.bfloat16)


def _shape_key(output, hidden_states, router_weights):
    """Where a call sits in the routing tables (routing.py)."""
    m, k = hidden_states.shape
    return {"e": router_weights.shape[0], "k": k, "out": str(output.dtype).removeprefix("torch.")}, m


# Priority order where nothing was measured: jit, flashinfer, torch. Our kernels
# (jit/kernels/dsv3_router_gemm.cuh) cover M <= 64, any E, K % 8, row-strided activations, on
# SM >= 9.0; flashinfer covers its fixed shapes (names.FLASHINFER_ROUTERS), M <= 16, SM 9.0-10.x.
registry.register(
    KernelSpec(OP, KernelBackend.JIT, "slim_kernel.backends.jit:prepare_router", prepare=True,
               min_sm=(9, 0), check=_jit.router_check, probe=_jit.BACKEND.probe,
               note="our JIT kernels: M<=64, any E, K%8 (narrow: a CTA per few experts; direct, ring, skinny: cluster split-K)"),
    KernelSpec(OP, KernelBackend.FLASHINFER, "slim_kernel.backends.flashinfer:prepare_router", prepare=True,
               min_sm=(9, 0), max_sm=(10, 7), check=_fi.router_check, probe=_fi.BACKEND.probe,
               note="flashinfer mm_M1_16_K{K}_N{E}[_bf16]: E 128/256/384/896, K 7168 (and 6144 at E=256)"),
    KernelSpec(OP, KernelBackend.TORCH, "slim_kernel.backends.torch_ref:dsv3_router_gemm",
               device_types=frozenset({"cpu", "cuda"}), note="fp32-accumulating reference, any shape"),
)
registry.register_op(OP, _shape_key)


_op = Op(OP, "Tensor hidden_states, Tensor router_weights", pdl_sensitive=True)


def validate(hidden_states, router_weights, out_dtype, output) -> tuple[tuple[int, int], torch.dtype]:
    v.tensor("hidden_states", hidden_states)
    v.tensor("router_weights", router_weights)
    v.rank("hidden_states", hidden_states, 2, "(M, K)")
    v.rank("router_weights", router_weights, 2, "(E, K)")
    v.dtype("hidden_states", hidden_states, (torch.bfloat16,))
    v.dtype("router_weights", router_weights, (torch.bfloat16,))
    v.dtype_arg("out_dtype", out_dtype, OUT_DTYPES)
    m, k = hidden_states.shape
    e = router_weights.shape[0]
    if router_weights.shape[1] != k:
        raise ValueError(f"router_weights must be (E, K) with K={k} like hidden_states, "
                         f"got shape {tuple(router_weights.shape)}")
    v.nonempty("hidden_states", k, "column (K)")
    v.nonempty("router_weights", e, "expert row (E)")
    v.same_device("router_weights", router_weights, hidden_states.device, "hidden_states")
    if output is not None:
        v.output("output", output, (m, e), out_dtype, hidden_states.device)
    return (m, e), out_dtype


def dsv3_router_gemm(hidden_states: torch.Tensor, router_weights: torch.Tensor,
                     out_dtype: torch.dtype = torch.bfloat16, output: torch.Tensor | None = None, *,
                     backend: str | None = None) -> torch.Tensor:
    """MoE router logits: ``hidden_states @ router_weights.T`` with fp32 accumulation."""
    return _op(lambda: validate(hidden_states, router_weights, out_dtype, output), backend, output,
               (hidden_states, router_weights), out_dtype)
