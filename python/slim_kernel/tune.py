"""`slim-kernel tune`: measure the fastest path on this GPU for your shapes, and route by it.

    slim-kernel tune [--model NAME ...] [--router E,K[,out] ...] [--fused-a N,K ...] [--ms 1-16]

For every shape and M it times, on the GPU at hand and in the decode-step pattern
(``timing.py``: CUDA graphs, each GEMM after the kernel that writes its activation, weights
rotated over more than twice the L2), every candidate selection could pick for the call: each
JIT configuration that serves it, flashinfer (and its pinned fused-A programs) where installed
and eligible, and the torch backend, in both launch contexts (``pdl: false`` after a plain
kernel, without PDL; ``pdl: true`` after flashinfer's PDL-aware RMSNorm, with PDL: measured only
where flashinfer is installed). Each candidate is checked against float64 before it is timed.
The table goes to the cache directory (``routing.tuned_path``: keyed by device name, SM count
and flashinfer version), merged with the shapes tuned before, written atomically at the end: an
interrupted or failed run leaves the previous table in force. Selection prefers it over the
shipped table from then on (in new processes, and in this one).

The shipped table is this same measurement on an H200 for the models of ``models.py``
(``benchmark/bench_gemm.py`` adds the anchors selection cannot run, such as sglang's kernels).

Exit status: 0 table written; 1 nothing could be measured; 2 bad arguments or no usable GPU.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import models
from .models import MAX_M

FP32_TOL, BF16_TOL = 1e-5, 5e-3


class NoGPUError(RuntimeError):
    """No CUDA GPU to measure on (exit 2)."""


class NothingMeasured(RuntimeError):
    """No candidate could be measured at any point (exit 1)."""


def add_arguments(parser) -> None:
    models.add_shape_arguments(parser)
    parser.add_argument("--ms", default="1-16", help=f"M values, e.g. 1-16 or 1,2,4,8,16,32,64 (<= {MAX_M})")
    parser.add_argument("--device", default=None, help="CUDA device (default: the current one)")
    parser.add_argument("--cache-dir", help="cache directory the table goes to (default: $SLIM_KERNEL_CACHE_DIR "
                                            "or the user cache dir)")
    parser.add_argument("--no-progress", action="store_true", help="no progress line (only on a terminal anyway)")


def parse_ms(text: str) -> list[int]:
    ms: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"--ms wants numbers and ranges like 1-16,32, got {text!r}")
        ms.update(range(int(lo), int(hi or lo) + 1))
    if not ms or min(ms) < 1 or max(ms) > MAX_M:
        raise ValueError(f"--ms must name M values in 1..{MAX_M}, got {text!r}")
    return sorted(ms)


def shapes_from_args(args) -> list[models.Shape]:
    shapes = models.shapes_from_args(args)
    if not shapes:
        raise ValueError("name at least one --model, --router or --fused-a")
    return shapes


# ---- one point: inputs, candidates, checks ----------------------------------------------------

class Workload:
    """One (shape, M) on one device: the activation, output and rotating weight copies."""

    def __init__(self, shape: models.Shape, m: int, device, gen):
        import torch

        from . import timing

        self.shape, self.m, self.device = shape, m, device
        self.out_dtype = getattr(torch, shape.out)
        self.x = torch.empty(m, shape.k, device=device, dtype=torch.bfloat16)
        self.out = torch.empty(m, shape.n, device=device, dtype=self.out_dtype)
        w = torch.randn(shape.n, shape.k, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)
        self.weights = timing.rotating(w, timing.copies_for(w.numel() * 2, True, device))
        self.producers = timing.producers(self.x, gen)

    def weight_arg(self, w):
        """The op's weight argument: router (E, K) as is, fused-A the (K, N) column-major view."""
        return w if self.shape.op == models.ROUTER else w.t()

    def args(self, w=None):
        return self.out, self.x, self.weight_arg(self.weights[0] if w is None else w)

    def calls(self, fn) -> list:
        """One call per weight copy, ``fn(output, *inputs)`` bound as the op would run it."""
        out, x = self.out, self.x
        return [lambda w=w: fn(out, x, w) for w in map(self.weight_arg, self.weights)]

    def error(self, fn) -> float:
        """Relative error of ``fn`` against float64 on fresh activations, output poisoned first
        (``fn``'s result where it returns one: an anchor that allocates its output)."""
        import torch

        self.producers["plain"]()
        self.out.fill_(float("nan"))
        res = fn(*self.args())
        torch.cuda.synchronize(self.device)
        res = res if isinstance(res, torch.Tensor) and res.shape == self.out.shape else self.out
        ref = self.x.double() @ self.weights[0].double().t()
        return ((res.double() - ref).norm() / ref.norm()).item()

    def tolerance(self) -> float:
        return FP32_TOL if self.shape.out == "float32" else BF16_TOL


