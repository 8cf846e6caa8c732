"""`slim-kernel info`: the doctor. Versions, devices, JIT runtime, knobs and pins (validated), per op
which backends can serve and why not, the measured routing table in force and what each op would
pick per shape and M, whether every JIT instance the routing can pick for the given shapes
(``--model``/``--router``/``--fused-a``; default every model in ``slim_kernel/models.py``) is in the
cache (and, where not, whether another compiler built the entries), and the bmm_fp8 fast-path state.
The text is short by default (what would run on each device and why, each reason said once);
``--verbose`` lists everything, ``--json`` carries everything. Exit 2 when a knob or pin is malformed."""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata

SCHEMA = 1


def add_arguments(parser) -> None:
    from .models import add_shape_arguments

    parser.add_argument("--json", action="store_true", help="print machine-readable JSON (schema 1): everything")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also list every backend with its note, every knob and the JIT runtime in full "
                             "(the default is the short form: what would run on each device, and why)")
    add_shape_arguments(parser)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _knobs() -> tuple[dict, list[str]]:
    """Every environment knob and pin with its value, and the errors of malformed ones (shown as
    ``invalid ('<value>')``, never as the default they fall back to)."""
    from . import knobs, registry
    from .jit import routed, runtime
    from .names import FUSED_A, OPS, ROUTER

    values: dict = {}
    errors: list[str] = []

    def check(name: str, shown: str, read) -> None:
        try:
            values[shown] = read()
        except (TypeError, ValueError, RuntimeError) as exc:
            errors.append(str(exc))
            values[shown] = f"invalid ({os.environ.get(name)!r})"

    def pdl():
        if knobs.STATE.error:
            raise ValueError(knobs.STATE.error)
        return knobs.pdl_setting()

    def launcher():
        runtime.launcher_name()  # validates the value
        return os.environ.get(knobs.ENV_LAUNCHER)

    check(knobs.ENV_PDL, "pdl", pdl)
    check(knobs.ENV_JIT, knobs.ENV_JIT, knobs.jit_mode)
    check(knobs.ENV_SMEM_ROOM, knobs.ENV_SMEM_ROOM, knobs.smem_room)
    for op in OPS:
        check(registry.env_var(op), registry.env_var(op),
              lambda op=op: getattr(registry.pinned_backend(op, None)[0], "value", None))
    for op in (ROUTER, FUSED_A):
        check(routed.env_var(op), routed.env_var(op),
              lambda op=op: os.environ.get(routed.env_var(op)) if routed.rules(op) else None)
    for name in knobs.VARIABLES:  # the rest, as set (each reader validates its own)
        if name not in values and "<OP>" not in name and name != knobs.ENV_PDL:
            values[name] = os.environ.get(name)
    check(knobs.ENV_LAUNCHER, knobs.ENV_LAUNCHER, launcher)
    return values, errors


def _meta_args(op: str, shape: dict, m: int):
    """Stand-in arguments of a call at a routing-table point (meta tensors: no memory, no GPU)."""
    import torch

    from .names import ROUTER

    meta = torch.device("meta")
    act = torch.empty(m, shape["k"], dtype=torch.bfloat16, device=meta)
    if op == ROUTER:
        out = torch.empty(m, shape["e"], dtype=getattr(torch, shape["out"]), device=meta)
        return out, act, torch.empty(shape["e"], shape["k"], dtype=torch.bfloat16, device=meta)
    w = torch.empty(shape["n"], shape["k"], dtype=torch.bfloat16, device=meta)
    return torch.empty(m, shape["n"], dtype=torch.bfloat16, device=meta), act, w.t()




def _pick_shapes(device) -> list[tuple[str, dict]]:
    """Every listed model's shapes, then any other shape a table (shipped or tuned) measured."""
    from . import devices, models, registry, routing

    shapes = [(s.op, s.key()) for s in models.all_shapes()]
    tables = [routing.table(registry.arch(device)),
              routing.tuned_table(devices.routing_device(device), routing.installed_versions())]
    for tab in filter(None, tables):
        for op in (models.ROUTER, models.FUSED_A):
            shapes += [(op, shape) for shape in tab.shapes(op)]
    return list({json.dumps(s, sort_keys=True): s for s in shapes}.values())


