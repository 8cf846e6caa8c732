"""Hardware counters of our GEMM kernels and the anchors, under Nsight Compute (GPU machine).

    ncu --clock-control none --profile-from-start off --nvtx --print-nvtx-rename kernel --csv \\
        --metrics "$(python3 benchmark/profile_gemm.py --metrics)" python3 benchmark/profile_gemm.py [--sglang DIR] > ncu.csv

Everything is compiled and warmed up first; only the calls between cudaProfilerStart/Stop are
profiled: for each case and M, each implementation runs REPEATS times on distinct cold weight
copies (ncu also flushes the caches between kernels by default). Prints the kernel order to
stderr so the CSV rows can be matched to implementations (``# label`` lines).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm as B  # noqa: E402
from anchors import Anchors  # noqa: E402

REPEATS = 2
METRICS = ",".join([
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_bytes.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_membar_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed", "smsp__inst_executed.sum",
    "launch__grid_size", "launch__block_size", "launch__registers_per_thread", "launch__shared_mem_config_size",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "smsp__warps_active.avg.pct_of_peak_sustained_active", "l1tex__t_sector_hit_rate.pct",
    "sm__cycles_active.avg", "gpc__cycles_elapsed.max",
])
DEFAULT_CASES = ["fused_a@1,16", "router:256@1,16"]


def parse_case(text: str) -> tuple[str, int, str, list[int]]:
    """``fused_a@1,8,16`` / ``router:384[:bfloat16]@4,8`` -> (op, N or E, out dtype, Ms)."""
    what, _, ms = text.partition("@")
    parts = what.split(":")
    if parts[0] == "fused_a" and len(parts) == 1:
        return "dsv3_fused_a_gemm", B.FUSED_N, "bfloat16", B.parse_ms(ms or "1")
    if parts[0] == "router" and len(parts) in (2, 3) and parts[1].isdigit():
        out = parts[2] if len(parts) == 3 else "float32"
        if out not in ("float32", "bfloat16"):
            raise ValueError(f"--case {text!r}: out dtype must be float32 or bfloat16")
        return "dsv3_router_gemm", int(parts[1]), out, B.parse_ms(ms or "1")
    raise ValueError(f"--case {text!r}: expected fused_a@MS or router:E[:OUT]@MS")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang")
    ap.add_argument("--case", action="append", help="fused_a@1,8,16 or router:E[:OUT]@4,8 (repeatable; default: "
                    + " ".join(DEFAULT_CASES) + ")")
    ap.add_argument("--impls", default="", help="comma-separated column names (default: all but @nopdl and ref)")
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu and exit")
    args = ap.parse_args()
    if args.metrics:
        print(METRICS)
        return 0
    notes: list[str] = []
    anchors = Anchors(notes, args.sglang)
    gen = torch.Generator(device="cuda").manual_seed(1)
    specs = [parse_case(c) for c in args.case or DEFAULT_CASES]
    cases = [(B.Case(op, n, out, gen), ms) for op, n, out, ms in specs]
    anchors.warm_sglang([(n, getattr(torch, out)) for op, n, out, _ in specs if op == "dsv3_router_gemm"], B.FUSED_N, B.K)
    plan = []
    for case, ms in cases:
        for m in ms:
            x = torch.randn(m, B.K, generator=gen, device="cuda").to(torch.bfloat16)
            out = torch.empty(m, case.n, device="cuda", dtype=case.out_dtype)
            impls = B.ours(case, x, out)
            impls["default"] = B.default(case, x, out)
            impls.update(anchors.router(case.n, case.out_dtype, x, out) if "e" in case.shape
                         else anchors.fused_a(x, out))
            # The producers too (`producer:pdl` = the RMSNorm the decode step runs before the GEMM):
            # their launch resources decide what of ours fits beside them on an SM.
            for k, produce in anchors.producers(x, gen).items():
                impls[f"producer:{k}"] = lambda w, produce=produce: produce
            wanted = [n for n in args.impls.split(",") if n] or [n for n in impls if "@" not in n and n != "ref"]
            for name in wanted:
                if name in impls:
                    calls = [impls[name](w) for w in case.weights[:REPEATS]]
                    for call in calls:
                        call()  # warm-up: compile, plan, autotune outside the profiled range
                    plan.append((f"{case.op} {case.shape} M={m} {name}", calls))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for label, calls in plan:
        print(f"# {label}", file=sys.stderr, flush=True)
        torch.cuda.nvtx.range_push(label)  # `ncu --nvtx --print-nvtx-rename kernel` names the rows by it
        for call in calls:
            call()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.profiler.stop()
    for note in notes:
        print("note:", note, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
