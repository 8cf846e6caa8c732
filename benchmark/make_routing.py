"""From decode-step benchmark JSON to the committed routing table and the at-a-glance summary.

    python benchmark/make_routing.py RESULTS.json [RESULTS.json ...] \\
        [--table python/slim_kernel/tables/routing_sm90.json] [--summary benchmark/results/h200/decode_step_summary.json]

RESULTS are ``bench_gemm.py`` JSONs. Several of one flashinfer version merge point by point, a
later file's rows replacing an earlier one's (a narrowed re-run of some points, e.g. ``--ops router
--ms 1-8`` with new kernel variants, over the full run); every row stays one side-by-side run. The table (read by
``slim_kernel/routing.py``) gets, per op, shape, M, flashinfer version and launch context, the µs
of every candidate the registry can run, from the decode-step rows: ``pdl: true`` after the
PDL-aware producer with PDL launches, ``pdl: false`` after the PDL-unaware producer without
(the two cases slim_kernel/pdl.py tells apart under capture); candidates ``jit:<variant>`` (our
kernels, launched as the JIT backend does), ``flashinfer`` (as our flashinfer backend launches
it) and ``torch`` (our torch reference backend). Rows of other flashinfer versions already in the table
are kept, so the 0.7.2.post1 and 0.7.4 runs merge into one file.

The summary has one row per measured decode-step point (both producers): the default path's
choice and time, the best anchor (every non-slim-kernel implementation timed in that run) and
the ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from slim_kernel.jit.catalogue import VARIANTS, variant_serves  # noqa: E402  (torch-free)
from slim_kernel.names import FLASHINFER_FUSED_A_PROGRAMS as FLASHINFER_PROGRAMS  # noqa: E402

SCHEMA = 1
ANCHOR_PREFIXES = ("flashinfer", "sglang:", "torch")  # the columns of benchmark/anchors.py
TIE = 0.02  # within 2%: what one run's repeat-to-repeat spread allows calling a tie
TABLE = Path(__file__).resolve().parents[1] / "python" / "slim_kernel" / "tables" / "routing_sm90.json"


def is_anchor(name: str) -> bool:
    """Implementations a user would otherwise run (every column that is not slim-kernel's)."""
    return name.startswith(ANCHOR_PREFIXES)


def winner(ratio: float, best_anchor: str) -> str:
    return "slim-kernel" if ratio < 1 - TIE else "tie" if ratio <= 1 + TIE else best_anchor


def candidates(op: str, us: dict, pdl: bool, m: int) -> dict:
    """Table candidates of one decode-step row, measured the way the registry would run them
    (JIT configurations no longer in the catalogue, or no longer serving this M, are left out)."""
    out = {}
    for name, value in us.items():
        base, _, flag = name.partition("@")
        if value is None or (flag == "nopdl") == pdl:
            continue
        cfg = VARIANTS[op].get(base.removeprefix("jit:")) if base.startswith("jit:") else None
        if cfg is not None and variant_serves(cfg, op, m):
            out[base] = round(value, 3)
        elif base.startswith("fiprog:") and base.removeprefix("fiprog:") in FLASHINFER_PROGRAMS:
            out["flashinfer:" + base.removeprefix("fiprog:")] = round(value, 3)
    fi = us.get("flashinfer_pdl" if pdl else "flashinfer")
    if fi is not None:
        out["flashinfer"] = round(fi, 3)
    if us.get("ref") is not None:
        out["torch"] = round(us["ref"], 3)
    return out


def _decode_rows(report: dict, producer: str):
    for row in report["rows"]:
        if row.get("pattern") == "decode" and row.get("producer") == producer and row["cache"] == "cold":
            yield row


def table_entries(report: dict) -> list[dict]:
    """Per point, the two launch contexts slim_kernel.pdl tells apart: ``pdl: true`` from the rows
    after the PDL-aware producer (PDL launches; past M=16, where only the plain producer is
    timed, after the plain one), ``pdl: false`` from the rows after the plain producer (launches
    without PDL)."""
    version = report["versions"].get("flashinfer", "not installed")
    after_pdl = {(r["op"], json.dumps(r["shape"], sort_keys=True)): r for r in _decode_rows(report, "pdl")}
    entries = []
    for row in _decode_rows(report, "plain"):
        shape = {k: v for k, v in row["shape"].items() if k != "m"}
        for pdl in (True, False):
            src = after_pdl.get((row["op"], json.dumps(row["shape"], sort_keys=True)), row) if pdl else row
            us = candidates(row["op"], src["us"], pdl, row["shape"]["m"])
            if us:
                entries.append({"op": row["op"], "shape": shape, "m": row["shape"]["m"], "flashinfer": version,
                                "pdl": pdl, "us": us})
    return entries


def _row_key(row: dict) -> tuple:
    return (row["op"], json.dumps(row["shape"], sort_keys=True), row.get("pattern"), row.get("producer"), row["cache"])


def merge_reports(reports: list[dict]) -> list[dict]:
    """One report per flashinfer version: later reports' rows replace earlier ones' at the same point."""
    merged: dict[str, dict] = {}
    for rep in reports:
        version = rep["versions"].get("flashinfer", "not installed")
        if version not in merged:
            merged[version] = {**rep, "rows": list(rep["rows"])}
            continue
        base = merged[version]
        index = {_row_key(r): i for i, r in enumerate(base["rows"])}
        for row in rep["rows"]:
            at = index.get(_row_key(row))
            if at is None:
                base["rows"].append(row)
            else:
                base["rows"][at] = row
        base["command"] = f"{base['command']} ; then {rep['command']}"
    return list(merged.values())


def build_table(reports: list[dict], old: dict | None, generated_by: str) -> dict:
    new = [e for r in reports for e in table_entries(r)]
    versions = {e["flashinfer"] for e in new}
    kept = [e for e in (old or {}).get("entries", []) if e["flashinfer"] not in versions]
    sources = {**(old or {}).get("sources", {}), **{r["versions"].get("flashinfer", "not installed"): r["command"]
                                                    for r in reports}}
    entries = sorted(kept + new, key=lambda e: (e["op"], sorted(e["shape"].items()), e["m"], e["flashinfer"],
                                               not e["pdl"]))
    return {"schema": SCHEMA, "arch": "sm_90", "device": reports[0]["device"] if reports else "",
            "generated_by": generated_by, "sources": sources, "entries": entries}


def summary_rows(report: dict) -> list[dict]:
    version = report["versions"].get("flashinfer", "not installed")
    out = []
    for producer in ("plain", "pdl"):
        for row in _decode_rows(report, producer):
            us = row["us"]
            anchors = {k: v for k, v in us.items() if is_anchor(k) and v is not None}
            ours, choice = us.get("default"), row.get("choice", {}).get("default", "?")
            if ours is None or not anchors:
                continue
            m = row["shape"]["m"]
            cfg = VARIANTS[row["op"]].get(choice.removeprefix("jit:")) if choice.startswith("jit:") else None
            if choice.startswith("jit:") and (cfg is None or not variant_serves(cfg, row["op"], m)):
                # the run's default picked a configuration removed (or narrowed) since: what the table
                # generated from this run picks instead, timed in the same run
                pool = candidates(row["op"], us, producer == "pdl", m)
                choice = min(pool, key=pool.get)
                ours = pool[choice]
            best = min(anchors, key=anchors.get)
            out.append({"op": row["op"], "shape": {k: v for k, v in row["shape"].items() if k != "m"},
                        "m": m, "producer": producer, "flashinfer": version,
                        "backend": choice, "ours_us": round(ours, 3),
                        "best_anchor": best, "best_anchor_us": round(anchors[best], 3),
                        "ratio": round(ours / anchors[best], 3)})
    return out


def merge_summary(path: Path, reports: list[dict]) -> dict:
    rows = [r for rep in reports for r in summary_rows(rep)]
    versions = {r["flashinfer"] for r in rows}
    old = json.loads(path.read_text()).get("rows", []) if path.exists() else []
    rows = [r for r in old if r["flashinfer"] not in versions] + rows
    return {"schema": SCHEMA, "rows": rows}


def dumps_table(table: dict) -> str:
    """The table as JSON with one entry per line (reviewable diffs, small files)."""
    head = {k: v for k, v in table.items() if k != "entries"}
    lines = [json.dumps(e, separators=(",", ":")) for e in table["entries"]]
    return json.dumps(head, indent=1)[:-2] + ',\n "entries": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", help="bench_gemm.py JSON files")
    ap.add_argument("--table", default=str(TABLE), help="routing table to write (rows of other versions are kept)")
    ap.add_argument("--summary", help="decode_step_summary.json to write (rows of other versions are kept)")
    args = ap.parse_args(argv)
    reports = merge_reports([json.loads(Path(p).read_text()) for p in args.results])
    table_path = Path(args.table)
    old = json.loads(table_path.read_text()) if table_path.exists() else None
    cmd = "python benchmark/make_routing.py " + " ".join(args.results)
    table = build_table(reports, old, cmd)
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(dumps_table(table))
    print(f"{len(table['entries'])} routing entries -> {table_path}")
    if args.summary:
        path = Path(args.summary)
        data = merge_summary(path, reports)
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{len(data['rows'])} summary rows -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
