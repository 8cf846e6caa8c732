"""Decode GEMM benchmark: dsv3_router_gemm and dsv3_fused_a_gemm on the GPU machine, measured the way models run.

  python benchmark/bench_gemm.py --json OUT.json --png OUT.png [--sglang DIR] [--ms 1-16] [--large-ms LIST]
         [--table PATH] [--summary PATH] [--quick] [--dry-run]

Headline (``pattern: decode``): each GEMM follows, on the same stream inside the CUDA graph, the
kernel that writes its activation: a PDL-unaware elementwise kernel (``plain``) and flashinfer's
``rmsnorm(..., enable_pdl=True)`` (``pdl``, what sglang runs on Hopper); weights distinct per call
over > 2x the 60 MB L2; per call = (producer+GEMM - producer alone) / calls (benchmark/harness.py).
Secondary (``pattern: b2b``): back-to-back calls of one GEMM.

Columns: ``jit:<variant>`` every configuration of slim_kernel/jit/catalogue.py (PDL on; ``@nopdl``
off), ``ref`` our torch backend, ``default`` the public op with nothing pinned (phase 2, after the
routing table was regenerated from phase 1 and installed), and the anchors (benchmark/anchors.py):
flashinfer as installed with and without PDL, sglang's JIT kernels, torch. Shapes: router E 256/384,
fp32/bf16 out; fused-A N 2112; K 7168; M 1..16 and, past every anchor's window, the large-M list
(jit vs torch). Prints one table per producer last: the winner and our ratio to the best anchor.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_routing  # noqa: E402
from anchors import Anchors  # noqa: E402

import harness as H  # noqa: E402

K = 7168
FUSED_N = 2112
ROUTER_CASES = [(256, "float32"), (256, "bfloat16"), (384, "float32"), (384, "bfloat16")]
LARGE_MS = [17, 20, 24, 28, 32, 40, 48, 56, 64]
FP32_TOL, BF16_TOL = 1e-5, 5e-3


def parse_ms(text: str) -> list[int]:
    ms: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        ms.update(range(int(lo), int(hi or lo) + 1))
    return sorted(ms)


class Case:
    """One (op, shape): weights (rotating copies), and per M the implementations to time."""

    def __init__(self, op: str, n: int, out_dtype: str, gen):
        import torch

        self.op, self.n, self.out_dtype = op, n, getattr(torch, out_dtype)
        self.shape = {"e": n, "k": K, "out": out_dtype} if op.endswith("router_gemm") else {"n": n, "k": K}
        w = torch.randn(n, K, generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)
        self.bytes = w.numel() * 2
        self.weights = H.rotating(w, H.copies_for(self.bytes, True))

    def gemm_arg(self, w):  # the op's weight argument: router (E, K), fused-A (K, N) column-major
        return w if "e" in self.shape else w.t()


SKIP: set[str] = set()  # "op:variant" entries of --skip-variants (failed benchmark/smoke_kernels.py)


def ours(case: Case, x, out) -> dict:
    """jit:<variant> (PDL on and @nopdl), ref (our torch backend), fiprog:<variant>, all bound as the
    backends run them."""
    from slim_kernel.backends import jit as jb
    from slim_kernel.backends import torch_ref
    from slim_kernel.jit import catalogue as cat

    prepare = jb.prepare_router if "e" in case.shape else jb.prepare_fused_a
    m = x.shape[0]
    impls = {}
    for pdl, suffix in ((True, ""), (False, "@nopdl")):
        for name, cfg in cat.VARIANTS[case.op].items():
            if cat.variant_serves(cfg, case.op, m) and f"{case.op}:{name}" not in SKIP:
                fn = prepare((out, x, case.gemm_arg(case.weights[0])), name, pdl)
                impls[f"jit:{name}{suffix}"] = lambda w, fn=fn: (lambda: fn(out, x, case.gemm_arg(w)))
    ref = getattr(torch_ref, case.op)
    impls["ref"] = lambda w: (lambda: ref(out, x, case.gemm_arg(w)))
    impls.update(flashinfer_programs(case, x, out))
    return impls


def flashinfer_programs(case: Case, x, out) -> dict:
    """fiprog:<variant> (PDL on and @nopdl): our flashinfer backend with a pinned program, where
    the installed flashinfer has it (routed to as flashinfer:<variant>; not an anchor: flashinfer's
    own call picks its program itself)."""
    if "e" in case.shape:
        return {}
    try:
        from slim_kernel.backends import flashinfer as fb
    except ImportError:
        return {}
    from slim_kernel.names import FLASHINFER_FUSED_A_PROGRAMS as FLASHINFER_PROGRAMS

    impls = {}
    for pdl, suffix in ((True, ""), (False, "@nopdl")):
        for name in FLASHINFER_PROGRAMS:
            if fb.fused_a_program(name, x.shape[1], pdl) is not None:
                fn = fb.prepare_fused_a((out, x, case.gemm_arg(case.weights[0])), name, pdl)
                impls[f"fiprog:{name}{suffix}"] = lambda w, fn=fn: (lambda: fn(out, x, case.gemm_arg(w)))
    return impls


def default(case: Case, x, out):
    import slim_kernel as sk

    if "e" in case.shape:
        return lambda w: (lambda: sk.dsv3_router_gemm(x, w, case.out_dtype, output=out))
    return lambda w: (lambda: sk.dsv3_fused_a_gemm(x, w.t(), output=out))


def default_choice(case: Case, x, out, pdl: bool) -> str:
    """What the default path runs in a launch context (slim_kernel.pdl: after a PDL-aware
    producer under capture, or eager, ``pdl`` is True; after a plain producer False)."""
    import torch

    import slim_kernel.ops  # noqa: F401  (registers the ops' backends)
    from slim_kernel import registry

    args = (out, x, case.gemm_arg(case.weights[0]))
    sel = registry.select(case.op, x.device, args, pdl=pdl)
    dec = registry.decision(case.op, torch.device("cuda", x.device.index or 0), args, pdl)
    best = dec.point.best(sel.spec.backend.value) if dec else None
    return f"{sel.spec.backend.value}:{best[0]}" if best and best[0] else sel.spec.backend.value


def check(report, case: Case, m: int, name: str, make, x, out, producer) -> bool:
    """One call against float64 with a poisoned output; a wrong implementation is not timed."""
    import torch

    out.fill_(float("nan"))
    try:
        producer()
        res = make(case.weights[0])()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - an anchor that cannot run this shape: note it, go on
        report.notes.append(f"{case.op} {case.shape} M={m} {name} failed: {type(exc).__name__}: {exc}; not timed")
        return False
    res = res if isinstance(res, torch.Tensor) else out
    ref = x.double() @ case.weights[0].double().t()
    err = ((res.double() - ref).norm() / ref.norm()).item()
    tol = FP32_TOL if res.dtype == torch.float32 else BF16_TOL
    report.checks[f"{case.op} {case.shape} M={m} {name}"] = err
    if not err <= tol:
        report.notes.append(f"WRONG RESULT {case.op} {case.shape} M={m} {name}: rel err {err:.3g} > {tol}; not timed")
        return False
    return True


def measure_case(report, anchors: Anchors, case: Case, ms: list[int], gen, large: bool) -> list[tuple]:
    """Phase 1 rows of one case; returns the (case, m, x, out, producers) phase 2 re-times."""
    import torch

    done = []
    for m in ms:
        x = torch.empty(m, K, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, case.n, device="cuda", dtype=case.out_dtype)
        producers = anchors.producers(x, gen)
        impls = ours(case, x, out)
        impls.update(anchors.router(case.n, case.out_dtype, x, out) if "e" in case.shape else anchors.fused_a(x, out))
        impls = {n: f for n, f in impls.items() if check(report, case, m, n, f, x, out, producers["plain"])}
        shape = {**case.shape, "m": m}
        for producer, produce in producers.items():
            if large and producer != "plain":
                continue
            row = report.add(H.Row(case.op, shape, "cold", bytes_read=case.bytes, pattern="decode", producer=producer))
            for name, make in impls.items():
                if producer == "pdl" and name.endswith("@nopdl"):
                    continue
                row.us[name] = H.time_decode_step(produce, [make(w) for w in case.weights])
        if not large:
            row = report.add(H.Row(case.op, shape, "cold", bytes_read=case.bytes, pattern="b2b"))
            for name, make in impls.items():
                if not name.endswith("@nopdl") and name != "ref":
                    row.us[name] = H.time_graph([make(w) for w in case.weights])
        done.append((case, m, x, out, producers))
    return done


def measure_default(report, measured: list[tuple]) -> None:
    """Phase 2: the public op with nothing pinned, routed by the table regenerated from phase 1."""
    rows = {}
    for r in report.rows:
        rows.setdefault((r.op, json.dumps(r.shape, sort_keys=True)), []).append(r)
    for case, m, x, out, producers in measured:
        try:
            make = default(case, x, out)
            for r in rows[(case.op, json.dumps({**case.shape, "m": m}, sort_keys=True))]:
                r.choice = {"default": default_choice(case, x, out, r.producer != "plain")}
                calls = [make(w) for w in case.weights]
                r.us["default"] = (H.time_decode_step(producers[r.producer], calls) if r.pattern == "decode"
                                   else H.time_graph(calls))
        except Exception as exc:  # noqa: BLE001 - keep phase 1's rows; say what failed
            report.notes.append(f"default path {case.op} {case.shape} M={m} failed: {type(exc).__name__}: {exc}")


def install_table(report, table_path: Path | None) -> dict:
    """Regenerate the routing table from this run's rows into the installed package (and --table)."""
    from slim_kernel import routing

    installed = Path(routing.__file__).resolve().parent / routing.TABLES / "routing_sm90.json"
    old = json.loads(installed.read_text()) if installed.exists() else None
    table = make_routing.build_table([report_dict(report)], old, "benchmark/bench_gemm.py (this run)")
    installed.parent.mkdir(parents=True, exist_ok=True)
    installed.write_text(make_routing.dumps_table(table))
    if table_path is not None:
        table_path.write_text(make_routing.dumps_table(table))
    routing.reload()
    return table


