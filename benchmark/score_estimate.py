"""How good is the estimate for shapes no table measured? Scored on measured decode-step rows.

    python3 benchmark/score_estimate.py BENCH.json [BENCH.json ...] TABLE.json [--producer plain|pdl]
        [--flashinfer 0.7.4] [--list]

BENCH is a ``bench_gemm.py`` JSON whose rows time every candidate (the committed
``benchmark/results/h200/bench_gemm_*.json.gz``, or an older run such as
``git show 94c8d22:benchmark/results/h200/bench_gemm_fi074.json``); several merge as ``make_routing.py``
merges them, and the ``--flashinfer`` version's rows are scored. TABLE is a routing table
(``python/slim_kernel/tables/routing_sm90.json`` of the same commit). Two scores, each the pick's own
measured time over the best anchor's (points above 1.10x, the worst) and over our best candidate's
(geometric mean regret):
  * unnamed: the rows marked ``unnamed`` (shapes the table lacks), estimated from the whole table;
  * leave-one-shape-out: every shape of BENCH, estimated from the table without that shape;
  * another GPU's table (``--learn DEVICE``, a device other than BENCH's): every row estimated from that
    device's measurements alone, placed on BENCH's GPU (what a GPU no group names gets; e.g. the H100 runs
    scored from the H200's measurements).
No GPU (a CPU torch: the backends that give the estimate its grids import it). Where the installed flashinfer is the version the rows were
measured with, the estimate places flashinfer's fused-A call as the program that release runs, as selection does
(``backend.Geometry.installed``: imports torch and flashinfer); otherwise that call is scored as opaque, and the
first line says which.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from make_routing import candidates, merge_reports, read_json  # noqa: E402

from slim_kernel import backend, estimate, routing  # noqa: E402


def _shape(row: dict) -> dict:
    return {k: v for k, v in row["shape"].items() if k != "m"}


def _score(rows: list[dict], tables_for, device, flashinfer: str, listing: bool) -> tuple[int, float, float]:
    over, worst, log_regret = 0, 0.0, 0.0
    readable = _programs_readable(flashinfer)
    geometry = {op: backend.Geometry.installed(op, device.arch) if readable else backend.Geometry()
                for op in {r["op"] for r in rows}}
    for r in rows:
        d = estimate.estimate(r["op"], _shape(r), r["shape"]["m"], r["producer"] == "pdl", device, tables_for(r),
                              (("flashinfer", flashinfer),), geometry[r["op"]])
        if d is None:  # nothing to estimate from: selection runs the priority order, as the run's default did
            pick, us = "priority order", r["us"]["default"]
        else:  # the first candidate of the ranking that runs at this shape (selection skips the others),
            timed = candidates(r["op"], r["us"], r["shape"])  # the row's columns and the ranking by today's names
            pick, us = next((c, timed[c]) for c in (backend.canonical(r["op"], cand) for cand, _ in d.point.us)
                            if c in timed)
        anchor = min(v for k, v in r["us"].items() if k.startswith("anchor:"))
        ours = min(v for k, v in r["us"].items() if not k.startswith(("anchor:", "default")))
        over += us / anchor > 1.10
        if listing and us / anchor > 1.10:
            print(f"  {r['op']} {_shape(r)} M={r['shape']['m']}: {pick} {us / anchor:.2f}x")
        worst = max(worst, us / anchor)
        log_regret += math.log(us / ours)
    return over, worst, math.exp(log_regret / len(rows))


def _programs_readable(flashinfer: str) -> bool:
    """Whether the installed flashinfer is the measured one (its fused-A programs then place its call)."""
    return dict(routing.installed_versions()).get("flashinfer") == flashinfer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", nargs="+", help="bench_gemm.py JSON (or .json.gz); several merge point by point")
    ap.add_argument("table")
    ap.add_argument("--producer", choices=("plain", "pdl"), default="plain")
    ap.add_argument("--flashinfer", default="0.7.4", help="the version the rows were measured with")
    ap.add_argument("--list", action="store_true", help="also print every point over 1.10x")
    ap.add_argument("--learn", metavar="DEVICE", help="learn from this device's measurements of TABLE (default: its "
                                                      "first device's); another device than BENCH's scores the "
                                                      "estimate for a GPU no group names")
    args = ap.parse_args()
    reports = merge_reports([read_json(p) for p in args.bench])
    matching = [r for r in reports if r.get("versions", {}).get("flashinfer") == args.flashinfer]
    if len(reports) > 1 and not matching:
        ap.error(f"no BENCH file was measured with flashinfer {args.flashinfer}")
    bench = (matching or reports)[0]
    data = json.loads(Path(args.table).read_text())
    found = routing.parse(data, args.table)
    whole = [next((t for t in found if t.device == args.learn), None) if args.learn else found[0]]
    if whole[0] is None:
        ap.error(f"{args.table} has no measurements of {args.learn!r} (it has {', '.join(t.device for t in found)})")
    name = bench.get("device", "NVIDIA H200")
    device = routing.Device(name, int(bench.get("sms", 132)), whole[0].arch,
                            round(bench["hbm_read_GBps"]) if bench.get("hbm_read_GBps") else None)
    rows = [r for r in bench["rows"] if r["producer"] == args.producer]
    without: dict[tuple, list] = {}

    def loso(r: dict) -> list:
        key = (r["op"], tuple(sorted(_shape(r).items())))
        if key not in without:
            without[key] = [whole[0].subset(lambda p: (p.op, p.shape) != key)]
        return without[key]

    how = (f"read from the installed {args.flashinfer}" if _programs_readable(args.flashinfer)
           else f"not read (flashinfer {args.flashinfer} is not installed): its call is opaque")
    lines = [f"flashinfer's fused-A programs: {how}"]
    if whole[0].device != name:
        lines.append(f"learning from {whole[0].device}'s measurements alone, predicting {name}")
    scores = [("unnamed", [r for r in rows if r.get("unnamed")], lambda r: whole)]
    if whole[0].device != name:  # every BENCH row, its shape measured on the other GPU (shipped_for's rule)
        scores.append(("another GPU's table", rows, lambda r: whole))
    for label, subset, tables_for in scores + [("leave-one-shape-out", rows, loso)]:
        if not subset:
            lines.append(f"{label}: no rows")
            continue
        over, worst, regret = _score(subset, tables_for, device, args.flashinfer, args.list)
        lines.append(f"{label} ({args.producer}): {over} of {len(subset)} points > 1.10x the best anchor, worst "
                     f"{worst:.2f}x; mean regret vs our best {regret:.3f}")
    print("\n".join(lines))  # one write: `| head -1` does not break the pipe mid-way
    return 0


if __name__ == "__main__":
    sys.exit(main())
