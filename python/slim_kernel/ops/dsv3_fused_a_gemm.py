"""dsv3_fused_a_gemm: (M, K) bf16 @ (K, N) bf16 column-major (weight.T) -> (M, N) bf16."""

from __future__ import annotations

import torch

from .. import registry
from ..backends import jit as _jit
from ..registry import KernelBackend, KernelSpec
from . import _validate as v
from ._dispatch import Op, flashinfer_probe

OP = "dsv3_fused_a_gemm"


def _flashinfer_check(output, mat_a, mat_b) -> str | None:
    m, k = mat_a.shape
    n = mat_b.shape[1]
    if not 1 <= m <= 16:
        return f"M={m} is outside 1..16"
    if k % 64:
        return f"K={k} is not a multiple of 64"
    if n % 16:
        return f"N={n} is not a multiple of 16"
    if not mat_b.t().is_contiguous():
        return "mat_b is not the transpose of a contiguous (N, K) weight"
    # the backend passes mat_a.contiguous(): a contiguous view is passed as is, and tinygemm's
    # 16-byte loads fault on one that is not 16-byte aligned (e.g. a one-row slice)
    if mat_a.is_contiguous() and mat_a.data_ptr() % 16:
        return "mat_a is contiguous but not 16-byte aligned"
    if mat_b.data_ptr() % 16:
        return "mat_b is not 16-byte aligned"
    return None


# Measured rule (H200, cold, CUDA-graph replay, run 7 = benchmark/results/h200/bench_gemm.json;
# NOTES_kernels.md): without PDL tinygemm is faster at M <= 8 (9.7-10.0 us vs our 10.4-11.6);
# with PDL (our default) ours is faster than tinygemm as the flashinfer backend runs it (no PDL):
# 8.6-9.3 vs 9.7-10.0 us at M <= 8; at M >= 9 ours wins either way (11.7-12.9 / 9.5-10.6 vs
# tinygemm's 15.5-17.0, which switches tiles above 8 tokens). So the JIT spec defers to tinygemm
# when PDL is off and M <= DEFER_MAX_M and tinygemm can serve the call.
DEFER_MAX_M = 8
_FLASHINFER_INSTALLED: list = []


def _jit_defer(output, mat_a, mat_b) -> str | None:
    if _jit.PDL or mat_a.shape[0] > DEFER_MAX_M or _flashinfer_check(output, mat_a, mat_b) is not None:
        return None
    if not _FLASHINFER_INSTALLED:
        _FLASHINFER_INSTALLED.append(flashinfer_probe() is None)
    if _FLASHINFER_INSTALLED[0]:
        return f"tinygemm measured faster without PDL at M <= {DEFER_MAX_M}"
    return None


# Priority: jit, flashinfer, torch (jit defers as above). Our kernel (kernels/dsv3_fused_a_gemm.cuh)
# covers M <= 16, K % 8 == 0, any N, row-strided mat_a, on SM >= 9.0; tinygemm needs K % 64, N % 16.
registry.register(
    KernelSpec(OP, KernelBackend.JIT, "slim_kernel.backends.jit:dsv3_fused_a_gemm",
               min_sm=(9, 0), check=_jit.fused_a_check, probe=_jit.probe, defer=_jit_defer,
               note=f"first for M<=16, any N, K%8 (swap-AB mma, 16-row CTA per SM, 8 warps split K); "
                    f"defers to tinygemm when PDL is off and M<={DEFER_MAX_M} (H200: faster there)"),
    KernelSpec(OP, KernelBackend.FLASHINFER, "slim_kernel.backends.flashinfer:dsv3_fused_a_gemm",
               min_sm=(9, 0), check=_flashinfer_check, probe=flashinfer_probe,
               note="tinygemm_bf16(mat_a, mat_b.T)"),
    KernelSpec(OP, KernelBackend.TORCH, "slim_kernel.backends.torch_ref:dsv3_fused_a_gemm",
               device_types=frozenset({"cpu", "cuda"}), note="fp32-accumulating reference, any shape"),
)


_op = Op(OP, "Tensor mat_a, Tensor mat_b")


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
    v.nonempty("mat_a", m, "row (M)")
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
