"""Build the flashinfer JIT modules slim-kernel and the benchmarks use, once, before tests and timings.

    python3 benchmark/warm_flashinfer.py --list        the step names, one per line
    python3 benchmark/warm_flashinfer.py [STEP ...]    build these (step names; none = all)

Each step is one module (or one generated program, for 0.7.4's tinygemm): run one process per step
to build them in parallel (benchmark/gpu_run.sh does).
"""

import sys
import time
from pathlib import Path

import torch

# gpu_run.sh lists the steps before it installs slim-kernel: the shapes come from the source tree then
sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))


def steps() -> dict:
    import flashinfer
    import flashinfer.gemm
    import flashinfer.norm

    from slim_kernel import models

    dev = "cuda"

    def act(m, k=7168):
        return torch.randn(m, k, device=dev, dtype=torch.bfloat16)

    def tiny(m, pdl, n, k):
        return lambda: flashinfer.gemm.tinygemm_bf16(act(m, k), act(n, k), torch.empty(m, n, device=dev,
                                                                                       dtype=torch.bfloat16), use_pdl=pdl)

    out = {
        "bmm_fp8 (gemm)": lambda: flashinfer.bmm_fp8(
            torch.randn(1, 16, 32, device=dev).to(torch.float8_e4m3fn),
            torch.randn(1, 16, 32, device=dev).to(torch.float8_e4m3fn).transpose(-2, -1),
            torch.ones(1, device=dev), torch.ones(1, device=dev), torch.bfloat16, backend="cublas"),
        "router (one module for every fixed-shape router)": lambda: flashinfer.gemm.mm_M1_16_K7168_N256(
            act(1), act(256).t(), torch.empty(1, 256, device=dev), launch_with_pdl=False),
        "rmsnorm": lambda: flashinfer.norm.rmsnorm(act(1), torch.ones(7168, device=dev, dtype=torch.bfloat16),
                                                   1e-6, enable_pdl=True),
    }
    for s in dict.fromkeys(s for s in models.all_shapes() if s.op == models.FUSED_A):
        for m in (1, 16, 32, 64):  # 0.7.4 builds one program per tile window and PDL flag
            for pdl in (False, True):
                out[f"tinygemm_n{s.n}_k{s.k}_m{m}{'_pdl' if pdl else ''}"] = tiny(m, pdl, s.n, s.k)
    return out


def main(argv: list[str]) -> None:
    try:
        todo = steps()
    except ImportError as exc:
        print(f"flashinfer unavailable: {exc}")
        return
    if argv == ["--list"]:
        print("\n".join(todo))
        return
    for name, step in todo.items():
        if argv and name not in argv:
            continue
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        print(f"flashinfer {name}: ready in {time.perf_counter() - t:.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