def report_dict(report) -> dict:
    from dataclasses import asdict

    return asdict(report)


def print_tables(data: dict) -> None:
    for producer in ("plain", "pdl"):
        rows = [r for r in make_routing.summary_rows(data) if r["producer"] == producer]
        if not rows:
            continue
        print(f"\ndecode step, {producer} producer (us per call net of the producer; flashinfer "
              f"{data['versions'].get('flashinfer')}):")
        print(f"{'case':<30}{'M':>3}  {'default (choice)':<30}{'best anchor':<28}{'ratio':>6}  winner")
        for r in rows:
            case = r["op"].removeprefix("dsv3_").removesuffix("_gemm") + " " + " ".join(
                f"{k}={v}" for k, v in r["shape"].items())
            win = make_routing.winner(r["ratio"], r["best_anchor"])
            print(f"{case:<30}{r['m']:>3}  {r['ours_us']:>6.2f} ({r['backend'][:21]:<21}) "
                  f"{r['best_anchor_us']:>6.2f} {r['best_anchor'][:20]:<20}{r['ratio']:>6.2f}  {win}")


def _case_key(r) -> tuple:
    return r.op, tuple((k, v) for k, v in r.shape.items() if k != "m")


def plot(report, path: str) -> None:
    """One panel per case and producer: the default path, our configurations and the anchors vs M."""
    names = sorted({n for r in report.rows for n in r.us if not n.endswith("@nopdl")})
    groups = []
    for key in dict.fromkeys(_case_key(r) for r in report.rows):
        for prod in ("plain", "pdl"):
            title = f"{key[0].removeprefix('dsv3_')} {dict(key[1])} decode, {prod} producer"
            groups.append((title, lambda r, key=key, prod=prod: _case_key(r) == key and r.pattern == "decode"
                           and r.producer == prod))
    H.plot(report, path, groups, names)


