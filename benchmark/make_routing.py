"""From decode-step benchmark JSON to the shipped routing table and the at-a-glance summary.

    python benchmark/make_routing.py [--plots] [--standing]  # regenerate both (and the plots) from the committed runs
    python benchmark/make_routing.py RESULTS.json [...] [--table PATH] [--summary PATH]

RESULTS are ``bench_gemm.py`` JSONs (default: ``RESULTS`` below, the committed runs of each measured GPU
by its folder under ``benchmark/results/``: the H200's and the H100's, each a measurement group per
flashinfer version of the one shipped table), each read from ``NAME`` or, where that is absent, its gzip-compressed copy ``NAME.gz``
(how the committed runs are stored: ``gzip -9n NAME``). Several of one flashinfer version merge point by point, a later file's rows
replacing an earlier one's; every row stays one side-by-side run. The table (read by
``slim_kernel/routing.py``) gets, per op, shape, M, flashinfer version and launch context, the
µs of every candidate the registry can run, exactly as ``slim-kernel tune`` measures them
(``slim_kernel.tune.measure``): ``pdl: true`` from the rows after the PDL-aware producer (PDL
launches), ``pdl: false`` from the rows after the plain one (without). Rows of shapes a run left
unnamed (``--unnamed-*``: checks of the estimate, which ran their ``default``) join the table here
like every other measurement; only ``bench_gemm.py``, while it measures them, keeps them out. Rows
of other flashinfer versions already in the table are kept, so the 0.7.2.post1 and 0.7.4 runs merge
into one file.

The summary (one per GPU folder) has one row per measured decode-step point (both producers): the default
path's choice and time, the best anchor (every ``anchor:*`` column of the run) and the ratio, the DRAM
floor (the weight bytes over a bandwidth the same run measured: ``floor_us``, ``floor_source`` ``copy`` for a
plain device copy's, ``read`` for the large read's in runs made before they measured the copy) and the
default's time over it (``floor_ratio``), and after a tune of an unnamed shape the tuned default's ratio.
A folder whose runs' default read another GPU's table (``REPLAYED``: the H100 runs, made while the table
held the H200 alone) adds to each row what this table picks for that GPU and what that candidate measured
in the same run over the best anchor (``table_backend``, ``table_us``, ``table_ratio``); ``--standing``
prints every GPU's standing with this table that way.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))
from slim_kernel import backend, routing  # noqa: E402

SCHEMA = 1  # of the summary (the table is routing.SCHEMA)
TIE = 0.02  # within 2%: what one run's repeat-to-repeat spread allows calling a tie
ARCH = "sm_90"  # the arch of the committed runs (a run that names its own arch keeps it)
TABLE = ROOT / "python" / "slim_kernel" / "tables" / "routing_sm90.json"
RESULTS_ROOT = ROOT / "benchmark" / "results"
# the runs the shipped table comes from, per GPU folder; a device's and version's later files replace its
# earlier ones point by point; the first folder's device is the arch's reference (``routing.table``)
RESULTS = {"h200": ["bench_gemm_fi074.json", "bench_gemm_fi074_routers_large.json", "bench_gemm_fi074_unnamed.json",
           "bench_gemm_fi074_heldout.json", "bench_gemm_fi074_fresh_fused_a.json",
           "bench_gemm_fi074_fresh_routers.json", "bench_gemm_fi074_fresh3.json",
           "bench_gemm_fi074_narrow_fused_a.json", "bench_gemm_fi074_heldout2.json",
           "bench_gemm_fi074_heldout3.json", "bench_gemm_fi074_heldout4.json",
           "bench_gemm_fi074_heldout5.json", "bench_gemm_fi074_stream_trigger.json",
           "bench_gemm_fi074_heldout6.json", "bench_gemm_fi074_m1_16_routers.json",
           "bench_gemm_fi074_m1_16_fused_a.json", "bench_gemm_fi074_routers_sliced.json",
           "bench_gemm_fi074_fused_a_large.json",
           "bench_gemm_fi072.json", "bench_gemm_fi072_routers_large.json", "bench_gemm_fi072_m1_16.json",
           "bench_gemm_fi072_narrow_fused_a.json", "bench_gemm_fi072_heldout4.json",
           "bench_gemm_fi072_stream_trigger.json"],
           "h100": ["bench_gemm_fi074_fused_a.json", "bench_gemm_fi074_routers.json", "bench_gemm_fi072.json",
                    "bench_gemm_fi074_m1_16_fused_a.json", "bench_gemm_fi074_m1_16_routers.json",
                    "bench_gemm_fi072_m1_16.json"]}
REPLAYED = {"h100"}  # folders whose runs' default read another GPU's table (see the module docstring)
SUMMARY_NAME = "decode_step_summary.json"
RESULTS_DIR = RESULTS_ROOT / "h200"
SUMMARY = RESULTS_DIR / SUMMARY_NAME  # the reference GPU's summary


def read_json(path) -> dict:
    """A results JSON: ``path``, or ``path.gz`` (gzip) where ``path`` is absent."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    if not path.exists() and packed.exists():
        path = packed
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if path.name.endswith(".gz") else data)