def candidates(point: Workload, pdl: bool) -> dict:
    """``{table candidate name: fn(output, *inputs)}``: what selection could run for this call in
    this launch context, each bound as its backend binds it (``Backend.tune_candidates``)."""
    from . import backend, ops, registry  # noqa: F401  (importing ops registers the backends)

    op, args, out = point.shape.op, point.args(), {}
    specs, _, _ = registry.ranked(op, point.x.device, args, pdl)
    for spec in specs:
        target = registry.load(spec)
        if target is not None:
            out.update(backend.get(spec.backend.value).tune_candidates(op, target, args, pdl, spec.prepare, point))
    return out


def read_confirmed(point: Workload, step, pdl: bool, fns: dict, notes: list[str]) -> dict[str, float]:
    """``{name: µs per call}`` of ``fns`` (``{name: fn(output, *inputs)}``) after ``step``'s producer, the
    fastest two confirmed (:func:`confirmed`). A reading below what the weight bytes take at peak DRAM
    bandwidth (in the PDL context: less the producer, which the GEMM may overlap) cannot be right and is
    taken again, twice at most; a name that keeps reading below it is left out with a note."""
    from .timing import peak_dram_bytes_per_s

    weight_us = point.shape.n * point.shape.k * 2 / (peak_dram_bytes_per_s(point.device) or math.inf) * 1e6

    def read(name) -> float:
        for _ in range(3):
            us = step.time(point.calls(fns[name]))
            if us >= weight_us - (step.producer_us if pdl else 0.0):
                return us
        return math.inf

    times = {}
    for name, us in confirmed({name: [read(name)] for name in fns}, read).items():
        if math.isinf(us):
            notes.append(f"{point.shape.label()} M={point.m} {name}: kept reading below the DRAM floor "
                         f"({weight_us:.2f} us for its weights): left out")
        else:
            times[name] = round(us, 3)
    return times


def measure(point: Workload, pdl: bool, notes: list[str], step=None, skip: frozenset = frozenset()) -> dict[str, float]:
    """µs per call of every correct candidate at ``point`` in one launch context (the PDL-aware
    producer with PDL launches, or the plain one without). ``step``: that producer's
    ``timing.DecodeStep`` when the caller times more after it (made here otherwise). ``skip``: candidate
    names never launched, nor any name that launches the same kernel (one that traps would leave the
    process's CUDA context unusable)."""
    from .timing import DecodeStep

    producer = point.producers.get("pdl" if pdl else "plain")
    if producer is None:
        return {}
    step = step or DecodeStep(producer, len(point.weights))
    named = candidates(point, pdl)
    skipped = {fn for name, fn in named.items() if name in skip}
    named = {name: fn for name, fn in named.items() if fn not in skipped}
    first = {}  # fn -> its first name: a kernel several names launch is checked and timed once
    for name, fn in named.items():
        first.setdefault(fn, name)
    errors = {fn: point.error(fn) for fn in first}
    us = read_confirmed(point, step, pdl, {name: fn for fn, name in first.items()
                                           if errors[fn] <= point.tolerance()}, notes)
    times = {}
    for name, fn in named.items():
        if errors[fn] > point.tolerance():
            notes.append(f"{point.shape.label()} M={point.m} {name}: relative error {errors[fn]:.3g}, not timed")
        elif first[fn] in us:
            times[name] = us[first[fn]]
    return times