def dry_run(report) -> None:
    """CPU: fake rows for the plumbing (routing table, summary, JSON, PNG, tables)."""
    report.versions["flashinfer"] = "0.0-dry"
    for op, shapes in (("dsv3_router_gemm", [{"e": 256, "k": K, "out": "float32"}]),
                       ("dsv3_fused_a_gemm", [{"n": FUSED_N, "k": K}])):
        for shape in shapes:
            for m in (1, 2, 16):
                for producer in ("plain", "pdl"):
                    row = report.add(H.Row(op, {**shape, "m": m}, "cold", pattern="decode", producer=producer,
                                           bytes_read=3 << 20))
                    row.us = {"jit:skinny": 4.0 + m * 0.1, "jit:skinny@nopdl": 4.5, "flashinfer": 3.0 + m * 0.2,
                              "flashinfer_pdl": 2.9 + m * 0.2, "ref": 9.0, "torch": 7.0, "default": 2.95 + m * 0.1}
                    row.choice = {"default": "flashinfer"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--png")
    ap.add_argument("--sglang", default=os.environ.get("SLIM_SGLANG_ANCHORS"), help="sglang_jit directory (anchors)")
    ap.add_argument("--ms", default="1-16", help="M values of the decode and back-to-back tables")
    ap.add_argument("--large-ms", default=",".join(map(str, LARGE_MS)), help="M past the anchors' window ('' for none)")
    ap.add_argument("--ops", default="router,fused_a")
    ap.add_argument("--table", help="also write the regenerated routing table here")
    ap.add_argument("--summary", help="also write decode_step_summary.json here (rows of other versions kept)")
    ap.add_argument("--quick", action="store_true", help="M 1,8,16 and one router case")
    ap.add_argument("--skip-variants", help="file of op:variant lines not to time (benchmark/smoke_kernels.py)")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: fake timings, for the report plumbing")
    args = ap.parse_args(argv)
    if args.skip_variants and Path(args.skip_variants).exists():
        SKIP.update(Path(args.skip_variants).read_text().split())
    if args.dry_run:
        report = H.Report(command="bench_gemm.py --dry-run", device="dry-run", torch="-", hbm_read_GBps=4000.0,
                          launch_floor_us=0.9)
        t0 = time.time()
        dry_run(report)
    else:
        import torch

        report, t0 = H.start_report()
        anchors = Anchors(report.notes, args.sglang)
        from slim_kernel import __version__

        report.versions = {**anchors.versions(), "slim_kernel": __version__}
        report.notes += [f"skipped (failed the smoke test): {v}" for v in sorted(SKIP)]
        ms = [1, 8, 16] if args.quick else parse_ms(args.ms)
        large = [] if args.quick else parse_ms(args.large_ms)
        router_cases = ROUTER_CASES[:1] if args.quick else ROUTER_CASES
        anchors.warm_sglang([(e, getattr(torch, dt)) for e, dt in router_cases], FUSED_N, K)
        gen = torch.Generator(device="cuda").manual_seed(0)
        cases = ([Case("dsv3_router_gemm", e, dt, gen) for e, dt in router_cases] if "router" in args.ops else []) + \
                ([Case("dsv3_fused_a_gemm", FUSED_N, "bfloat16", gen)] if "fused_a" in args.ops else [])
        measured = []
        for case in cases:
            measured += measure_case(report, anchors, case, ms, gen, large=False)
            measured += measure_case(report, anchors, case, large, gen, large=True)
        Path(args.json).write_text(json.dumps(report_dict(report), indent=1))  # phase 1, should phase 2 fail
        install_table(report, Path(args.table) if args.table else None)
        measure_default(report, measured)
    report.seconds = time.time() - t0
    data = report_dict(report)
    Path(args.json).write_text(json.dumps(data, indent=1))
    if args.summary:
        path = Path(args.summary)
        path.write_text(json.dumps(make_routing.merge_summary(path, [data]), indent=1) + "\n")
    if args.png:
        plot(report, args.png)
    for note in report.notes:
        print("note:", note)
    print_tables(data)
    print(f"\n{len(report.rows)} rows in {report.seconds:.0f} s -> {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
