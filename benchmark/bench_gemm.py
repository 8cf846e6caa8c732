"""Decode GEMM benchmark: dsv3_router_gemm and dsv3_fused_a_gemm against every anchor, measured the way models run.

  python3 benchmark/bench_gemm.py --json OUT.json [--png OUT.png] [--sglang DIR] [--models all|NAME,...]
         [--router E,K,out ...] [--fused-a N,K ...] [--unnamed-router E,K,out ...] [--unnamed-fused-a N,K ...]
         [--ms 1-16] [--large-ms LIST] [--unnamed-ms LIST] [--table PATH] [--summary PATH] [--quick] [--dry-run] [--replot]

Per shape and M, after each producer (``plain``: a PDL-unaware kernel, candidates launched
without PDL; ``pdl``: flashinfer's ``rmsnorm(enable_pdl=True)``, candidates with PDL), in the
decode-step pattern of ``slim_kernel/timing.py``:

* our candidates exactly as ``slim-kernel tune`` measures them (``slim_kernel.tune.measure``:
  every JIT configuration, our flashinfer backend and its programs, our torch backend): these
  columns are what the routing table is made of (``make_routing.py``), so the shipped table is
  what ``tune`` writes on this GPU;
* the anchors (``anchor:*``, benchmark/anchors.py): flashinfer as installed with and without PDL,
  sglang's JIT kernels (an installed ``sglang`` or ``--sglang DIR``), torch;
* ``default``: the public op with nothing pinned, after the table regenerated from this run's
  candidates was installed.

The anchors and the default are read as tune reads our candidates (a reading below the DRAM floor
taken again; the fastest two anchors, and the default, the median of three readings), so no ratio
sets a confirmed time against one lucky reading.

Shapes: every model of slim_kernel/models.py (``--models``), or the ``--router``/``--fused-a``
ones; M 1..16 and the large-M list (past flashinfer's router and sglang's windows). The
``--unnamed-*`` shapes are left out of the table: their ``default`` runs on the estimate, then
``tune`` measures them and ``default_tuned`` is the default path after it. Prints one table per
producer last: the default's choice, the best anchor and the ratio, the DRAM floor (the weights over a
plain device copy's bandwidth, measured in the same run) and the default over it.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_routing  # noqa: E402
from anchors import Anchors, columns  # noqa: E402

import harness as H  # noqa: E402


def shapes_from_args(args) -> tuple[list, list]:
    from slim_kernel import models

    named = []
    if args.models:
        names = list(models.MODELS) if args.models == "all" else args.models.split(",")
        named = [s for n in names for s in models.model_shapes(n)]
    named += [models.parse_router(t) for t in args.router] + [models.parse_fused_a(t) for t in args.fused_a]
    unnamed = [models.parse_router(t) for t in args.unnamed_router] + \
              [models.parse_fused_a(t) for t in args.unnamed_fused_a]
    named = list(dict.fromkeys(named))
    unnamed = [s for s in dict.fromkeys(unnamed) if s not in named]  # a shape named too is measured as named
    return (named[:1] if args.quick else named), unnamed


def measure_point(report, anchors: Anchors, shape, m: int, gen, unnamed: bool, skip: frozenset = frozenset()):
    """The decode-step rows of one (shape, M); returns what phase 2 re-times."""
    from slim_kernel import tune
    from slim_kernel.timing import DecodeStep

    tp = tune.Workload(shape, m, gen.device, gen)
    anchor_impls = {n: f for n, f in anchors.for_shape(shape, tp).items() if (shape, n) not in FAILED}
    anchor_impls = {n: f for n, f in anchor_impls.items() if check(report, tp, n, f)}
    rows = []
    for producer in ("pdl", "plain"):
        if producer not in tp.producers:
            continue
        row = report.add(H.Row(shape.op, {**shape.key(), "m": m}, "cold", bytes_read=shape.n * shape.k * 2,
                               pattern="decode", producer=producer, unnamed=unnamed))
        step = DecodeStep(tp.producers[producer], len(tp.weights))
        row.us.update(tune.measure(tp, producer == "pdl", report.notes, step, skip))
        row.us.update(tune.read_confirmed(tp, step, producer == "pdl", columns(anchor_impls), report.notes))
        rows.append(row)
    return tp, rows


FAILED: set = set()  # (shape, anchor) that could not run: not tried again at the next M


def skipped_variants(path: str | None) -> dict[str, frozenset]:
    """``{op: {"jit:<name>", ...}}`` from a file of ``op:name`` lines (None or empty: nothing skipped)."""
    skip: dict[str, set] = {}
    for line in Path(path).read_text().split() if path else ():
        op, sep, name = line.partition(":")
        if not sep or not name:
            raise SystemExit(f"--skip-variants {path}: bad line {line!r} (want op:name)")
        skip.setdefault(op, set()).add(f"jit:{name}")
    return {op: frozenset(names) for op, names in skip.items()}


def check(report, tp, name: str, fn) -> bool:
    """An anchor against float64 (poisoned output); one that fails or cannot run is noted, not timed."""
    try:
        err = tp.error(fn)
    except Exception as exc:  # noqa: BLE001 - an anchor that cannot run this shape
        FAILED.add((tp.shape, name))
        report.notes.append(f"{tp.shape.label()} M={tp.m} anchor {name} failed (not tried at other M): "
                            f"{type(exc).__name__}: {str(exc)[:300]}")
        return False
    if not err <= tp.tolerance():
        report.notes.append(f"WRONG RESULT {tp.shape.label()} M={tp.m} anchor {name}: rel err {err:.3g}; not timed")
        return False
    return True


def default_call(tp):
    import slim_kernel as sk

    x, out = tp.x, tp.out
    if tp.shape.op == "dsv3_router_gemm":
        return lambda out_, x_, w: sk.dsv3_router_gemm(x, w, tp.out_dtype, output=out)
    return lambda out_, x_, w: sk.dsv3_fused_a_gemm(x, w, output=out)


def default_choice(tp, pdl: bool) -> str:
    """What the default path runs in a launch context, and from which source."""
    import slim_kernel.ops  # noqa: F401  (registers the ops' backends)
    from slim_kernel import registry

    sel = registry.select(tp.shape.op, tp.x.device, tp.args(), pdl=pdl)
    dec = registry.decision(tp.shape.op, tp.x.device, tp.args(), pdl)
    return f"{registry.pick_label(sel.spec, dec)} ({dec.source if dec else 'priority'})"


def measure_default(report, measured: list, column: str = "default") -> None:
    """Phase 2: the public op with nothing pinned, as routed now."""
    from slim_kernel import tune
    from slim_kernel.timing import DecodeStep

    for tp, rows in measured:
        try:
            call = default_call(tp)
            for r in rows:
                r.choice[column] = default_choice(tp, r.producer == "pdl")
                step = DecodeStep(tp.producers[r.producer], len(tp.weights))
                r.us.update(tune.read_confirmed(tp, step, r.producer == "pdl", {column: call}, report.notes))
        except Exception as exc:  # noqa: BLE001 - keep phase 1's rows; say what failed
            report.notes.append(f"default path {tp.shape.label()} M={tp.m} failed: {type(exc).__name__}: {exc}")


def install_table(data: dict, table_path: Path | None) -> None:
    """Refine the installed package's routing table with this run's named shapes (its points replace
    the table's; the shapes it did not measure keep theirs, so the estimate of unnamed shapes still
    learns from every shape; the unnamed shapes stay out: their ``default`` runs on the estimate)."""
    from slim_kernel import routing

    installed = Path(routing.__file__).resolve().parent / routing.TABLES / "routing_sm90.json"
    old = json.loads(installed.read_text()) if installed.exists() else None
    table = make_routing.build_table([data], old, "benchmark/bench_gemm.py (this run)", per_point=True, unnamed=False)
    installed.parent.mkdir(parents=True, exist_ok=True)
    installed.write_text(make_routing.dumps_table(table))
    if table_path is not None:
        table_path.write_text(make_routing.dumps_table(table))
    routing.reload()


def report_dict(report) -> dict:
    return asdict(report) | {"notes": [H.scrub(n) for n in report.notes]}


def print_tables(data: dict) -> None:
    for producer in ("plain", "pdl"):
        rows = [r for r in make_routing.summary_rows(data) if r["producer"] == producer]
        if not rows:
            continue
        print(f"\ndecode step, {producer} producer (us per call net of the producer; flashinfer "
              f"{data['versions'].get('flashinfer')}):")
        print(f"{'case':<28}{'M':>3}  {'default (choice)':<34}{'best anchor':<28}{'ratio':>6}{'floor':>7}"
              f"{'/floor':>7}  winner")
        for r in rows:
            case = r["op"].removeprefix("dsv3_").removesuffix("_gemm") + " " + " ".join(
                f"{k}={v}" for k, v in r["shape"].items()) + (" *" if r.get("unnamed") else "")
            win = make_routing.winner(r["ratio"], r["best_anchor"])
            tuned = f" tuned {r['tuned_ratio']:.2f}" if r.get("tuned_ratio") else ""
            floor = f"{r['floor_us']:>7.2f}{r['floor_ratio']:>7.2f}" if "floor_us" in r else f"{'-':>7}{'-':>7}"
            print(f"{case:<28}{r['m']:>3}  {r['ours_us']:>6.2f} ({r['backend'][:25]:<25}) "
                  f"{r['best_anchor_us']:>6.2f} {r['best_anchor'][:20]:<20}{r['ratio']:>6.2f}{floor}  {win}{tuned}")


def replot(data: dict, path) -> None:
    """``plot`` from a report's JSON (a run's, or make_routing's merge of several)."""
    from types import SimpleNamespace

    plot(SimpleNamespace(**{**data, "rows": [SimpleNamespace(**r) for r in data["rows"]]}), str(path))


