"""Build the flashinfer JIT modules slim-kernel routes to, once, before tests and benchmarks use them."""

import sys
import time

import torch


def main(names: list[str]) -> None:
    try:
        import flashinfer
        from flashinfer.gemm import mm_M1_16_K7168_N256, tinygemm_bf16
    except ImportError as exc:
        print(f"flashinfer unavailable: {exc}")
        return
    dev = "cuda"
    steps = {
        "bmm_fp8 (gemm)": lambda: flashinfer.bmm_fp8(
            torch.randn(1, 16, 32, device=dev).to(torch.float8_e4m3fn),
            torch.randn(1, 16, 32, device=dev).to(torch.float8_e4m3fn).transpose(-2, -1),
            torch.ones(1, device=dev), torch.ones(1, device=dev), torch.bfloat16, backend="cublas"),
        "router (dsv3_router_gemm)": lambda: mm_M1_16_K7168_N256(
            torch.randn(1, 7168, device=dev, dtype=torch.bfloat16),
            torch.randn(256, 7168, device=dev, dtype=torch.bfloat16).t(),
            torch.empty(1, 256, device=dev), launch_with_pdl=False),
        "tinygemm2": lambda: tinygemm_bf16(
            torch.randn(1, 7168, device=dev, dtype=torch.bfloat16),
            torch.randn(2112, 7168, device=dev, dtype=torch.bfloat16),
            torch.empty(1, 2112, device=dev, dtype=torch.bfloat16)),
    }
    for name, step in steps.items():
        if names and not any(n in name for n in names):
            continue
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        print(f"flashinfer {name}: ready in {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])  # substrings of step names; none = all