def confirmed(readings: dict, retime, top: int = 2, reads: int = 3) -> dict:
    """Median µs per candidate, where the ``top`` fastest have ``reads`` readings each: one reading
    is a difference of two medians, and a clock step during one replay can make it far too low
    (6.8 µs once for a kernel that reads 9.5 µs at the M beside it), so no single lucky reading
    decides a pick. Re-ranks after each confirmation until the fastest ``top`` are all confirmed."""
    med = lambda fn: statistics.median(readings[fn])  # noqa: E731
    while pending := [fn for fn in sorted(readings, key=med)[:top] if len(readings[fn]) < reads]:
        for fn in pending:
            readings[fn] += [retime(fn) for _ in range(reads - len(readings[fn]))]
    return {fn: med(fn) for fn in readings}


# ---- the table ---------------------------------------------------------------------------------

def write_table(path: Path, header: dict, entries: list[dict]) -> dict:
    """Merge ``entries`` into the table at ``path`` (same op, shape, M and context replaced) and write it
    atomically (schema 2: one measurement group, ``header``'s device and versions; a v1 table there is
    read too); the written data is validated as selection would read it first."""
    from . import routing

    old = []
    try:
        previous = json.loads(path.read_text())
        routing.parse(previous, str(path))
        old = [{k: v for k, v in e.items() if k in routing.ENTRY_KEYS} for e in routing.flat_entries(previous)]
    except (OSError, ValueError, TypeError, KeyError):
        pass  # no table yet, or one selection refuses anyway: start afresh
    key = lambda e: (e["op"], json.dumps(e["shape"], sort_keys=True), e["m"], e["pdl"])  # noqa: E731
    merged = {key(e): e for e in old}
    merged.update((key(e), e) for e in entries)
    group = {k: header[k] for k in (*routing.DEVICE_KEYS, "versions")}
    group["entries"] = sorted(merged.values(), key=lambda e: (e["op"], sorted(e["shape"].items()), e["m"], not e["pdl"]))
    data = {"schema": routing.SCHEMA, "generated_by": header.get("generated_by", ""), "measurements": [group]}
    routing.parse(data, str(path), kind="tuned")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tune-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return data


def prebuild(points: list[tuple[models.Shape, int]], device) -> None:
    """Everything the (shape, M) points' candidates build on first use (``Backend.first_use_builds``: the JIT
    instances, flashinfer's modules), side by side before anything is timed (threads: each waits on a
    compiler). A module that fails to build here fails again at its candidate's first call, which reports it."""
    from concurrent.futures import ThreadPoolExecutor

    from . import backend

    calls = [(s.op, m, s.n, s.k, s.out) for s, m in points]
    loaders: dict = {}
    for name in backend.NAMES:
        unit = backend.get(name)
        if unit.probe() is None:
            try:
                loaders.update(unit.first_use_builds(calls, device))
            except ImportError:
                pass
    with ThreadPoolExecutor(max(1, len(loaders)), thread_name_prefix="tune-build") as pool:
        for build in [pool.submit(load) for load in loaders.values()]:
            build.exception()


