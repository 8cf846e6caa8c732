"""`slim-kernel info`: the doctor. Versions, devices, JIT runtime, knobs and pins (validated), per op
which backends can serve and why not, the measured routing table in force and what each op would
pick per shape and M, and the bmm_fp8 fast-path state. Exit 2 when a knob or pin is malformed."""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata

SCHEMA = 1


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON (schema 1)")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _knobs() -> tuple[dict, list[str]]:
    """Every environment knob and pin with its value, and the errors of malformed ones."""
    from . import knobs, registry
    from .backends import jit as jb
    from .jit import runtime
    from .names import FUSED_A, OPS, ROUTER

    values, errors = {"pdl": knobs.pdl_setting()}, []
    if knobs.STATE.error:
        errors.append(knobs.STATE.error)
    for op in OPS:
        try:
            pinned, by = registry.pinned_backend(op, None)
            values[registry.env_var(op)] = pinned.value if pinned else None
        except (TypeError, ValueError) as exc:
            errors.append(str(exc))
    for op in (ROUTER, FUSED_A):
        try:
            rules = jb.rules(op)
            values[jb.env_var(op)] = os.environ.get(jb.env_var(op)) if rules else None
        except ValueError as exc:
            errors.append(str(exc))
    for name in ("SLIM_KERNEL_JIT_COMPILER", "SLIM_KERNEL_CACHE_DIR", "SLIM_KERNEL_FLASHINFER_DIRECT"):
        values[name] = os.environ.get(name)
    try:
        values[runtime.ENV_LAUNCHER] = os.environ.get(runtime.ENV_LAUNCHER)
        runtime.launcher_name()
    except (RuntimeError, ValueError) as exc:
        errors.append(str(exc))
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


PICK_MS = (*range(1, 17), 17, 20, 24, 28, 32, 40, 48, 56, 64)  # the M values the benchmark measures


def _pick_shapes(device) -> list[tuple[str, dict]]:
    """Every listed model's shapes, then any other shape a table (shipped or tuned) measured."""
    from . import models, registry, routing

    shapes = [(s.op, s.key()) for s in models.all_shapes()]
    tables = [routing.table(registry.arch(device)),
              routing.tuned_table(registry.routing_device(device), routing.flashinfer_version())]
    for tab in filter(None, tables):
        for op in (models.ROUTER, models.FUSED_A):
            shapes += [(op, shape) for shape in tab.shapes(op)]
    return list({json.dumps(s, sort_keys=True): s for s in shapes}.values())


def _tune_hint(op: str, shape: dict) -> str:
    from .names import ROUTER

    arg = f"--router {shape['e']},{shape['k']},{shape['out']}" if op == ROUTER else f"--fused-a {shape['n']},{shape['k']}"
    return f"slim-kernel tune {arg}"


def _picks(device) -> list[dict]:
    """What each op would run for every model shape and M, in each launch context the PDL knob
    allows (auto: both; slim_kernel.pdl), which source decided it (tuned, shipped or estimate)
    and why."""
    from . import knobs, registry, routing

    contexts = (True, False) if knobs.pdl_auto() else (knobs.pdl(),)
    version, rows = routing.flashinfer_version(), []
    for op, shape in _pick_shapes(device):
        for pdl in contexts:
            for m in PICK_MS:
                args = _meta_args(op, shape, m)
                order, _, dec = registry.ranked(op, device, args, pdl)
                order = [s for s in order if s.probe is None or s.probe() is None]
                if not order:
                    continue
                spec = order[0]
                best = dec.point.best(spec.backend.value) if dec else None
                choice = f"{spec.backend.value}:{best[0]}" if best and best[0] else spec.backend.value
                row = {"op": op, "shape": shape, "m": m, "flashinfer": version, "pdl": pdl, "pick": choice,
                       "source": dec.source if dec else "priority", "estimate": bool(dec and dec.estimated),
                       "why": registry.why(spec, dec)}
                if row["estimate"] or dec is None:
                    row["tune"] = _tune_hint(op, shape)
                rows.append(row)
    return rows


def _tables(device=None) -> dict:
    from . import registry, routing

    out = {}
    tab = routing.table("sm_90")
    out["sm_90"] = None if tab is None else {
        "source": tab.source, "device": tab.device, "sms": tab.sms, "entries": len(tab.points),
        "flashinfer_versions": tab.versions, "generated_by": tab.generated_by}
    if device is not None:
        rdev = registry.routing_device(device)
        path = routing.tuned_path(rdev, routing.flashinfer_version())
        tuned = routing.tuned_table(rdev, routing.flashinfer_version())
        out["tuned"] = {"path": str(path), "exists": path.exists(), "used": tuned is not None,
                        "entries": len(tuned.points) if tuned else 0}
    return out


def _fast_path() -> dict:
    from .backends.flashinfer_fastpath import fast_path_state

    return fast_path_state(probe=True)


def collect() -> tuple[dict, list[str]]:
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
    return report, errors


def _ranges(rows: list[dict]) -> list[str]:
    """M ranges with the same pick: 'M 1-4 jit:narrow_r2kc'."""
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


def run(args) -> int:
    report, errors = collect()
    if args.json:
        print(json.dumps(report, indent=2))
        return 2 if errors else 0
    fp = report["bmm_fp8_fast_path"]
    print(f"slim-kernel {report['slim_kernel']}  python {report['python']}  torch {report['torch']} "
          f"(CUDA {report['torch_cuda']})  flashinfer {report['flashinfer'] or 'not installed'}")
    print(f"  bmm_fp8 fast path: {fp.get('bmm_fp8_fast_path')}" + (f" ({fp['reason']})" if fp.get("reason") else ""))
    for key, value in report["jit"].items():
        print(f"  jit.{key}: {value}")
    print("  knobs: " + ", ".join(f"{k}={v}" for k, v in report["knobs"].items() if v is not None))
    for name, tab in report["routing_tables"].items():
        print(f"  routing table {name}: " + (f"{tab['source']} ({tab['device']}, {tab['entries']} points, "
                                             f"flashinfer {', '.join(tab['flashinfer_versions'])})" if tab else "none"))
    for dev in report["devices"]:
        extra = f"  {dev['name']} (SM {dev['capability']}, {dev['sms']} SMs)" if "name" in dev else ""
        print(f"\n{dev['device']}{extra}")
        for op, rows in dev["ops"].items():
            print(f"  {op}")
            for i, row in enumerate(rows, 1):
                state = "eligible" if row["eligible"] else f"no: {row['reason']}"
                print(f"    {i}. {row['backend']:<10} {state}   [{row['note']}]")
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
            if hint:
                print(f"      estimated, not measured on this device: `{hint}` measures it")
            for line in _ranges(sorted(rows, key=lambda r: r["m"])):
                print(f"      {line}")
    for err in errors:
        print(f"\nslim-kernel info: error: {err}")
    return 2 if errors else 0
