"""Torch reference: any shape, any device, fp32 accumulation. The CPU path and the last fallback."""

from __future__ import annotations

import torch

from ..backend import Backend

# torch.mm/bmm(..., out_dtype=) (bf16 operands -> an fp32 result from cuBLAS, CUDA only) came after
# the oldest torch this package supports; where it is missing the operands go up to fp32 first
# (the same fp32 accumulation, one more copy of each operand).
MM_OUT_DTYPE = "dtype" in torch.ops.aten.mm.overloads() and "dtype" in torch.ops.aten.bmm.overloads()


def _bf16_on_cuda(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.is_cuda and a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with fp32 accumulation and an fp32 result (no bf16 split-K reduction)."""
    if MM_OUT_DTYPE and _bf16_on_cuda(a, b):
        if a.dim() == 2:
            return torch.mm(a, b, out_dtype=torch.float32)
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.matmul(a.float(), b.float())


def bmm_fp8(out: torch.Tensor, A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor) -> None:
    # cuBLASLt semantics: fp32 accumulate, scale by A_scale * B_scale, round once to out dtype.
    prod = torch.matmul(A.float(), B.float())
    out.copy_(prod.mul_(A_scale * B_scale))


def _mm_into(output: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """output = a @ b. On CUDA with bf16 operands and a contiguous output, cuBLAS writes the output
    in place (fp32 compute, as F.linear; 1.2-1.4 us less than compute-then-copy in a graph, and the
    same error on the H200 runs: bf16 rounding of the result, 1.6e-3 relative). Elsewhere: fp32, then copy."""
    if _bf16_on_cuda(a, b) and output.is_contiguous():
        if output.dtype == torch.bfloat16:
            torch.mm(a, b, out=output)
            return
        if output.dtype == torch.float32 and MM_OUT_DTYPE:
            torch.mm(a, b, out_dtype=torch.float32, out=output)
            return
    output.copy_(_mm_fp32(a, b))


def dsv3_router_gemm(output: torch.Tensor, hidden_states: torch.Tensor, router_weights: torch.Tensor) -> None:
    _mm_into(output, hidden_states, router_weights.t())


def dsv3_fused_a_gemm(output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor) -> None:
    _mm_into(output, mat_a, mat_b)


class TorchBackend(Backend):
    """The reference: one candidate (``torch``), any shape, any device."""

    name = "torch"


BACKEND = TorchBackend()
