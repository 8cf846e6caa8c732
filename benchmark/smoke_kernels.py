"""Run every JIT kernel configuration once, each in its own process (GPU machine).

    python3 benchmark/smoke_kernels.py [--bad-file PATH]

A kernel that traps (a lost mbarrier arrival, a launch with too little shared memory) leaves its
CUDA context unusable, so each catalogue variant is checked in a fresh process against a float64
reference at a few M, all processes in parallel. Prints one line per variant; the variants that
failed are written to --bad-file (one per line).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CHILD = r"""
import sys, torch
from slim_kernel.backends import jit as jb
from slim_kernel.jit import catalogue as cat
op, name = sys.argv[1], sys.argv[2]
cfg = cat.VARIANTS[op][name]
jb.set_config(op, ((cat.MAX_M, cfg),))
g = torch.Generator(device="cuda").manual_seed(0)
worst = 0.0
for m in [m for m in (1, 5, 8, 16, 40) if m <= cfg.max_m()]:
    for n, k in ((256, 7168), (2112, 7168), (100, 1032)):
        if m > cfg.max_m((n, k)):  # a narrow configuration's generic body may serve fewer M
            continue
        x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
        w = torch.randn(n, k, generator=g, device="cuda").bfloat16()
        dt = torch.float32 if op == "dsv3_router_gemm" else torch.bfloat16
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dt)
        if op == "dsv3_router_gemm":
            jb.prepare_router((out, x, w), None)(out, x, w)
        else:
            jb.prepare_fused_a((out, x, w.t()), None)(out, x, w.t())
        ref = x.double() @ w.double().t()
        worst = max(worst, ((out.double() - ref).norm() / ref.norm()).item())
torch.cuda.synchronize()
tol = 1e-5 if op == "dsv3_router_gemm" else 5e-3
print(f"max rel err {worst:.2e}")
sys.exit(0 if worst <= tol else 1)
"""


def run(op: str, name: str) -> tuple[str, str, bool, str]:
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, op, name], capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return op, name, False, "timed out (a hang)"
    text = (proc.stdout + proc.stderr).strip().splitlines()
    return op, name, proc.returncode == 0, text[-1] if text else f"exit {proc.returncode}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bad-file")
    args = ap.parse_args()
    from slim_kernel.jit import catalogue as cat

    jobs = [(op, name) for op, variants in cat.VARIANTS.items() for name in variants]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(lambda j: run(*j), jobs))
    bad = []
    for op, name, ok, msg in results:
        print(f"smoke {'OK  ' if ok else 'FAIL'} {op} {name}: {msg}")
        if not ok:
            bad.append(f"{op}:{name}")
    if args.bad_file:
        with open(args.bad_file, "w") as f:
            f.write("".join(b + "\n" for b in bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