def _picks(device) -> list[dict]:
    """What each op would run for every model shape and M, in each launch context the PDL knob
    allows (auto: both; slim_kernel.pdl), which source decided it (tuned, shipped or estimate)
    and why."""
    from . import knobs, models, registry
    from .models import Shape

    contexts = (True, False) if knobs.pdl_auto() else (knobs.pdl(),)
    version, rows = _version("flashinfer-python"), []
    for op, shape in _pick_shapes(device):
        for pdl in contexts:
            for m in models.MEASURED_MS:
                args = _meta_args(op, shape, m)
                order, _, dec = registry.ranked(op, device, args, pdl)
                order = [s for s in order if s.probe is None or s.probe() is None]
                if not order:
                    continue
                spec = order[0]
                row = {"op": op, "shape": shape, "m": m, "flashinfer": version, "pdl": pdl,
                       "pick": registry.pick_label(spec, dec),
                       "source": registry.order_rule(op, device, dec), "estimate": bool(dec and dec.estimated),
                       "why": registry.why(spec, dec, registry.unmeasured_arch(op, device))}
                if row["estimate"] or dec is None:
                    row["tune"] = f"slim-kernel tune {Shape.from_key(op, shape).option()}"
                rows.append(row)
    return rows


def _tables(device=None) -> dict:
    from . import devices, routing

    out = {}
    for arch in routing.shipped_archs():
        tab = routing.table(arch)
        out[arch] = None if tab is None else {
            "source": tab.source, "device": tab.device, "sms": tab.sms, "entries": len(tab.points),
            "flashinfer_versions": tab.versions_of("flashinfer"), "generated_by": tab.generated_by,
            "devices": [{"device": t.device, "sms": t.sms, "memory_gbps": t.memory_gbps, "entries": len(t.points)}
                        for t in routing.tables(arch)]}
    if device is not None:
        rdev = devices.routing_device(device)
        own, near = routing.shipped_for(rdev), routing.nearest_shipped(rdev)
        out["shipped"] = None if near is None else {
            "device": near.device, "rule": "this GPU's own measurements" if own is not None and own.device == rdev.name
            else "another GPU's of its SM count (an estimate)" if own is not None
            else f"the estimate, placed on its {rdev.sms} SMs, learning from the nearest GPU's"}
        path = routing.tuned_path(rdev, routing.installed_versions())
        tuned = routing.tuned_table(rdev, routing.installed_versions())
        out["tuned"] = {"path": str(path), "exists": path.exists(), "used": tuned is not None,
                        "entries": len(tuned.points) if tuned else 0}
    return out


def _flashinfer_note() -> str | None:
    """Why the routing numbers may not fit the installed flashinfer (the extra only has a lower bound)."""
    from . import routing

    installed = _version("flashinfer-python")
    measured = sorted({v for arch in routing.shipped_archs() for t in routing.tables(arch) for v in t.versions_of("flashinfer")},
                      key=routing.version_key)
    if installed is None or not measured or routing.measured_as("flashinfer", installed) in measured:
        return None
    return (f"flashinfer {installed} is not one of the measured versions ({', '.join(measured)}): routing uses "
            "the nearest measured version's numbers (the bmm_fp8 fast path checks itself)")


def _coverage(devices: list, shapes: list | None) -> dict:
    """Whether every JIT instance the routing can pick for ``shapes`` (default: every model's) is in
    the cache, per arch of the visible GPUs (none: per arch already in the cache)."""
    from .jit import cached_counts
    from .jit.arch import arch_for_device
    from .jit.routed import cache_coverage
    from .models import all_shapes

    archs = sorted({arch_for_device(d.index) for d in devices if d.type == "cuda"}) or sorted(cached_counts())
    listed = shapes or all_shapes()
    return {"shapes": "given" if shapes else "every model in slim_kernel/models.py", "archs": archs,
            "per_arch": [cache_coverage(arch, listed) for arch in archs]}


def _backend_health() -> list[str]:
    """Every registered backend's reads of private library internals that stopped working."""
    from . import backend

    return [line for name in backend.NAMES for line in backend.get(name).health()]


def _fast_path() -> dict:
    from .backends.flashinfer_fastpath import fast_path_state

    return fast_path_state(probe=True)


