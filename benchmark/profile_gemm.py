"""Hardware counters of our GEMM kernels and the anchors, under Nsight Compute (GPU machine).

    ncu --clock-control none --profile-from-start off --nvtx --print-nvtx-rename kernel --csv \\
        --metrics "$(python3 benchmark/profile_gemm.py --metrics)" python3 benchmark/profile_gemm.py [--sglang DIR] > ncu.csv

Everything is compiled and warmed up first; only the calls between cudaProfilerStart/Stop are
profiled: for each case and M, each implementation runs REPEATS times on distinct cold weight
copies (ncu also flushes the caches between kernels by default). Prints the kernel order to
stderr so the CSV rows can be matched to implementations (``# label`` lines).

``--after plain|pdl`` profiles the decode step's pair instead: a CUDA graph of that producer and the
GEMM (the launch attributes as in the decode-step benchmark), replayed REPEATS times; run ncu with
``--graph-profiling graph`` so each replay is one result, the producer's overlap with the GEMM
included (a PM-sampling pass then shows when the GEMM's reads start against the producer's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchors import Anchors, columns  # noqa: E402

from slim_kernel import models, timing, tune  # noqa: E402

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
DEFAULT_CASES = ["fused_a@1,16", "router:256@1,16"]  # parse_case


def parse_case(text: str) -> tuple[models.Shape, list[int]]:
    """``fused_a[:N,K]@1,8,16`` / ``router:E[,K[,out]]@4,8`` -> (shape, Ms); N,K default to 2112,7168,
    the router's K to 7168 and its output to float32."""
    what, _, ms = text.partition("@")
    kind, sep, spec = what.partition(":")
    if kind == "fused_a":
        return models.parse_fused_a(spec if sep else "2112,7168"), tune.parse_ms(ms or "1")
    if kind == "router" and sep:
        parts = spec.split(",")
        if len(parts) == 1:
            parts.append("7168")
        return models.parse_router(",".join(parts)), tune.parse_ms(ms or "1")
    raise ValueError(f"--case {text!r}: expected fused_a[:N,K]@MS or router:E[,K[,out]]@MS")


def implementations(tp, anchors: Anchors, pdl: bool) -> dict:
    """Every candidate selection can run at point ``tp`` in that launch context, and every anchor column."""
    return {**tune.candidates(tp, pdl), **columns(anchors.for_shape(tp.shape, tp))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang")
    ap.add_argument("--case", action="append", help="fused_a@1,8,16 or router:E[:OUT]@4,8 (repeatable; default: "
                    + " ".join(DEFAULT_CASES) + ")")
    ap.add_argument("--impls", default="", help="comma-separated names (jit:<variant>, flashinfer, torch, "
                                                 "anchor:<name>, producer:<plain|pdl>; default: all)")
    ap.add_argument("--after", choices=("plain", "pdl"), help="profile graphs of that producer + each GEMM "
                                                              "(ncu --graph-profiling graph)")
    ap.add_argument("--metrics", action="store_true", help="print the metric list for ncu and exit")
    args = ap.parse_args()
    if args.metrics:
        print(METRICS)
        return 0
    notes: list[str] = []
    anchors = Anchors(notes, args.sglang)
    gen = torch.Generator(device="cuda").manual_seed(1)
    cases = [parse_case(c) for c in args.case or DEFAULT_CASES]
    anchors.warm_sglang([shape for shape, _ in cases])
    plan = []
    for shape, ms in cases:
        for m in ms:
            tp = tune.Workload(shape, m, gen.device, gen)
            impls = implementations(tp, anchors, args.after != "plain")
            # The producers too (`producer:pdl` = the RMSNorm the decode step runs before the GEMM):
            # their launch resources decide what of ours fits beside them on an SM.
            for k, produce in tp.producers.items():
                impls[f"producer:{k}"] = lambda *_, produce=produce: produce()
            wanted = [n for n in args.impls.split(",") if n] or list(impls)
            for name in wanted:
                if name in impls:
                    calls = tp.calls(impls[name])[:REPEATS]
                    for call in calls:
                        call()  # warm-up: compile, plan, autotune outside the profiled range
                    if args.after and not name.startswith("producer:"):
                        producer = tp.producers[args.after]
                        calls = [graph.replay for graph in (timing.capture([producer, c]) for c in calls)]
                    plan.append((f"{shape.label()} M={m} {name}" + (f" after {args.after}" if args.after else ""),
                                 calls))
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
