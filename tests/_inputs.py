"""Random inputs and float64 references for the three ops (shared by CPU and GPU tests)."""

import torch


def randn(shape, gen, dtype=torch.bfloat16, device="cpu"):
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype=dtype, device=device)


def to_fp8(x: torch.Tensor, dtype):
    """Quantize to fp8 with a per-tensor scale; returns (fp8 tensor, fp32 one-element dequant scale)."""
    finfo = torch.finfo(dtype)
    amax = x.abs().amax().clamp(min=1e-12).float()
    scale = finfo.max / amax
    q = (x.float() * scale).clamp(finfo.min, finfo.max).to(dtype)
    return q, scale.reciprocal().reshape(1).to(x.device)


def bmm_fp8_inputs(b, m, k, n, gen, a_dtype=torch.float8_e4m3fn, b_dtype=torch.float8_e4m3fn, device="cpu"):
    A, A_scale = to_fp8(randn((b, m, k), gen, torch.float32, device), a_dtype)
    W, B_scale = to_fp8(randn((b, n, k), gen, torch.float32, device), b_dtype)
    return A, W.transpose(-2, -1), A_scale, B_scale


def bmm_fp8_ref(A, B, A_scale, B_scale):
    return (A.double() @ B.double()) * (A_scale.double() * B_scale.double())


def router_ref(h, W):
    return h.double() @ W.double().t()


def fused_a_ref(a, b):
    return a.double() @ b.double()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf (never passes)."""
    out64 = out.double()
    if not torch.isfinite(out64).all():
        return float("inf")
    ref64 = ref.double().to(out64.device)
    return ((out64 - ref64).norm() / ref64.norm()).item()


TOL = {torch.float32: 1e-5, torch.bfloat16: 5e-3, torch.float16: 1e-3}