def collect(shapes: list | None = None) -> tuple[dict, list[str]]:
    import torch

    from . import __version__, ops, registry  # noqa: F401  (importing ops registers their backends)
    from .jit import runtime_info
    from .names import OPS

    knob_values, errors = _knobs()
    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    report = {
        "schema": SCHEMA,
        "slim_kernel": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "flashinfer": _version("flashinfer-python"),
        "bmm_fp8_fast_path": _fast_path(),
        "knobs": knob_values,
        "errors": errors,
        "jit": runtime_info(),
        "routing_tables": _tables(),
        "notes": [note for note in (_flashinfer_note(),) if note],
        "devices": [],
    }
    for dev in devices:
        entry = {"device": str(dev)}
        if dev.type == "cuda":
            props = torch.cuda.get_device_properties(dev)
            entry.update(name=props.name, capability=f"{props.major}.{props.minor}", sms=props.multi_processor_count)
        entry["ops"] = {
            op: [{"backend": spec.backend.value, "eligible": reason is None, "reason": reason, "note": spec.note}
                 for spec, reason in registry.explain(op, dev)]
            for op in OPS
        }
        if dev.type == "cuda":
            entry["routing_tables"] = _tables(dev)
        entry["picks"] = _picks(dev) if dev.type == "cuda" and not errors else []
        report["devices"].append(entry)
    report["notes"] += _backend_health()
    report["jit_cache_coverage"] = _coverage(devices, shapes) if not errors else None
    return report, errors


def _print_coverage(cov: dict | None) -> None:
    if cov is None:
        return
    if not cov["archs"]:
        print(f"  jit.routed_in_cache ({cov['shapes']}): no GPU visible and no arch in the cache to check")
    for row in cov["per_arch"]:
        if "error" in row:
            state = row["error"]
        else:
            state = f"{row['cached']} of {row['routed']} routed instances cached"
            if row["missing"]:
                state += f"; MISSING {len(row['missing'])}: {', '.join(row['missing'][:4])}" + (
                    " ..." if len(row["missing"]) > 4 else "")
        print(f"  jit.routed_in_cache {row['arch']} ({cov['shapes']}): {state}")
        if row.get("mismatch"):
            print(f"    why: {row['mismatch']}")


def _ranges(rows: list[dict]) -> list[str]:
    """M ranges with the same pick: 'M 1-4 jit:narrow_r2c72'."""
    out, start = [], None
    for i, row in enumerate(rows):
        if start is None:
            start = row
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        if nxt is None or nxt["pick"] != row["pick"] or nxt["m"] != row["m"] + 1:
            span = f"{start['m']}" if start is row else f"{start['m']}-{row['m']}"
            out.append(f"M {span}: {row['pick']}   ({row['why']})")
            start = None
    return out


def _print_short_ops(dev: dict, driver: str | None) -> None:
    """Per op, what runs by default on ``dev`` (the first eligible backend), and why the ones before it
    do not; a reason the header already gave (the CUDA driver) is not repeated."""
    for op, rows in dev["ops"].items():
        eligible = [r["backend"] for r in rows if r["eligible"]]
        skipped = [f"{r['backend']}: {'the CUDA driver cannot be loaded (above)' if r['reason'] == driver else r['reason']}"
                   for r in rows if not r["eligible"]]
        runs = (f"{eligible[0]}" + (f" (then {', '.join(eligible[1:])})" if len(eligible) > 1 else "")
                if eligible else "nothing eligible")
        print(f"  {op}: {runs}" + (f"   [not: {'; '.join(skipped)}]" if skipped else ""))


def _print_verbose_ops(dev: dict) -> None:
    for op, rows in dev["ops"].items():
        print(f"  {op}")
        for i, row in enumerate(rows, 1):
            state = "eligible" if row["eligible"] else f"no: {row['reason']}"
            print(f"    {i}. {row['backend']:<10} {state}   [{row['note']}]")


