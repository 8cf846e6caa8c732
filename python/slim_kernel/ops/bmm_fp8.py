"""bmm_fp8: (A * A_scale) @ (B * B_scale) for fp8 A (b,m,k) row-major and B (b,k,n) column-major."""

from __future__ import annotations

import torch

from .. import registry
from ..backends import flashinfer as _fi
from ..names import BMM_FP8 as OP
from ..registry import KernelBackend, KernelSpec
from . import _validate as v
from ._dispatch import Op

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
OUT_DTYPES = (torch.bfloat16, torch.float16)


registry.register(
    KernelSpec(OP, KernelBackend.FLASHINFER, "slim_kernel.backends.flashinfer:bmm_fp8",
               # not on SM 12.x: its cuBLASLt path fails there (CUBLAS_STATUS_NOT_SUPPORTED on sm_120,
               # flashinfer-ai/flashinfer#3255; the cuDNN one on GB10, #3566), so the torch reference serves
               min_sm=(8, 9), max_sm=(11, 0), check=_fi.bmm_fp8_check, probe=_fi.BACKEND.probe,
               note="flashinfer.bmm_fp8(backend='cublas'), bit-identical"),
    KernelSpec(OP, KernelBackend.TORCH, "slim_kernel.backends.torch_ref:bmm_fp8",
               device_types=frozenset({"cpu", "cuda"}), note="fp32 reference, any shape"),
)


_op = Op(OP, "Tensor A, Tensor B, Tensor A_scale, Tensor B_scale")


def _scale(name: str, s, device: torch.device) -> None:
    v.tensor(name, s)
    if s.numel() != 1 or s.dim() > 1:
        raise ValueError(f"{name} must be a one-element tensor of rank 0 or 1, got shape {tuple(s.shape)}")
    v.dtype(name, s, (torch.float32,))
    v.same_device(name, s, device, "A")


def validate(A, B, A_scale, B_scale, dtype, out) -> tuple[tuple[int, int, int], torch.dtype]:
    v.tensor("A", A)
    v.tensor("B", B)
    v.rank("A", A, 3, "(b, m, k)")
    v.rank("B", B, 3, "(b, k, n)")
    v.dtype("A", A, FP8)
    v.dtype("B", B, FP8)
    v.dtype_arg("dtype", dtype, OUT_DTYPES)
    b, m, k = A.shape
    if B.shape[0] != b:
        raise ValueError(f"B must have batch size {b} like A, got {B.shape[0]}")
    if B.shape[1] != k:
        raise ValueError(f"B must have k={k} rows like A's last dim, got shape {tuple(B.shape)}")
    n = B.shape[2]
    v.nonempty("A", b, "batch")
    v.nonempty("A", k, "column (k)")
    v.nonempty("B", n, "column (n)")
    v.same_device("B", B, A.device, "A")
    if not v.column_major(B):
        raise ValueError(
            f"B must be column-major (W.transpose(-2, -1) of a contiguous (b, n, k) tensor), "
            f"got strides {B.stride()}")
    if not v.row_major_rows(A):
        raise ValueError(f"A must be row-major (unit stride along k), got strides {A.stride()}")
    _scale("A_scale", A_scale, A.device)
    _scale("B_scale", B_scale, A.device)
    if out is not None:
        v.output("out", out, (b, m, n), dtype, A.device)
    return (b, m, n), dtype


def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor,
            dtype: torch.dtype, out: torch.Tensor | None = None, *, backend: str | None = None) -> torch.Tensor:
    """fp8 batched GEMM: ``(A * A_scale) @ (B * B_scale)`` in ``dtype`` (bf16 or fp16)."""
    return _op(lambda: validate(A, B, A_scale, B_scale, dtype, out), backend, out, (A, B, A_scale, B_scale), dtype)
