"""Decode GEMM benchmark: dsv3_router_gemm and dsv3_fused_a_gemm on the GPU machine.

  python benchmark/bench_gemm.py --json OUT.json --png OUT.png [--ms 1-16] [--ops router,fused_a]
         [--variant LABEL@OP@RULES ...] [--no-variants] [--quick]

Per (case, M, cold|hot) row, measured in one run (method: benchmark/harness.py): flashinfer
(mm_M1_16_K7168_N256/_N384[_bf16] with W.t(), tinygemm_bf16), torch F.linear, our JIT kernel
through the public op (backend="jit") and through the backend function, the JIT kernel with
PDL launches, JIT tile-config variants (cold only), the HBM floor and the graph launch floor.
jit / jit_op / variants launch without PDL, like the flashinfer column (launch_with_pdl=False);
jit_pdl and flashinfer_pdl launch with PDL: back-to-back calls then overlap one kernel's start
(our weight prologue) with the previous one's tail -- in a real decode step the overlap is with
the preceding kernel instead. Compare jit with flashinfer and jit_pdl with flashinfer_pdl.

Variants: RULES is a JIT tile-rule string (see slim_kernel/backends/jit.py), OP router|fused_a,
e.g. --variant 'fa_small@fused_a@8:rt=1,warps=8,split=1;16:rt=4'. SLIM_BENCH_VARIANTS (the same
specs, whitespace separated; "none" for none) replaces the built-in list.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import slim_kernel as sk  # noqa: E402
from slim_kernel.backends import jit as jb  # noqa: E402

import harness as H  # noqa: E402

K = 7168
FUSED_N = 2112
DEVICE = "cuda"
OPS = {"router": jb.ROUTER, "fused_a": jb.FUSED_A}
# Designs compared in one GPU run (cold); the defaults are in jb.DEFAULT_RULES.
BUILTIN_VARIANTS = [
    "r_rot@router@rt=1,stages=8,warps=4,split=0,rot=1",
    "r_w8@router@rt=1,stages=4,warps=8,split=0",
    "r_bulk@router@rt=1,stages=2,warps=4,split=0,bulk=2,kc=1024",
    "fa_rot@fused_a@rt=1,stages=8,warps=8,split=1,rot=1",
    "fa_b1024@fused_a@rt=1,stages=3,warps=4,split=0,bulk=1,kc=1024",
    "fa_b1024rot@fused_a@rt=1,stages=3,warps=4,split=0,bulk=1,kc=1024,rot=1",
    "fa_d2048@fused_a@rt=1,stages=3,warps=8,split=0,bulk=2,kc=2048",
    "fa_d2048rot@fused_a@rt=1,stages=3,warps=8,split=0,bulk=2,kc=2048,rot=1",
    "fa_rt4rot@fused_a@rt=4,stages=4,warps=4,split=0,rot=1",
]
MAIN_IMPLS = ["flashinfer", "torch", "jit_op", "jit", "flashinfer_pdl", "jit_pdl"]


def parse_variant(spec: str) -> tuple[str, str, tuple]:
    try:
        label, op, rules = spec.split("@", 2)
        return label, OPS[op], jb.parse_rules(rules)
    except (ValueError, KeyError) as exc:
        raise SystemExit(f"bad --variant {spec!r} (want LABEL@router|fused_a@RULES): {exc}") from None


def parse_ms(text: str) -> list[int]:
    ms: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        ms.update(range(int(lo), int(hi or lo) + 1))
    return sorted(ms)


def load_flashinfer(report: H.Report):
    if importlib.util.find_spec("flashinfer") is None:
        report.notes.append("flashinfer is not installed: its columns are absent")
        return None
    try:
        from slim_kernel.backends import flashinfer as fib
        return fib
    except Exception as exc:  # noqa: BLE001 - report any import failure and go on
        report.notes.append(f"flashinfer unusable ({type(exc).__name__}: {exc}): its columns are absent")
        return None


def router_impls(fib, e, dt, x, out):
    """name -> (weight -> call) for one router case."""
    impls = {}
    if fib is not None and (e, dt) in fib.ROUTER_KERNELS:
        kern = fib.ROUTER_KERNELS[(e, dt)]
        impls["flashinfer"] = lambda w: (lambda: kern(x, w.t(), out, launch_with_pdl=False))
        impls["flashinfer_pdl"] = lambda w: (lambda: kern(x, w.t(), out, launch_with_pdl=True))
    impls["torch"] = lambda w: (lambda: F.linear(x, w))
    impls["jit_op"] = lambda w: (lambda: sk.dsv3_router_gemm(x, w, dt, output=out, backend="jit"))
    impls["jit"] = lambda w: (lambda: jb.dsv3_router_gemm(out, x, w))
    return impls


def fused_a_impls(fib, x, out):
    impls = {}
    if fib is not None:
        impls["flashinfer"] = lambda w: (lambda: fib.tinygemm_bf16(x, w, out))
        impls["flashinfer_pdl"] = lambda w: (lambda: fib.tinygemm_bf16(x, w, out, use_pdl=True))
    impls["torch"] = lambda w: (lambda: F.linear(x, w))
    impls["jit_op"] = lambda w: (lambda: sk.dsv3_fused_a_gemm(x, w.t(), output=out, backend="jit"))
    impls["jit"] = lambda w: (lambda: jb.dsv3_fused_a_gemm(out, x, w.t()))
    return impls


def measure(report, make, weights, *, pdl=False, rules=None, op=None) -> float | None:
    saved = jb._RULES[op] if op else None
    try:
        jb.set_pdl(pdl)
        if rules is not None:
            jb.set_config(op, rules)
        return H.time_graph([make(w) for w in weights])
    except RuntimeError as exc:  # e.g. a cluster shape the device cannot schedule: record, go on
        report.notes.append(f"measurement failed ({op} {rules}): {exc}")
        return None
    finally:
        jb.set_pdl(False)
        if rules is not None:
            jb.set_config(op, saved)


@dataclass
class Case:
    op: str
    shape: dict
    weight: torch.Tensor
    out_dtype: torch.dtype
    make_impls: object  # (x, out) -> {name: weight -> call}
    copies: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)  # (m, cache) -> Row

    def __post_init__(self):
        self.copies = {"cold": H.rotating(self.weight, H.copies_for(self.weight.numel() * 2, True)),
                       "hot": [self.weight]}


def _fmt(row) -> str:
    return ", ".join(f"{a}={b:.2f}" if b is not None else f"{a}=failed" for a, b in row.us.items())


CHECK_MS = (1, 5, 8, 9, 16)


def check_config(report, case, gen, label, rules=None) -> bool:
    """Relative error of the JIT kernel (these rules, or the defaults) vs float64 at a few M;
    recorded in report.checks, a WRONG note when over the tests' tolerance. Returns ok."""
    if DEVICE == "cpu":
        return True
    n, k = case.weight.shape
    saved = jb._RULES[case.op]
    worst = 0.0
    try:
        if rules is not None:
            jb.set_config(case.op, rules)
        for m in CHECK_MS:
            x = torch.randn(m, k, generator=gen, device=DEVICE).to(torch.bfloat16)
            out = torch.full((m, n), float("nan"), device=DEVICE, dtype=case.out_dtype)
            fn = jb.dsv3_router_gemm if case.op == jb.ROUTER else jb.dsv3_fused_a_gemm
            fn(out, x, case.weight if case.op == jb.ROUTER else case.weight.t())
            ref = x.double() @ case.weight.double().t()
            err = ((out.double() - ref).norm() / ref.norm()).item()
            worst = max(worst, err if err == err else float("inf"))
    except RuntimeError as exc:
        report.notes.append(f"WRONG {case.op} {case.shape} [{label}]: failed: {exc}")
        return False
    finally:
        jb.set_config(case.op, saved)
    tol = 1e-5 if case.out_dtype == torch.float32 else 5e-3
    report.checks[f"{case.op} {case.shape} [{label}]"] = worst
    if worst > tol:
        report.notes.append(f"WRONG {case.op} {case.shape} [{label}]: relative error {worst:.3g} > {tol}")
    return worst <= tol