def plot(report, path: str) -> None:
    """A grid: one row per shape, the plain and PDL-aware producer side by side; the default path,
    our best candidate and every anchor vs M, with the floors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys((r.op, json.dumps({k: v for k, v in r.shape.items() if k != "m"})) for r in report.rows))
    fig, axes = plt.subplots(len(keys), 2, figsize=(13, 3.2 * len(keys)), squeeze=False)
    for (op, shape), ax_row in zip(keys, axes):
        for ax, producer in zip(ax_row, ("plain", "pdl")):
            rows = sorted((r for r in report.rows if r.op == op and r.producer == producer
                           and json.dumps({k: v for k, v in r.shape.items() if k != "m"}) == shape),
                          key=lambda r: r.shape["m"])
            if not rows:
                ax.axis("off")
                continue
            ms = [r.shape["m"] for r in rows]
            names = sorted({n for r in rows for n in r.us if n.startswith(("anchor:", "default"))})
            ours = [min((v for n, v in r.us.items() if ":" in n and not n.startswith("anchor:")), default=None)
                    for r in rows]
            for name in names:
                ax.plot(ms, [r.us.get(name, float("nan")) for r in rows], marker="o", ms=2.5,
                        lw=2 if name.startswith("default") else 1, label=name.removeprefix("anchor:"))
            ax.plot(ms, [float("nan") if v is None else v for v in ours], "k:", lw=1, label="best of ours")
            ax.plot(ms, [r.hbm_floor_us + r.launch_floor_us for r in rows], "k-.", lw=0.8, label="HBM + launch floor")
            ax.set_title(f"{op.removeprefix('dsv3_')} {shape} ({producer} producer)", fontsize=8)
            ax.set_xlabel("M")
            ax.set_ylabel("us per call")
            top = max((r.us.get("default") or 0) for r in rows)
            ax.set_ylim(0, 2.5 * top if top else None)  # an anchor far off the scale (tiny_gemm at fused-A) is cut
            ax.grid(alpha=0.3)
            ax.legend(fontsize=5, ncol=2, loc="upper left")
    fig.suptitle(f"{report.device}: decode step, cold weights; flashinfer {report.versions.get('flashinfer')}",
                 fontsize=9)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=60)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency

    # line plots on white: 64 colours keep every curve and cut the file ~4x (40 shapes: 1.4 MB -> 0.35 MB)
    Image.open(png).convert("RGB").quantize(64).save(path, optimize=True)


def run_unnamed_tune(report, measured: list, unnamed: list, ms: list[int]) -> None:
    """``slim-kernel tune`` on the unnamed shapes (what a user of such a model would run), then
    the default path again (``default_tuned``)."""
    from slim_kernel import tune

    start = time.perf_counter()
    path, _, notes = tune.tune(unnamed, ms, progress=False)
    report.notes += [f"tune (unnamed shapes): {n}" for n in notes]
    report.notes.append(f"tune of the unnamed shapes at M {ms[0]}-{ms[-1]}: {time.perf_counter() - start:.0f} s, "
                        f"table {path.name}")
    measure_default(report, [(tp, rows) for tp, rows in measured if rows and rows[0].unnamed], "default_tuned")


def main(argv=None) -> int:
    from slim_kernel.models import MEASURED_MS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="the report to write (required unless --warm-anchors)")
    ap.add_argument("--png")
    ap.add_argument("--sglang", help="a directory holding sglang's JIT kernels (else an installed sglang)")
    ap.add_argument("--models", default="all", help="'all', model names (comma-separated) or '' for none")
    ap.add_argument("--router", action="append", default=[], metavar="E,K,out")
    ap.add_argument("--fused-a", action="append", default=[], metavar="N,K")
    ap.add_argument("--unnamed-router", action="append", default=[], metavar="E,K,out")
    ap.add_argument("--unnamed-fused-a", action="append", default=[], metavar="N,K")
    ap.add_argument("--ms", default="1-16", help="M values of the decode tables")
    ap.add_argument("--large-ms", default=",".join(str(m) for m in MEASURED_MS if m > 16), help="M past the anchors' window ('' for none)")
    ap.add_argument("--unnamed-ms", help="M values of the --unnamed-* shapes (default: --ms and --large-ms)")
    ap.add_argument("--skip-variants", metavar="FILE", help="JIT variants never launched, one op:name per line "
                                                            "(smoke_kernels.py --bad-file: the ones that failed alone)")
    ap.add_argument("--table", help="also write the regenerated routing table here")
    ap.add_argument("--summary", help="also write decode_step_summary.json here (rows of other versions kept)")
    ap.add_argument("--quick", action="store_true", help="M 1,8,16 and the first shape")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: fake timings, for the report plumbing")
    ap.add_argument("--replot", action="store_true", help="no GPU: draw --png from the existing --json and stop")
    ap.add_argument("--warm-anchors", action="store_true", help="only build the sglang modules these shapes time, and "
                                                                 "stop (benchmark/gpu_run.sh: in the background)")
    args = ap.parse_args(argv)
    if not args.json and not args.warm_anchors:
        ap.error("--json is required")
    if args.replot:
        replot(json.loads(Path(args.json).read_text()), args.png)
        return 0
    from slim_kernel.tune import parse_ms

    named, unnamed = shapes_from_args(args)
    if args.warm_anchors:
        notes: list[str] = []
        Anchors(notes, args.sglang).warm_sglang(named + unnamed)
        print("sglang modules:", "; ".join(notes) or "built")
        return 0
    if args.dry_run:
        report, t0 = dry_run(named), time.time()
    else:
        import torch

        report, t0 = H.start_report()
        anchors = Anchors(report.notes, args.sglang)
        from slim_kernel import __version__

        report.versions = {**anchors.versions(), "slim_kernel": __version__}
        ms = [1, 8, 16] if args.quick else parse_ms(args.ms)
        large = [] if args.quick or not args.large_ms else parse_ms(args.large_ms)
        named_ms = sorted(set(ms + large))
        unnamed_ms = parse_ms(args.unnamed_ms) if args.unnamed_ms else named_ms
        anchors.warm_sglang(named + unnamed)
        gen = torch.Generator(device="cuda").manual_seed(0)
        skip = skipped_variants(args.skip_variants)
        from slim_kernel import tune

        points = [(s, m) for s in named for m in named_ms] + [(s, m) for s in unnamed for m in unnamed_ms]
        tune.prebuild(points, torch.device("cuda", torch.cuda.current_device()))
        measured = []
        for shape in named + unnamed:
            for m in (unnamed_ms if shape in unnamed else named_ms):
                measured.append(measure_point(report, anchors, shape, m, gen, shape in unnamed,
                                              skip.get(shape.op, frozenset())))
            Path(args.json).write_text(make_routing.dumps_table(report_dict(report), "rows"))  # so far, should a later step fail
            print(f"[bench] {shape.label()}: {len(report.rows)} rows, {time.time() - t0:.0f} s", flush=True)
        install_table(report_dict(report), Path(args.table) if args.table else None)
        measure_default(report, measured)
        if unnamed:
            run_unnamed_tune(report, measured, unnamed, unnamed_ms)
    report.seconds = time.time() - t0
    data = report_dict(report)
    Path(args.json).write_text(make_routing.dumps_table(data, "rows"))
    if args.summary:
        path = Path(args.summary)
        path.write_text(make_routing.dumps_table(make_routing.merge_summary(path, [data]), "rows"))
    if args.png:
        plot(report, args.png)
    for note in report.notes:
        print("note:", note)
    print_tables(data)
    print(f"\n{len(report.rows)} rows in {report.seconds:.0f} s -> {args.json}")
    return 0


def dry_run(shapes) -> H.Report:
    """CPU: fake rows for the plumbing (routing table, summary, JSON, PNG, tables)."""
    report = H.Report(command="python3 benchmark/bench_gemm.py --dry-run", device="dry-run", torch="-",
                      hbm_read_GBps=4000.0, launch_floor_us=0.9, copy_GBps=3800.0, sms=132)
    report.versions["flashinfer"] = "0.0-dry"
    for shape in shapes[:2]:
        for m in (1, 2, 16):
            for producer in ("plain", "pdl"):
                row = report.add(H.Row(shape.op, {**shape.key(), "m": m}, "cold", pattern="decode",
                                       producer=producer, bytes_read=shape.n * shape.k * 2))
                row.us = {"jit:skinny": 4.0 + m * 0.1, "flashinfer": 3.0 + m * 0.2, "torch": 9.0,
                          "anchor:flashinfer": 3.0 + m * 0.2, "anchor:torch": 7.0, "default": 2.95 + m * 0.1}
                row.choice = {"default": "flashinfer (shipped)"}
    return report


if __name__ == "__main__":
    sys.exit(main())