def is_anchor(name: str) -> bool:
    return name.startswith("anchor:")


def winner(ratio: float, best_anchor: str) -> str:
    return "slim-kernel" if ratio < 1 - TIE else "tie" if ratio <= 1 + TIE else best_anchor


def candidates(op: str, us: dict, shape: dict) -> dict:
    """Table candidates of one decode-step row (``shape``: its N or E, K and M): our columns, each a
    candidate its backend still offers at this M and shape (``Backend.offers``: a configuration no longer
    in the catalogue, or no longer serving there, and an unknown program are left out)."""
    m, nk = shape["m"], (shape.get("e", shape.get("n")), shape["k"])
    out = {}
    for name, value in us.items():
        if value is None or is_anchor(name) or name.startswith("default"):
            continue
        unit, variant = backend.split(name)
        if unit in backend.NAMES and backend.get(unit).offers(op, variant, m, nk):
            variant = backend.get(unit).canonical(op, variant)  # a run made before a rename: today's name
            out[f"{unit}:{variant}" if variant else unit] = round(value, 3)
    return out


def _decode_rows(report: dict):
    for row in report["rows"]:
        if row.get("pattern") == "decode" and row["cache"] == "cold":
            yield row


def group_header(report: dict) -> dict:
    """The measurement group a run's rows form: its device (name, arch, SM count, read bandwidth) and the
    version of each versioned backend's library."""
    header = {"device": report.get("device", ""), "arch": report.get("arch", ARCH), "sms": report.get("sms") or None}
    if report.get("hbm_read_GBps"):
        header["memory_gbps"] = round(report["hbm_read_GBps"])
    header["versions"] = {name: report.get("versions", {}).get(name, routing.NOT_INSTALLED) for name in backend.DISTS}
    return header


def table_entries(report: dict, unnamed: bool = True) -> list[dict]:
    """The table entries of a run's rows (``unnamed`` False: not those of its ``--unnamed-*`` shapes)."""
    entries = []
    for row in _decode_rows(report):
        us = candidates(row["op"], row["us"], row["shape"])
        if us and (unnamed or not row.get("unnamed")):
            entries.append({"op": row["op"], "shape": {k: v for k, v in row["shape"].items() if k != "m"},
                            "m": row["shape"]["m"], "pdl": row["producer"] == "pdl", "us": us})
    return entries


def _row_key(row: dict) -> tuple:
    return (row["op"], json.dumps(row["shape"], sort_keys=True), row.get("pattern"), row.get("producer"), row["cache"])


def merge_reports(reports: list[dict]) -> list[dict]:
    """One report per device and version set (a measurement group): later reports' rows replace earlier
    ones' at the same point."""
    merged: dict[tuple, dict] = {}
    for rep in reports:
        key = _group_key(group_header(rep))
        if key not in merged:
            merged[key] = {**rep, "rows": list(rep["rows"])}
            continue
        base = merged[key]
        index = {_row_key(r): i for i, r in enumerate(base["rows"])}
        for row in rep["rows"]:
            at = index.get(_row_key(row))
            if at is None:
                base["rows"].append(row)
            else:
                base["rows"][at] = row
        base["command"] = f"{base['command']} ; then {rep['command']}"
    return list(merged.values())


def _entry_key(e: dict) -> tuple:
    return e["op"], json.dumps(e["shape"], sort_keys=True), e["m"], e["pdl"]


def _group_key(group: dict) -> tuple:
    return group["device"], group["sms"], json.dumps(group["versions"], sort_keys=True)