def run_main(report, case, ms, gen):
    """Anchors and the default JIT kernel, cold and hot, for every M."""
    n, k = case.weight.shape
    check_config(report, case, gen, "default")
    for m in ms:
        x = torch.randn(m, k, generator=gen, device=DEVICE).to(torch.bfloat16)
        out = torch.empty(m, n, device=DEVICE, dtype=case.out_dtype)
        impls = case.make_impls(x, out)
        for cache, ws in case.copies.items():
            row = H.Row(op=case.op, shape={**case.shape, "m": m}, cache=cache,
                        bytes_read=n * k * 2 + m * k * 2 + m * n * out.element_size())
            for name, make in impls.items():
                row.us[name] = measure(report, make, ws)
            row.us["jit_pdl"] = measure(report, impls["jit"], ws, pdl=True)
            case.rows[(m, cache)] = report.add(row)
        print(f"  {case.op} {case.shape} M={m} cold: {_fmt(case.rows[(m, 'cold')])}", flush=True)


def run_variants(report, case, ms, gen, variants):
    """JIT tile-config variants (cold), added to the rows run_main made."""
    n, k = case.weight.shape
    mine = [v for v in variants if v[1] == case.op and check_config(report, case, gen, v[0], v[2])]
    if not mine:
        return
    for m in ms:
        x = torch.randn(m, k, generator=gen, device=DEVICE).to(torch.bfloat16)
        out = torch.empty(m, n, device=DEVICE, dtype=case.out_dtype)
        make = case.make_impls(x, out)["jit"]
        row = case.rows[(m, "cold")]
        for label, op, rules in mine:
            row.us[f"jit[{label}]"] = measure(report, make, case.copies["cold"], rules=rules, op=op)
        print(f"  {case.op} {case.shape} M={m} variants: "
              + ", ".join(f"{lb}={row.us[f'jit[{lb}]'] or float('nan'):.2f}" for lb, _, _ in mine), flush=True)


