"""dsv3_router_gemm: (M, K) bf16 hidden states @ (E, K) bf16 router weight^T -> (M, E) fp32 or bf16."""

from __future__ import annotations

import torch

from .. import registry
from ..backends import jit as _jit
from ..registry import KernelBackend, KernelSpec
from . import _validate as v
from ._dispatch import Op, flashinfer_probe

OP = "dsv3_router_gemm"
OUT_DTYPES = (torch.float32, torch.bfloat16)
FLASHINFER_K = 7168
FLASHINFER_EXPERTS = (256, 384)


def _flashinfer_check(output, hidden_states, router_weights) -> str | None:
    m, k = hidden_states.shape
    if not 1 <= m <= 16:
        return f"M={m} is outside 1..16"
    if k != FLASHINFER_K:
        return f"K={k} is not {FLASHINFER_K}"
    if router_weights.shape[0] not in FLASHINFER_EXPERTS:
        return f"E={router_weights.shape[0]} is not one of {FLASHINFER_EXPERTS}"
    if not router_weights.is_contiguous():
        return "router_weights is not contiguous"
    # the backend passes hidden_states.contiguous(): a contiguous view is passed as is, and
    # flashinfer's 16-byte loads fault on one that is not 16-byte aligned (e.g. a one-row slice)
    if hidden_states.is_contiguous() and hidden_states.data_ptr() % 16:
        return "hidden_states is contiguous but not 16-byte aligned"
    if router_weights.data_ptr() % 16:
        return "router_weights is not 16-byte aligned"
    return None


# Measured rule (H200, cold, CUDA-graph replay, run 7 = benchmark/results/h200/bench_gemm.json;
# NOTES_kernels.md): with PDL (our default) the JIT kernel ties flashinfer-as-served (no PDL) at
# M=1 (3.00 vs 2.96 us E=256, 3.43 vs 3.43 E=384) and is faster from M=2 on (3.57 vs 6.27 at
# M=16). Without PDL flashinfer's kernel is faster up to M=10 (2.96 vs 4.62 us at M=1, 5.08 vs
# 5.19 at M=10, E=256; 5.99 vs 6.04 at M=10, E=384) and ours from M=11 on. So the JIT spec
# defers to flashinfer when PDL is off, M <= DEFER_MAX_M and flashinfer can serve the call.
DEFER_MAX_M = 10
_FLASHINFER_INSTALLED: list = []


def _flashinfer_serves(output, hidden_states, router_weights) -> bool:
    if _flashinfer_check(output, hidden_states, router_weights) is not None:
        return False
    if not _FLASHINFER_INSTALLED:
        _FLASHINFER_INSTALLED.append(flashinfer_probe() is None)
    dev = hidden_states.device.index if hidden_states.device.index is not None else torch.cuda.current_device()
    return _FLASHINFER_INSTALLED[0] and (9, 0) <= registry._capability(dev) <= (10, 7)


def _jit_defer(output, hidden_states, router_weights) -> str | None:
    if _jit.PDL or hidden_states.shape[0] > DEFER_MAX_M:
        return None
    if _flashinfer_serves(output, hidden_states, router_weights):
        return f"flashinfer measured faster without PDL at M <= {DEFER_MAX_M}"
    return None


# Priority: jit, flashinfer, torch (jit defers as above). Our kernel (kernels/dsv3_router_gemm.cuh)
# covers M <= 16, any E, K % 8 == 0, row-strided activations, on SM >= 9.0; flashinfer covers
# K=7168, E 256/384.
registry.register(
    KernelSpec(OP, KernelBackend.JIT, "slim_kernel.backends.jit:dsv3_router_gemm",
               min_sm=(9, 0), check=_jit.router_check, probe=_jit.probe, defer=_jit_defer,
               note=f"first for M<=16, any E, K%8 (swap-AB mma, cluster split-K); defers to flashinfer "
                    f"when PDL is off and M<={DEFER_MAX_M} (H200: faster there)"),
    KernelSpec(OP, KernelBackend.FLASHINFER, "slim_kernel.backends.flashinfer:dsv3_router_gemm",
               min_sm=(9, 0), max_sm=(10, 7), check=_flashinfer_check, probe=flashinfer_probe,
               note="mm_M1_16_K7168_N256/N384 (+_bf16)"),
    KernelSpec(OP, KernelBackend.TORCH, "slim_kernel.backends.torch_ref:dsv3_router_gemm",
               device_types=frozenset({"cpu", "cuda"}), note="fp32-accumulating reference, any shape"),
)


_op = Op(OP, "Tensor hidden_states, Tensor router_weights")


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
    v.nonempty("hidden_states", m, "row (M)")
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
