"""flashinfer backend. Importing this module imports flashinfer (so only on first use)."""

from __future__ import annotations

import os
from importlib import metadata

import torch
from flashinfer import bmm_fp8 as _fi_bmm_fp8
from flashinfer.gemm import (
    mm_M1_16_K7168_N256,
    mm_M1_16_K7168_N256_bf16,
    mm_M1_16_K7168_N384,
    mm_M1_16_K7168_N384_bf16,
    tinygemm_bf16,
)

from .. import knobs

# (num_experts, out dtype) -> flashinfer router kernel; all take K = 7168 and M in 1..16.
ROUTER_KERNELS = {
    (256, torch.float32): mm_M1_16_K7168_N256,
    (256, torch.bfloat16): mm_M1_16_K7168_N256_bf16,
    (384, torch.float32): mm_M1_16_K7168_N384,
    (384, torch.bfloat16): mm_M1_16_K7168_N384_bf16,
}


# flashinfer versions whose bmm_fp8(backend="cublas") internals _CublasFp8Direct replays.
DIRECT_BMM_FP8_VERSIONS = ("0.7.2", "0.7.2.post1")


class _CublasFp8Direct:
    """flashinfer.bmm_fp8(..., backend="cublas") without its 60-100 µs of per-call Python.

    The public call builds a cuBLAS runner, asks the autotuner for a (runner, tactic) and
    runs it on a process-wide workspace. Here the runner is built once and the tuner's
    answer and the workspace are cached per shape/dtype/device signature (asked again whenever
    the tuner is tuning or its cache changed), so the very same cuBLASLt call runs:
    bit-identical by construction.
    """

    def __init__(self):
        from flashinfer.gemm import gemm_base
        from flashinfer.jit.gemm import gen_gemm_module

        self._gb = gemm_base
        self._tuner = gemm_base.AutoTuner.get()
        self._runner = gemm_base.get_gemm_module().cublas_fp8_gemm_runner()
        # What the runner calls for tactic -1 (cuBLASLt's heuristic): called directly here.
        self._heuristic = gen_gemm_module().build_and_load().bmm_fp8
        self._plans: dict = {}  # (shapes, dtypes, device, tuner cache size) -> (tactic, workspace)

    def __call__(self, out, A, B, A_scale, B_scale) -> None:
        tuner = self._tuner
        key = (A.shape, B.shape, A.dtype, B.dtype, out.dtype, A.device, len(tuner.profiling_cache))
        plan = self._plans.get(key)
        if plan is None or tuner.is_tuning_mode:
            gb = self._gb
            ws = gb._get_cache_buf("bmm_fp8_workspace", gb.DEFAULT_WORKSPACE_SIZE, A.device)
            _, tactic = tuner.choose_one("fp8_gemm", [self._runner], gb._FP8_GEMM_SM100_TUNING_CONFIG,
                                         [A, B, A_scale, B_scale, out, ws])
            plan = self._plans[key] = (tactic, ws)
        tactic, ws = plan
        if tactic == -1:
            self._heuristic(A, B, out, A_scale, B_scale, ws)
        else:
            self._runner(inputs=[A, B, A_scale, B_scale, out, ws], tactic=tactic)


_direct: list = []  # [_CublasFp8Direct | None] once decided (built lazily: it JIT-builds flashinfer's gemm module)


def direct_bmm_fp8() -> _CublasFp8Direct | None:
    """The direct path, or None (other flashinfer version, internals moved, or SLIM_KERNEL_FLASHINFER_DIRECT=0)."""
    if not _direct:
        use = (os.environ.get("SLIM_KERNEL_FLASHINFER_DIRECT", "1") != "0"
               and metadata.version("flashinfer-python") in DIRECT_BMM_FP8_VERSIONS)
        try:
            _direct.append(_CublasFp8Direct() if use else None)
        except (ImportError, AttributeError):  # internals moved: the public call still works
            _direct.append(None)
    return _direct[0]


def bmm_fp8(out: torch.Tensor, A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor) -> None:
    # flashinfer's cublas path reads dense operands and checks no strides: make them dense
    # (a no-op for the usual contiguous A and W.transpose(-2, -1) B).
    if not A.is_contiguous():
        A = A.contiguous()
    b, k, n = B.shape
    sb = B.stride()
    if not (sb[1] == 1 and (n == 1 or sb[2] == k) and (b == 1 or sb[0] == k * n)):
        B = B.transpose(-2, -1).contiguous().transpose(-2, -1)
    direct = _direct[0] if _direct else direct_bmm_fp8()
    if direct is not None:
        direct(out, A, B, A_scale, B_scale)
    else:
        _fi_bmm_fp8(A, B, A_scale, B_scale, out.dtype, out, backend="cublas")


# Both GEMMs launch with PDL when our knob is on (knobs.pdl(): the weights are parameters, not
# written by the kernel before): the way the routing table measured them.
def dsv3_router_gemm(output: torch.Tensor, hidden_states: torch.Tensor, router_weights: torch.Tensor) -> None:
    kernel = ROUTER_KERNELS[(router_weights.shape[0], output.dtype)]
    # flashinfer wants a dense (M, K) activation and the (K, E) column-major weight view.
    kernel(hidden_states.contiguous(), router_weights.t(), output, launch_with_pdl=knobs.pdl())


def dsv3_fused_a_gemm(output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor) -> None:
    # tinygemm computes input @ weight.T with a contiguous (N, K) weight: mat_b.T, no copy.
    tinygemm_bf16(mat_a.contiguous(), mat_b.t(), output, use_pdl=knobs.pdl())
