"""Torch reference: any shape, any device, fp32 accumulation. The CPU path and the last fallback."""

from __future__ import annotations

import torch


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with fp32 accumulation and an fp32 result (no bf16 split-K reduction)."""
    if a.is_cuda and a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16:
        if a.dim() == 2:
            return torch.mm(a, b, out_dtype=torch.float32)
        return torch.bmm(a, b, out_dtype=torch.float32)
    return torch.matmul(a.float(), b.float())


def bmm_fp8(out: torch.Tensor, A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor) -> None:
    # cuBLASLt semantics: fp32 accumulate, scale by A_scale * B_scale, round once to out dtype.
    prod = torch.matmul(A.float(), B.float())
    out.copy_(prod.mul_(A_scale * B_scale))


def dsv3_router_gemm(output: torch.Tensor, hidden_states: torch.Tensor, router_weights: torch.Tensor) -> None:
    if (output.dtype == torch.float32 and output.is_contiguous() and hidden_states.is_cuda
            and hidden_states.dtype == torch.bfloat16 and router_weights.dtype == torch.bfloat16):
        # cuBLAS writes the fp32 logits in place: no second kernel for the copy (1.2-1.4 us in a graph)
        torch.mm(hidden_states, router_weights.t(), out_dtype=torch.float32, out=output)
        return
    output.copy_(_mm_fp32(hidden_states, router_weights.t()))


def dsv3_fused_a_gemm(output: torch.Tensor, mat_a: torch.Tensor, mat_b: torch.Tensor) -> None:
    output.copy_(_mm_fp32(mat_a, mat_b))