def build_table(reports: list[dict], old: dict | None, generated_by: str, per_point: bool = False,
                unnamed: bool = True) -> dict:
    """The table (``routing.SCHEMA``) of ``reports``' rows (``unnamed`` False: their named shapes' only), one
    measurement group per device and version set; of ``old`` (v2 or v1), the groups of other devices and
    version sets, or with ``per_point`` every entry at a point the reports did not measure (a run of a few
    shapes refining a table)."""
    merged: dict[tuple, dict] = {}
    for group in routing.groups(old) if old else []:
        merged[_group_key(group)] = {**{k: v for k, v in group.items() if k != "entries"},
                                     "entries": {_entry_key(e): {k: v for k, v in e.items() if k in routing.ENTRY_KEYS}
                                                 for e in group["entries"]}}
    fresh: set[tuple] = set()
    for report in reports:
        header = group_header(report)
        key = _group_key(header)
        if key not in fresh and (key not in merged or not per_point):
            merged[key] = {**header, "entries": {}}
        fresh.add(key)
        group = merged[key]
        group["command"] = report["command"]
        group["entries"].update((_entry_key(e), e) for e in table_entries(report, unnamed))
    # devices in the order they came (``old``'s first: its first device stays the arch's reference), versions sorted
    rank: dict[tuple, int] = {}
    for g in merged.values():
        rank.setdefault((g["device"], g["sms"]), len(rank))
    order = lambda g: (rank[(g["device"], g["sms"])], [(n, routing.version_key(v)) for n, v in sorted(g["versions"].items())])  # noqa: E731
    groups = [{**g, "entries": sorted(g["entries"].values(), key=lambda e: (e["op"], sorted(e["shape"].items()),
                                                                           e["m"], not e["pdl"]))}
              for g in sorted(merged.values(), key=order)]
    return {"schema": routing.SCHEMA, "generated_by": generated_by, "measurements": groups}


def table_pick(row: dict, versions: tuple, tab: routing.Table | None) -> tuple[str, float] | None:
    """What ``tab`` (a device's group of the shipped table) picks at a decode-step row measured with
    ``versions`` and what that candidate measured in the row: the first of its ranking the row timed, or None
    where it has no point."""
    dec = tab.lookup(row["op"], {k: v for k, v in row["shape"].items() if k != "m"}, row["shape"]["m"], versions,
                     row["producer"] == "pdl") if tab is not None else None
    timed = candidates(row["op"], row["us"], row["shape"])  # by today's names, as the table has them
    return next(((c, timed[c]) for c, _ in dec.point.us if c in timed), None) if dec else None


def floor(row: dict) -> tuple[float, str] | None:
    """A decode-step row's DRAM floor in µs (its weight bytes over a bandwidth its run measured) and which
    bandwidth: a plain device copy's (``copy``), or, in runs made before they measured one, the large
    read's (``read``); None for a row that carries neither."""
    if row.get("dram_floor_us"):
        return row["dram_floor_us"], "copy"
    if row.get("hbm_floor_us"):
        return row["hbm_floor_us"], "read"
    return None


def summary_rows(report: dict, tab: routing.Table | None = None) -> list[dict]:
    """The summary rows of a run; with ``tab`` (the table's group of the run's device) each also says what
    that table picks there and what it measured in the run (``table_*``)."""
    version = report["versions"].get("flashinfer", "not installed")
    out = []
    for row in _decode_rows(report):
        us = row["us"]
        anchors = {k.removeprefix("anchor:"): v for k, v in us.items() if is_anchor(k) and v is not None}
        ours = us.get("default")
        if ours is None or not anchors:
            continue
        best = min(anchors, key=anchors.get)
        entry = {"op": row["op"], "shape": {k: v for k, v in row["shape"].items() if k != "m"},
                 "m": row["shape"]["m"], "producer": row["producer"], "flashinfer": version,
                 "backend": row.get("choice", {}).get("default", "?"), "ours_us": round(ours, 3),
                 "best_anchor": best, "best_anchor_us": round(anchors[best], 3),
                 "ratio": round(ours / anchors[best], 3)}
        limit = floor(row)
        if limit is not None:
            entry.update(floor_us=round(limit[0], 3), floor_source=limit[1], floor_ratio=round(ours / limit[0], 3))
        if row.get("unnamed"):
            entry["unnamed"] = True
            if us.get("default_tuned") is not None:
                entry["tuned_us"] = round(us["default_tuned"], 3)
                entry["tuned_ratio"] = round(us["default_tuned"] / anchors[best], 3)
        pick = table_pick(row, tuple(sorted(group_header(report)["versions"].items())), tab)
        if pick is not None:
            entry.update(table_backend=pick[0], table_us=round(pick[1], 3), table_ratio=round(pick[1] / anchors[best], 3))
        out.append(entry)
    return out


