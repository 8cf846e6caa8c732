"""dsv3_fused_a_gemm: (M, K) bf16 @ (K, N) bf16 column-major (weight.T) -> (M, N) bf16."""

from __future__ import annotations

import torch

from .. import registry
from ..backends import flashinfer as _fi
from ..backends import jit as _jit
from ..names import FUSED_A as OP
from ..registry import KernelBackend, KernelSpec
from . import _validate as v
from ._dispatch import Op


def _shape_key(output, mat_a, mat_b):
    """Where a call sits in the routing tables (routing.py)."""
    m, k = mat_a.shape
    return {"n": mat_b.shape[1], "k": k}, m


# Priority order where nothing was measured: jit, flashinfer, torch. Our kernels
# (jit/kernels/dsv3_fused_a_gemm.cuh) cover M <= 64, K % 8 == 0, any N, row-strided mat_a, on
# SM >= 9.0; tinygemm needs K % 64, N % 16 (M <= 64 here: the JIT window).
registry.register(
    KernelSpec(OP, KernelBackend.JIT, "slim_kernel.backends.jit:prepare_fused_a", prepare=True,
               min_sm=(9, 0), check=_jit.fused_a_check, probe=_jit.BACKEND.probe,
               note="our JIT kernels: M<=64, any N, K%8 (narrow: a CTA per few rows over the whole K, M<=16; stream: "
                    "loader warps and an mbarrier ring, M<=32; skinny: per-thread cp.async ring, split-K over warps)"),
    KernelSpec(OP, KernelBackend.FLASHINFER, "slim_kernel.backends.flashinfer:prepare_fused_a", prepare=True,
               min_sm=(9, 0), check=_fi.fused_a_check, probe=_fi.BACKEND.probe,
               note="flashinfer tinygemm_bf16(mat_a, mat_b.T), or a pinned sm_90a program (variants s8il, cn16)"),
    KernelSpec(OP, KernelBackend.TORCH, "slim_kernel.backends.torch_ref:dsv3_fused_a_gemm",
               device_types=frozenset({"cpu", "cuda"}), note="fp32-accumulating reference, any shape"),
)
registry.register_op(OP, _shape_key)


_op = Op(OP, "Tensor mat_a, Tensor mat_b", pdl_sensitive=True)


def validate(mat_a, mat_b, output) -> tuple[tuple[int, int], torch.dtype]:
    v.tensor("mat_a", mat_a)
    v.tensor("mat_b", mat_b)
    v.rank("mat_a", mat_a, 2, "(M, K)")
    v.rank("mat_b", mat_b, 2, "(K, N)")
    v.dtype("mat_a", mat_a, (torch.bfloat16,))
    v.dtype("mat_b", mat_b, (torch.bfloat16,))
    m, k = mat_a.shape
    if mat_b.shape[0] != k:
        raise ValueError(f"mat_b must be (K, N) with K={k} like mat_a, got shape {tuple(mat_b.shape)}")
    n = mat_b.shape[1]
    v.nonempty("mat_a", k, "column (K)")
    v.nonempty("mat_b", n, "column (N)")
    v.same_device("mat_b", mat_b, mat_a.device, "mat_a")
    if not v.column_major(mat_b):
        raise ValueError(f"mat_b must be column-major (weight.T of a contiguous (N, K) weight), "
                         f"got strides {mat_b.stride()}")
    if output is not None:
        v.output("output", output, (m, n), torch.bfloat16, mat_a.device)
    return (m, n), torch.bfloat16


def dsv3_fused_a_gemm(mat_a: torch.Tensor, mat_b: torch.Tensor, output: torch.Tensor | None = None, *,
                      backend: str | None = None) -> torch.Tensor:
    """DeepSeek-V3 fused q_a/kv_a projection: ``mat_a @ mat_b`` in bf16 with fp32 accumulation."""
    return _op(lambda: validate(mat_a, mat_b, output), backend, output, (mat_a, mat_b))