def _print_picks(dev: dict) -> None:
    shipped = dev.get("routing_tables", {}).get("shipped")
    if shipped:
        print(f"  shipped table for this GPU: {shipped['device']} ({shipped['rule']})")
    tuned = dev.get("routing_tables", {}).get("tuned")
    if tuned:
        state = f"used, {tuned['entries']} points" if tuned["used"] else \
            "present but refused (see the warning)" if tuned["exists"] else "none (`slim-kernel tune` writes it)"
        print(f"  tuned table: {tuned['path']}: {state}")
    groups: dict = {}
    for row in dev["picks"]:
        groups.setdefault((row["op"], json.dumps(row["shape"]), row["pdl"]), []).append(row)
    if groups:
        print("  routing (the default path per shape and M, and the source that decides it):")
    for (op, shape, pdl), rows in groups.items():
        context = "with PDL: eager, or captured after a PDL-aware kernel" if pdl else \
            "without PDL: captured after a plain kernel"
        sources = sorted({r["source"] + (" (an estimate)" if r["estimate"] and r["source"] != "estimate" else "")
                          for r in rows})
        print(f"    {op} {', '.join(f'{k}={v}' for k, v in json.loads(shape).items())}  [{context}]  "
              f"source: {', '.join(sources)}")
        hint = next((r["tune"] for r in rows if "tune" in r), None)
        if hint and any(r["source"] == "maker-first" for r in rows):
            print(f"      nothing measured on this arch: the kernels made for it serve, ours after `{hint}`")
        elif hint:
            print(f"      estimated, not measured on this device: `{hint}` measures it")
        for line in _ranges(sorted(rows, key=lambda r: r["m"])):
            print(f"      {line}")


def _print_jit(jit: dict, verbose: bool) -> str | None:
    """The JIT runtime lines; returns the driver error (said here once), if any."""
    driver = jit.get("driver")
    if verbose:
        for key, value in jit.items():
            print(f"  jit.{key}: {value}")
    else:
        print(f"  jit: {jit.get('compiler')}; launcher {str(jit.get('launcher')).split(' (')[0]}; "
              f"cache {jit.get('cache_dir')}: {jit.get('cached')}")
        if driver and driver != "ok":
            print(f"  jit cannot launch here: {driver}")
    return driver if driver != "ok" else None


def run(args) -> int:
    from .models import shapes_from_args

    try:
        shapes = shapes_from_args(args)
    except ValueError as exc:
        print(f"slim-kernel info: {exc}")
        return 2
    report, errors = collect(shapes)
    if args.json:
        print(json.dumps(report, indent=2))
        return 2 if errors else 0
    verbose = getattr(args, "verbose", False)
    fp = report["bmm_fp8_fast_path"]
    print(f"slim-kernel {report['slim_kernel']}  python {report['python']}  torch {report['torch']} "
          f"(CUDA {report['torch_cuda']})  flashinfer {report['flashinfer'] or 'not installed'}")
    print(f"  bmm_fp8 fast path: {fp.get('bmm_fp8_fast_path')}" + (f" ({fp['reason']})" if fp.get("reason") else ""))
    driver = _print_jit(report["jit"], verbose)
    _print_coverage(report["jit_cache_coverage"])
    # the short form: the PDL knob (it picks the launch context) and whatever the environment sets
    shown = {k: v for k, v in report["knobs"].items()
             if v is not None and (verbose or k == "pdl" or os.environ.get(k) is not None)}
    print("  knobs: " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    for name, tab in report["routing_tables"].items():
        measured = "; ".join(f"{d['device']}, {d['entries']} points" for d in tab["devices"]) if tab else ""
        print(f"  routing table {name}: " + (f"{tab['source']} ({measured}; flashinfer "
                                             f"{', '.join(tab['flashinfer_versions'])})" if tab else "none"))
    for note in report["notes"]:
        print(f"  note: {note}")
    for dev in report["devices"]:
        extra = f"  {dev['name']} (SM {dev['capability']}, {dev['sms']} SMs)" if "name" in dev else ""
        print(f"\n{dev['device']}{extra}" + ("" if verbose else ": what each op runs by default"))
        if verbose:
            _print_verbose_ops(dev)
        else:
            _print_short_ops(dev, driver)
        _print_picks(dev)
    if not verbose:
        print("\n(`slim-kernel info --verbose`: every backend with its note, every knob, the JIT runtime in full; "
              "`--json`: all of it)")
    for err in errors:
        print(f"\nslim-kernel info: error: {err}")
    return 2 if errors else 0