def merge_summary(path: Path, reports: list[dict]) -> dict:
    rows = [r for rep in reports for r in summary_rows(rep)]
    versions = {r["flashinfer"] for r in rows}
    old = json.loads(path.read_text()).get("rows", []) if path.exists() else []
    rows = [r for r in old if r["flashinfer"] not in versions] + rows
    return {"schema": SCHEMA, "rows": rows}


HEADLINE_MS = (1, 4, 8, 16, 32, 64)


def _cell(r: dict) -> str:
    floor_part = f"; floor {r['floor_us']:.2f} ({r['floor_ratio']:.2f}x)" if "floor_us" in r else ""
    return f"{r['ours_us']:.2f} / {r['best_anchor_us']:.2f} ({r['ratio']:.2f}x){floor_part}"


def summary_markdown(rows: list[dict], producer: str = "plain") -> str:
    """One line per flashinfer version and shape: the default's µs / the best anchor's (ratio) and the DRAM
    floor (the default over it) at HEADLINE_MS, how many points of all its M win, tie and lose, and which
    bandwidth the floor divides by (the results README's tables)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["producer"] == producer:
            groups.setdefault((r["flashinfer"], r["op"], json.dumps(r["shape"]), bool(r.get("unnamed"))), []).append(r)
    head = "| flashinfer | shape | " + " | ".join(f"M={m}" for m in HEADLINE_MS) + " | win / tie / loss | floor from |"
    lines = [head, "|" + " --- |" * (len(HEADLINE_MS) + 4)]
    for (version, op, shape, unnamed), rs in sorted(groups.items()):
        by_m = {r["m"]: r for r in rs}
        cells = [_cell(by_m[m]) if m in by_m else "-" for m in HEADLINE_MS]
        sources = " + ".join(sorted({r["floor_source"] for r in rs if "floor_source" in r})) or "-"
        verdicts = [winner(r["ratio"], "anchor") for r in rs]
        routed = "priority order" if any(r["backend"].endswith("(priority)") for r in rs) else "estimate"
        label = op.removeprefix("dsv3_").removesuffix("_gemm") + " " + " ".join(
            f"{k}={v}" for k, v in json.loads(shape).items()) + (f" (unnamed: {routed})" if unnamed else "")
        lines.append(f"| {version} | {label} | " + " | ".join(cells) + f" | {verdicts.count('slim-kernel')} / "
                     f"{verdicts.count('tie')} / {verdicts.count('anchor')} | {sources} |")
    return "\n".join(lines)


def dumps_table(table: dict, key: str = "entries") -> str:
    """A table (or the summary: ``key="rows"``) as JSON with one entry per line (reviewable diffs, small
    files); a v2 table's measurement groups each as their header, then their entries one per line."""
    head = {k: v for k, v in table.items() if k not in (key, "measurements")}
    if "measurements" in table:
        parts = []
        for group in table["measurements"]:
            inner = json.dumps({k: v for k, v in group.items() if k != "entries"}, separators=(", ", ": "))
            lines = [json.dumps(e, separators=(",", ":")) for e in group["entries"]]
            parts.append(f"  {inner[:-1]}, \"entries\": [\n   " + ",\n   ".join(lines) + "\n  ]}")
        return json.dumps(head, indent=1)[:-2] + ',\n "measurements": [\n' + ",\n".join(parts) + "\n ]\n}\n"
    lines = [json.dumps(e, separators=(",", ":")) for e in table[key]]
    return json.dumps(head, indent=1)[:-2] + f',\n "{key}": [\n  ' + ",\n  ".join(lines) + "\n ]\n}\n"