def check_targets(report) -> list[str]:
    """Issue targets, per launch mode: jit vs flashinfer (no PDL) and jit_pdl vs flashinfer_pdl."""
    lines = []
    for ours, anchor in (("jit", "flashinfer"), ("jit_pdl", "flashinfer_pdl")):
        misses = []
        for r in report.rows:
            if r.cache != "cold" or ours not in r.us:
                continue
            j, fi = r.us[ours], r.us.get(anchor)
            tag = f"{r.op} {r.shape}"
            if j is None:
                misses.append(f"{tag}: the {ours} measurement failed")
            elif r.op == jb.ROUTER:
                if fi is not None and j > fi:
                    misses.append(f"{tag}: {ours} {j:.2f} us > {anchor} {fi:.2f} us (+{j - fi:.2f})")
                if r.shape["m"] == 16 and r.shape["e"] == 256 and j > 3.0:
                    misses.append(f"{tag}: {ours} {j:.2f} us > 3.0 us target")
            elif j > 8.0:
                misses.append(f"{tag}: {ours} {j:.2f} us > 8.0 us target")
        lines += [f"MISS {m}" for m in misses] or [
            f"{ours}: all targets met (router <= {anchor} at every M, <= 3.0 us at M=16 E=256; fused-A <= 8.0 us)"]
    return lines


def resource_notes(report) -> None:
    try:
        from slim_kernel import jit
        arch = jit.arch_for_device(torch.cuda.current_device())
        for inst in jb.all_instances():
            u = jit.resource_usage(inst, arch)
            report.notes.append(f"{inst.entry} {dict(inst.defines)} on {arch}: {u.registers} regs, "
                                f"spill {u.spill_bytes} B, static smem {u.smem_static} B")
    except Exception as exc:  # noqa: BLE001
        report.notes.append(f"resource usage unavailable: {exc}")


