"""Where the decode step's time goes: each kernel's start and end in the producer+GEMM graph (GPU machine).

    python3 benchmark/timeline.py [--sglang DIR] --case fused_a:2624,6144@1,4,8 \\
        --impls default,jit:stream_r32w4p2,anchor:sglang:fused_a --json timeline.json

The graphs are the decode step's (``slim_kernel.timing.DecodeStep``: one producer more, then producer+GEMM
pairs over rotating cold weight copies), replayed under ``torch.profiler``: CUPTI's activity records give
every kernel's start and end on the GPU without touching the kernels (stamps inside them slowed
sglang's kernel by several µs).
Per pair, in µs (medians over every pair of every replay):

* ``early``: the GEMM's start before its producer's end (> 0: launched early under PDL, resident and
  waiting);
* ``tail``: the GEMM's end after its producer's end, the part of the step the GEMM alone holds;
* ``next_early``: the next producer's start before this GEMM's end (> 0: the GEMM triggered it early);
* ``next_past``: the next producer's end after this GEMM's end;
* ``step``: from one producer's end to the next one's, one producer+GEMM step;

and ``net``, the step less the producers-alone graph's step (what the decode-step benchmark calls the
GEMM's time), beside ``decode_us``, that benchmark's own reading of the same graphs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anchors import Anchors  # noqa: E402
from bench_gemm import default_call  # noqa: E402
from profile_gemm import implementations, parse_case  # noqa: E402

from slim_kernel import timing, tune  # noqa: E402

from harness import command_line  # noqa: E402

REPLAYS = 5
FIELDS = ("early", "tail", "next_early", "next_past", "step")


def kernels(graph: torch.cuda.CUDAGraph, replays: int) -> list[tuple[str, float, float]]:
    """(name, start µs, end µs) of every kernel the graph's ``replays`` replays ran, in start order."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    out = [(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
           if e.get("cat") == "kernel" and "dur" in e]
    return sorted(out, key=lambda k: k[1])


def pair_stats(trace: list[tuple[str, float, float]], is_producer) -> dict[str, float]:
    """Medians of FIELDS over the trace's producer+GEMM pairs (a GEMM: every kernel from one producer
    to the next). A producer followed straight by another one (the graph's first) opens no pair; in a
    trace of producers alone those steps are the ``step``."""
    producers = [i for i, k in enumerate(trace) if is_producer(k[0])]
    rows: dict[str, list[float]] = {f: [] for f in FIELDS}
    bare_steps = []
    for a, b in zip(producers, producers[1:]):
        gemm = trace[a + 1:b]
        p_end, nxt = trace[a][2], trace[b]
        if not gemm:
            bare_steps.append(nxt[2] - p_end)
            continue
        g_start, g_end = min(k[1] for k in gemm), max(k[2] for k in gemm)
        for f, v in zip(FIELDS, (p_end - g_start, g_end - p_end, g_end - nxt[1], nxt[2] - g_end, nxt[2] - p_end)):
            rows[f].append(v)
    if not rows["step"]:
        rows["step"] = bare_steps
    return {f: round(statistics.median(v), 3) for f, v in rows.items() if v}


def timeline(tp, producer, impls: dict, replays: int) -> list[dict]:
    """One row per implementation (``None``: not available here) after ``producer`` at point ``tp``."""
    step = timing.DecodeStep(producer, len(tp.weights))
    alone = kernels(step.alone, replays)
    if not alone:
        raise RuntimeError("the profiler recorded no kernel of the graph's replays (CUPTI unavailable?)")
    alone_step = pair_stats(alone, lambda name: True)["step"]
    rows = []
    for name, fn in impls.items():
        if fn is None:
            rows.append({"impl": name, "missing": True})
            continue
        calls = tp.calls(fn)
        pairs = timing.capture([producer] + [f for i in range(step.calls) for f in (producer, calls[i % len(calls)])])
        stats = pair_stats(kernels(pairs, replays), lambda kernel: kernel == alone[0][0])
        del pairs
        rows.append({"impl": name, **stats, "net": round(stats["step"] - alone_step, 3),
                     "decode_us": round(step.time(calls), 3), "producer_step": alone_step})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sglang", help="a standalone copy of sglang's kernels (else an installed sglang)")
    ap.add_argument("--case", action="append", required=True, help="fused_a[:N,K]@MS or router:E[,K[,out]]@MS")
    ap.add_argument("--impls", default="default", help="comma-separated: default, jit:<variant>, flashinfer, "
                                                       "torch, anchor:<name>")
    ap.add_argument("--after", default="plain,pdl", help="producers (default: plain,pdl)")
    ap.add_argument("--replays", type=int, default=REPLAYS)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    notes: list[str] = []
    anchors = Anchors(notes, args.sglang)
    gen = torch.Generator(device="cuda").manual_seed(1)
    cases = [parse_case(c) for c in args.case]
    anchors.warm_sglang([shape for shape, _ in cases])
    names = [n for n in args.impls.split(",") if n]
    rows, missing = [], set()
    for shape, ms in cases:
        for m in ms:
            tp = tune.Workload(shape, m, gen.device, gen)
            for after in args.after.split(","):
                if after not in tp.producers:
                    missing.add(after)
                    continue
                producer = tp.producers[after]
                impls = {**implementations(tp, anchors, after == "pdl"), "default": default_call(tp)}
                for row in timeline(tp, producer, {n: impls.get(n) for n in names}, args.replays):
                    row.update(shape=shape.label(), m=m, after=after)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    notes += [f"no {after} producer (flashinfer not installed?)" for after in sorted(missing)]
    if args.json:
        head = {"command": command_line(), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                "versions": anchors.versions()}
        Path(args.json).write_text(json.dumps({**head, "rows": rows, "notes": notes}, indent=1) + "\n")
    head = ("shape", "m", "after", "impl", *FIELDS, "net", "decode_us")
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(str(r.get(h, "-")) for h in head))
    for note in notes:
        print("note:", note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
