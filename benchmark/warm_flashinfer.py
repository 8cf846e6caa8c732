"""Build the flashinfer JIT modules slim-kernel and the benchmarks use, once, before tests and timings.

    python3 benchmark/warm_flashinfer.py [STEP ...]     (substrings of step names; none = all)

Each step is one module (or one generated program, for 0.7.4's tinygemm): run several processes
with one step each to build them in parallel (benchmark/gpu_run.sh does).
"""

import sys
import time

import torch


def main(names: list[str]) -> None:
    try:
        import flashinfer
        import flashinfer.norm
        from flashinfer.gemm import mm_M1_16_K7168_N256, tinygemm_bf16
    except ImportError as exc:
        print(f"flashinfer unavailable: {exc}")
        return
    dev = "cuda"

    def act(m, k=7168):
        return torch.randn(m, k, device=dev, dtype=torch.bfloat16)

    def tiny(m, pdl):
        return lambda: tinygemm_bf16(act(m), act(2112), torch.empty(m, 2112, device=dev, dtype=torch.bfloat16),
                                     use_pdl=pdl)

    steps = {
        "bmm_fp8 (gemm)": lambda: flashinfer.bmm_fp8(
            torch.randn(1, 16, 32, device=dev).to(torch.float8_e4m3fn),
            torch.randn(1, 16, 32, device=dev).to(torch.float8_e4m3fn).transpose(-2, -1),
            torch.ones(1, device=dev), torch.ones(1, device=dev), torch.bfloat16, backend="cublas"),
        "router (dsv3_router_gemm)": lambda: mm_M1_16_K7168_N256(
            act(1), act(256).t(), torch.empty(1, 256, device=dev), launch_with_pdl=False),
        "rmsnorm": lambda: flashinfer.norm.rmsnorm(act(1), torch.ones(7168, device=dev, dtype=torch.bfloat16),
                                                   1e-6, enable_pdl=True),
    }
    for m in (1, 16):  # 0.7.4 builds one program per tile (M <= 12, 13..16) and PDL flag
        for pdl in (False, True):
            steps[f"tinygemm{m}{'_pdl' if pdl else ''}"] = tiny(m, pdl)
    for name, step in steps.items():
        if names and not any(n in name for n in names):
            continue
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        print(f"flashinfer {name}: ready in {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