def tune(shapes: list[models.Shape], ms: list[int], device=None, progress: bool = True) -> tuple[Path, dict, list]:
    """Measure ``shapes`` at ``ms`` on ``device`` and write the tuned table; returns (path, table, notes)."""
    import torch

    from . import devices, routing

    if not torch.cuda.is_available():
        raise NoGPUError("slim-kernel tune needs a CUDA GPU (torch sees none)")
    try:
        dev = torch.device(device) if device is not None else torch.device("cuda")
    except RuntimeError as exc:
        raise ValueError(f"--device: {exc}") from None
    if dev.type != "cuda" or (dev.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device must name one of the {torch.cuda.device_count()} CUDA devices, got {device!r}")
    dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    rdev = devices.routing_device(dev)
    versions = routing.installed_versions()
    notes: list[str] = []
    gen = torch.Generator(device=dev).manual_seed(0)
    entries = []
    with torch.cuda.device(dev):
        points = [Workload(s, m, dev, gen) for s in shapes for m in ms]
        if "pdl" not in points[0].producers:
            notes.append("flashinfer is not installed: only the plain-producer context (pdl: false) was measured")
        prebuild([(p.shape, p.m) for p in points], dev)
        total, start = len(points), time.perf_counter()
        for i, point in enumerate(points, 1):
            for pdl in (True, False):
                us = measure(point, pdl, notes)
                if us:
                    entries.append({"op": point.shape.op, "shape": point.shape.key(), "m": point.m, "pdl": pdl,
                                    "us": us})
            if progress and sys.stderr.isatty():
                print(f"\rtune: {i}/{total} points, {time.perf_counter() - start:.0f} s", end="", file=sys.stderr)
        if progress and sys.stderr.isatty():
            print(file=sys.stderr)
    if not entries:
        raise NothingMeasured("nothing could be measured: " + "; ".join(notes or ["no candidate"]))
    header = {"arch": rdev.arch, "device": rdev.name, "sms": rdev.sms, "versions": dict(versions),
              "generated_by": "slim-kernel tune " + " ".join(s.label() for s in shapes)}
    path = routing.tuned_path(rdev, versions)
    data = write_table(path, header, entries)
    routing.reload()
    return path, data, notes


def pick_costs(entries: list[dict], table) -> list[float]:
    """At each entry (``routing.flat_entries``) ``table`` (a ``routing.Table``) measured too (same op, shape, M,
    launch context and versions): the entry's time of the table's pick (what selection would run by it) over
    the entry's fastest. 1.0 where they agree (or pick kernels timed as one). Candidates compare under their
    current names (a table written before a variant's rename names it by its alias)."""
    from .backend import canonical

    costs = []
    for e in entries:
        point = table.point(e["op"], e["shape"], e["m"], e["versions"], e["pdl"])
        mine = {canonical(e["op"], cand): us for cand, us in e["us"].items()}
        pick = next((c for c in (canonical(e["op"], cand) for cand, _ in point.us) if c in mine), None) if point else None
        if pick:
            costs.append(mine[pick] / min(mine.values()))
    return costs


def describe_costs(costs: list[float], other: str) -> str:
    return (f"the same pick as {other} at {sum(c == 1 for c in costs)} of {len(costs)} points; its pick at most "
            f"{max(costs):.2f}x this one's ({sum(c > 1.02 for c in costs)} points over 1.02x)")


def against_shipped(entries: list[dict], arch: str, device=None) -> str | None:
    """How the tuned picks compare with the shipped table's where both measured (``device``'s group, the one
    selection reads on it; else the arch's reference device's): how often they agree, and what the shipped
    pick (what selection ran before this tune) costs by the tuned times."""
    from . import routing

    shipped = routing.nearest_shipped(device) if device is not None else routing.table(arch)
    costs = pick_costs(entries, shipped) if shipped else []
    return describe_costs(costs, f"the shipped table ({shipped.device})") if costs else None


def run(args) -> int:
    try:
        shapes = shapes_from_args(args)
        ms = parse_ms(args.ms)
    except ValueError as exc:
        print(f"slim-kernel tune: {exc}", file=sys.stderr)
        return 2
    if args.cache_dir:
        from .knobs import ENV_CACHE_DIR

        os.environ[ENV_CACHE_DIR] = args.cache_dir
    start = time.perf_counter()
    try:
        path, data, notes = tune(shapes, ms, args.device, not args.no_progress)
    except (ValueError, NoGPUError) as exc:
        print(f"slim-kernel tune: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # NothingMeasured, or a candidate's failure
        print(f"slim-kernel tune: {exc}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    from . import routing

    group = data["measurements"][0]
    comparison = against_shipped(routing.flat_entries(data), group["arch"],
                                 routing.Device(group["device"], group["sms"], group["arch"]))
    print(f"tune: {len(shapes)} shapes x {len(ms)} M measured in {time.perf_counter() - start:.0f} s; "
          f"{len(data['measurements'][0]['entries'])} points in {path}" + (f"; {comparison}" if comparison else ""))
    return 0