def dry_run() -> None:
    """Replace every GPU step with a fake, deterministic one (for --dry-run)."""
    import random

    global DEVICE
    DEVICE = "cpu"
    rnd = random.Random(0)
    H.time_graph = lambda calls, **_: rnd.uniform(1.0, 12.0)
    H.hbm_read_bandwidth = lambda *a, **k: 4.2e12
    H.graph_launch_floor = lambda: 1.0
    H.device_name = lambda: "dry-run"
    H.L2_ROTATE_BYTES = 8 << 20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", required=True)
    ap.add_argument("--png")
    ap.add_argument("--ms", default="1-16", help="M values, e.g. 1-16 or 1,2,4,8,16")
    ap.add_argument("--ops", default="router,fused_a")
    ap.add_argument("--variant", action="append", default=None, help="LABEL@OP@RULES (repeatable)")
    ap.add_argument("--no-variants", action="store_true")
    ap.add_argument("--quick", action="store_true", help="M in 1,2,4,8,16 and no bf16 router case")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU, fake timings, nothing executed: checks the report/JSON/PNG/table plumbing")
    args = ap.parse_args(argv)
    if args.dry_run:
        dry_run()
    elif not torch.cuda.is_available():
        print("bench_gemm: no CUDA device", file=sys.stderr)
        return 2
    env = os.environ.get("SLIM_BENCH_VARIANTS")
    specs = args.variant or (env.split() if env and env != "none" else [] if env == "none" else BUILTIN_VARIANTS)
    variants = [] if args.no_variants else [parse_variant(s) for s in specs]
    ms = [1, 2, 4, 8, 16] if args.quick else parse_ms(args.ms)
    ops = set(args.ops.split(","))
    pdl_default = jb.PDL

    report, t0 = H.start_report()
    if args.dry_run:
        report.notes.append("DRY RUN: fake timings, nothing was executed")
    report.notes.append(f"JIT default rules: {jb._RULES}; backend PDL default {'on' if pdl_default else 'off'}")
    report.notes.append("torch = F.linear(x, W) (bf16 out, cuBLAS); jit_op = public op, backend='jit'; "
                        "jit = backend function; *_pdl = launched with PDL")
    fib = None if args.dry_run else load_flashinfer(report)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    cases = []
    if "router" in ops:
        for e, dt in [(256, torch.float32), (384, torch.float32)] + ([] if args.quick else [(256, torch.bfloat16)]):
            w = torch.randn(e, K, generator=gen, device=DEVICE).to(torch.bfloat16)
            cases.append(Case(jb.ROUTER, {"e": e, "k": K, "out": str(dt).replace("torch.", "")}, w, dt,
                              lambda x, out, e=e, dt=dt: router_impls(fib, e, dt, x, out)))
    if "fused_a" in ops:
        w = torch.randn(FUSED_N, K, generator=gen, device=DEVICE).to(torch.bfloat16)
        cases.append(Case(jb.FUSED_A, {"n": FUSED_N, "k": K}, w, torch.bfloat16,
                          lambda x, out: fused_a_impls(fib, x, out)))
    # Phases, JSON written after each: anchors + defaults, then variants, push variants last (a
    # device fault in an experimental variant then loses nothing measured before it).
    for case in cases:
        run_main(report, case, ms, gen)
    report.to_json(args.json)
    pushes = [v for v in variants if any(cfg.push for _, cfg in v[2])]
    for phase in ([v for v in variants if v not in pushes], pushes):
        for case in cases:
            run_variants(report, case, ms, gen, phase)
        report.to_json(args.json)
    jb.set_pdl(pdl_default)
    if not args.dry_run:
        resource_notes(report)
    report.notes += check_targets(report)
    report.seconds = time.time() - t0
    report.to_json(args.json)
    impls = MAIN_IMPLS + [f"jit[{v[0]}]" for v in variants]
    if args.png:
        groups = [(f"router E={e} K={K} {o}", lambda r, e=e, o=o: r.op == jb.ROUTER and r.shape["e"] == e
                   and r.shape["out"] == o) for e, o in ((256, "float32"), (384, "float32"), (256, "bfloat16"))]
        groups.append((f"fused_a N={FUSED_N} K={K}", lambda r: r.op == jb.FUSED_A))
        groups = [g for g in groups if any(g[1](r) for r in report.rows)]
        H.plot(report, args.png, groups, impls)
    print("\ncorrectness vs float64 (max relative error over M in "
          f"{','.join(map(str, CHECK_MS))}; tolerance fp32 1e-5, bf16 5e-3):")
    for what, err in report.checks.items():
        print(f"  {err:9.2e}  {what}")
    print()
    print("\n".join(report.notes))
    print(f"\n{report.device}: HBM read {report.hbm_read_GBps:.0f} GB/s, graph launch floor "
          f"{report.launch_floor_us:.2f} us, {report.seconds:.0f} s; us per call, cold:")
    print(H.table(report, MAIN_IMPLS))
    for op in sorted({v[1] for v in variants}):
        print(f"\n{op} variants (cold, jit = default rules):")
        print(H.table(report, ["jit", *[f"jit[{v[0]}]" for v in variants if v[1] == op]], op=op))
    return 0


if __name__ == "__main__":
    sys.exit(main())