def standing(reports: list[dict], tables: list[routing.Table]) -> list[str]:
    """Each run's standing with the table: per device, flashinfer version, op and producer, where the
    table's pick for that device (``table_pick``) measured in the same run over the best anchor wins, ties
    and loses, the worst ratio, and the targets (routers <= 0.95x at M 1-16, fused-A <= 1.00x)."""
    lines = []
    for rep in reports:
        header = group_header(rep)
        tab = next((t for t in tables if (t.device, t.sms) == (header["device"], header["sms"])), None)
        cells: dict[tuple, list[tuple[int, float]]] = {}
        for r in summary_rows(rep, tab):
            if "table_ratio" in r:
                cells.setdefault((r["op"], r["producer"]), []).append((r["m"], r["table_ratio"]))
        for (op, producer), got in sorted(cells.items()):
            ratios = [x for _, x in got]
            verdicts = [winner(x, "anchor") for x in ratios]
            low = [x for m, x in got if m <= 16]
            bound = 0.95 if op == "dsv3_router_gemm" else 1.00
            lines.append(f"{header['device']} flashinfer {header['versions'].get('flashinfer')} {op} after the "
                         f"{producer} producer: {verdicts.count('slim-kernel')} / {verdicts.count('tie')} / "
                         f"{verdicts.count('anchor')} (win / tie / loss), worst {max(ratios):.3f}x; <= {bound:.2f}x "
                         f"at {sum(x <= bound for x in low)} of {len(low)} points of M 1-16, "
                         f"{sum(x <= bound for x in ratios)} of {len(ratios)} in all")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="*", help="bench_gemm.py JSON files (default: RESULTS, each GPU folder's runs "
                                               f"under {RESULTS_ROOT.relative_to(ROOT)})")
    ap.add_argument("--table", default=str(TABLE), help="routing table to write")
    ap.add_argument("--summary", help="with RESULTS: decode_step_summary.json to merge their rows into; with --markdown: "
                                      f"the summary to print (default: {SUMMARY.relative_to(ROOT)})")
    ap.add_argument("--summaries", default=str(RESULTS_ROOT), help="with no RESULTS: where each GPU folder's "
                                                                  f"{SUMMARY_NAME} goes (default: beside its runs)")
    ap.add_argument("--plots", action="store_true", help="also draw each flashinfer version's merged runs into the "
                                                          "PNG named after its first RESULTS file (bench_gemm.py's plot)")
    ap.add_argument("--standing", action="store_true", help="also print each run's standing with the written table "
                                                             "(its pick's measured time over the best anchor)")
    ap.add_argument("--markdown", choices=("plain", "pdl"), help="print the summary as a markdown table of that "
                                                                  "producer's rows instead (nothing is written)")
    args = ap.parse_args(argv)
    if args.markdown:
        summary = Path(args.summary) if args.summary else SUMMARY
        print(summary_markdown(json.loads(summary.read_text())["rows"], args.markdown))
        return 0
    committed = not args.results
    folders = {gpu: [RESULTS_ROOT / gpu / r for r in runs] for gpu, runs in RESULTS.items()} if committed else {}
    paths = [p for runs in folders.values() for p in runs] if committed else [Path(p) for p in args.results]
    reports = merge_reports([read_json(p) for p in paths])
    table_path = Path(args.table)
    # From the committed runs the table is rebuilt from them alone; given runs merge into the table there.
    old = None if committed or not table_path.exists() else json.loads(table_path.read_text())
    names = [str(p.resolve().relative_to(ROOT)) if p.resolve().is_relative_to(ROOT) else p.name for p in paths]
    table = build_table(reports, old, "python benchmark/make_routing.py " + " ".join(names))
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(dumps_table(table))
    print(f"{sum(len(g['entries']) for g in table['measurements'])} routing entries -> {table_path}")
    tables = routing.parse(table, str(table_path))
    if committed:
        for gpu, runs in folders.items():
            mine = merge_reports([read_json(p) for p in runs])
            replay = (lambda rep: next((t for t in tables if t.device == rep["device"]), None)) if gpu in REPLAYED \
                else (lambda rep: None)
            data = {"schema": SCHEMA, "rows": [r for rep in mine for r in summary_rows(rep, replay(rep))]}
            summary = Path(args.summaries) / gpu / SUMMARY_NAME
            summary.parent.mkdir(parents=True, exist_ok=True)
            summary.write_text(dumps_table(data, "rows"))
            print(f"{len(data['rows'])} summary rows -> {summary}")
    elif args.summary:
        summary = Path(args.summary)
        data = merge_summary(summary, reports)
        summary.write_text(dumps_table(data, "rows"))
        print(f"{len(data['rows'])} summary rows -> {summary}")
    if args.standing:
        print("\n".join(standing(reports, tables)))
    if args.plots:
        from bench_gemm import replot  # torch and matplotlib: only here

        firsts = {}
        for p in paths:
            firsts.setdefault(_group_key(group_header(read_json(p))), p)
        for rep in reports:
            png = firsts[_group_key(group_header(rep))].with_suffix(".png")
            replot(rep, png)
            print(f"plot of {len(rep['rows'])} rows -> {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
