"""Where each call's fastest backend comes from: tuned, shipped and estimated routing tables.

Torch-free. A table holds, per op, shape, M, flashinfer version and launch context (``pdl``), the
measured µs per call of every candidate the registry can run (``jit:<variant>`` for each JIT
configuration of ``jit/catalogue.py``, ``flashinfer`` (``flashinfer:<program>``), ``torch``),
in the decode-step pattern. Selection (``registry.select``) ranks the eligible backends by the
first source that has the call, in this order:

1. **tuned**: the table ``slim-kernel tune`` measured on this device (in the cache directory,
   keyed by device name, SM count and flashinfer version; another device's or version's is never
   read). Its shapes and M exactly; a table that does not parse is refused with one warning.
2. **shipped**: ``tables/routing_<arch>.json``, generated from the committed H200 decode-step runs
   (``benchmark/make_routing.py``): the call's shape exactly, the installed flashinfer version or
   the nearest measured one, the nearest measured M within 8. On a GPU with another SM count the
   shipped numbers are not used as they are (step 3 re-derives them for this SM count); on another
   GPU with the same SM count they are, marked as an estimate.
3. **estimate**: for a shape no table measured (or another SM count), every candidate's µs from a
   rule fitted on all measured shapes of the op (``estimate.py``), marked as an estimate.
4. nothing: the op's priority order.

``slim-kernel info`` says which source decides each shape and M, and that ``slim-kernel tune``
would measure an estimated one.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from dataclasses import dataclass
from functools import cache
from importlib import metadata, resources
from pathlib import Path

SCHEMA = 1
TABLES = "tables"
TUNED_DIR = "routing"  # under the cache directory
MAX_US = 1e6  # a candidate slower than a second per call is not a measurement of these GEMMs
MAX_M = 64
M_REACH = 8  # how far (in M) a measured point stands in for an unmeasured one of the same shape


@dataclass(frozen=True)
class Point:
    op: str
    shape: tuple[tuple[str, object], ...]
    m: int
    flashinfer: str
    pdl: bool
    us: tuple[tuple[str, float], ...]  # candidate -> µs per call, fastest first

    def best(self, backend: str) -> tuple[str | None, float] | None:
        """(variant or None, µs) of ``backend``'s fastest candidate here, or None if unmeasured."""
        for cand, us in self.us:
            name, _, variant = cand.partition(":")
            if name == backend:
                return variant or None, us
        return None

    def describe(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.shape)
        return f"{self.op} {shape} M={self.m} flashinfer {self.flashinfer} pdl={'on' if self.pdl else 'off'}"


@dataclass(frozen=True)
class Decision:
    point: Point
    match: str  # "exact", or what was approximated
    source: str = "shipped"  # "tuned" | "shipped" | "estimate"

    @property
    def estimated(self) -> bool:
        return self.source == "estimate" or "estimate" in self.match

    def why(self, backend: str) -> str:
        best = self.point.best(backend)
        if best is None:
            return f"not measured at {self.point.describe()}"
        variant, us = best
        label = f"{backend}:{variant}" if variant else backend
        what = "predicted" if self.source == "estimate" else f"{self.source} table"
        return f"{label} {us:.2f} us ({what}) at {self.point.describe()} ({self.match})"


@dataclass(frozen=True)
class Device:
    """What selection needs to know of a GPU: its name, SM count and arch (``sm_90``)."""
    name: str
    sms: int
    arch: str


def _shape_items(shape: dict) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(shape.items()))


class Table:
    def __init__(self, data: dict, source: str, kind: str = "shipped"):
        _validate(data, source)
        self.source, self.kind = source, kind
        self.arch = data["arch"]
        self.device = data.get("device", "")
        self.sms = data.get("sms")
        self.generated_by = data.get("generated_by", "")
        self.points = [
            Point(e["op"], _shape_items(e["shape"]), int(e["m"]), e["flashinfer"], bool(e["pdl"]),
                  tuple(sorted(((c, float(u)) for c, u in e["us"].items()), key=lambda cu: (cu[1], cu[0]))))
            for e in data["entries"]
        ]
        self._index = {(p.op, p.shape, p.m, p.flashinfer, p.pdl): p for p in self.points}
        self._ms: dict[tuple, list[int]] = {}
        for p in self.points:
            self._ms.setdefault((p.op, p.shape, p.flashinfer, p.pdl), []).append(p.m)
        self.versions = sorted({p.flashinfer for p in self.points}, key=version_key)

    def shapes(self, op: str) -> list[dict]:
        return [dict(s) for s in dict.fromkeys(p.shape for p in self.points if p.op == op)]

    def lookup(self, op: str, shape: dict, m: int, flashinfer: str | None, pdl: bool,
               inside: bool = False) -> Decision | None:
        """The measured point of this shape: the installed flashinfer version or the nearest one
        measured, the nearest M within M_REACH (``inside``: and M within the measured ones' range);
        None when the shape was not measured."""
        shape_t, own = _shape_items(shape), measured_as(flashinfer)
        for version in self.versions_by_distance(flashinfer):
            ms = self._ms.get((op, shape_t, version, pdl))
            if not ms:
                continue
            near = min(ms, key=lambda x: (abs(x - m), x))
            if abs(near - m) > M_REACH or (inside and not min(ms) <= m <= max(ms)):
                continue
            notes = [] if version == own else [f"flashinfer {flashinfer or 'not installed'}: "
                                                      f"using the {version} measurements"]
            if near != m:
                notes.append(f"M={m} not measured: the nearest measured M={near}")
            return Decision(self._index[(op, shape_t, near, version, pdl)], "; ".join(notes) or "exact", self.kind)
        return None

    def point(self, op: str, shape: dict, m: int, flashinfer: str, pdl: bool) -> Point | None:
        """The point measured at exactly this op, shape, M, flashinfer version and launch context."""
        return self._index.get((op, _shape_items(shape), m, flashinfer, pdl))

    def versions_by_distance(self, flashinfer: str | None) -> list[str]:
        if flashinfer is None:
            return self.versions[::-1]
        want = version_key(measured_as(flashinfer))
        return sorted(self.versions, key=lambda v: (_distance(version_key(v), want), version_key(v)))


def _validate(data, source: str) -> None:
    """ValueError naming what is wrong with a table (a tuned one may be hand-edited or truncated)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{source}: routing table schema {got!r}, expected {SCHEMA}")
    if not isinstance(data.get("arch"), str) or not isinstance(data.get("entries"), list):
        raise ValueError(f"{source}: routing table needs 'arch' (str) and 'entries' (list)")
    for i, e in enumerate(data["entries"]):
        where = f"{source}: entry {i}"
        if not isinstance(e, dict) or not {"op", "shape", "m", "flashinfer", "pdl", "us"} <= set(e):
            raise ValueError(f"{where}: needs op, shape, m, flashinfer, pdl, us")
        if not isinstance(e["op"], str) or not isinstance(e["flashinfer"], str) or not isinstance(e["pdl"], bool):
            raise ValueError(f"{where}: op and flashinfer must be str, pdl a bool")
        if not isinstance(e["shape"], dict) or not all(
                isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**31)
                for v in e["shape"].values()):
            raise ValueError(f"{where}: shape must map names to positive ints or str")
        if not isinstance(e["m"], int) or isinstance(e["m"], bool) or not 1 <= e["m"] <= MAX_M:
            raise ValueError(f"{where}: m must be an int in 1..{MAX_M}")
        us = e["us"]
        if not isinstance(us, dict) or not us or not all(
                isinstance(c, str) and isinstance(u, (int, float)) and not isinstance(u, bool)
                and math.isfinite(u) and 0 < u < MAX_US for c, u in us.items()):
            raise ValueError(f"{where}: us must map candidate names to finite times in (0, {MAX_US:g}) us")


# flashinfer releases that run the very kernels and dispatch of a measured one for these ops read its
# measurements as their own (no "nearest version" note). 0.7.2 and 0.7.2.post1: the tinygemm, router
# GEMM and bmm_fp8 sources, routergemm.py, bmm_fp8's Python and the cuBLAS runner it builds for
# backend="cublas" are identical (file and function hashes: benchmark/results/flashinfer_0.7.2_vs_post1.md).
SAME_KERNELS = {"0.7.2": "0.7.2.post1"}


def measured_as(flashinfer: str | None) -> str | None:
    """The measured flashinfer release whose numbers ``flashinfer`` reads as its own (itself if none)."""
    return SAME_KERNELS.get(flashinfer, flashinfer) if flashinfer else flashinfer


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)) or (0,)


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return sum(abs(x - y) / 100.0 ** i for i, (x, y) in enumerate(zip(a, b)))


# ---- the tables -------------------------------------------------------------------------------

@cache
def table(arch: str) -> Table | None:
    """The shipped table of ``arch`` (``sm_90`` and ``sm_90a`` read ``routing_sm90.json``), or None."""
    name = f"routing_{arch.replace('_', '').removesuffix('a')}.json"
    try:
        ref = resources.files(__package__).joinpath(TABLES, name)
        if not ref.is_file():
            return None
        text = ref.read_text()
    except (FileNotFoundError, ModuleNotFoundError):
        return None
    return Table(json.loads(text), f"slim_kernel/{TABLES}/{name}")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def tuned_path(device: Device, flashinfer: str | None, root: Path | None = None) -> Path:
    """Where ``slim-kernel tune`` keeps this device's table: one file per device name, SM count and
    flashinfer version, so no other device's or version's measurements are ever read."""
    if root is None:
        from .jit.cache import cache_root

        root = cache_root()
    return root / TUNED_DIR / f"{slug(device.name)}-{device.sms}sm-{device.arch}-fi{slug(flashinfer or 'none')}.json"


@cache
def tuned_table(device: Device, flashinfer: str | None) -> Table | None:
    """This device's tuned table, or None (none written; or refused with one warning: a bad file,
    another device's or version's header)."""
    path = tuned_path(device, flashinfer)
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        data = json.loads(text)
        tab = Table(data, str(path), kind="tuned")
        header = (data.get("device"), data.get("sms"), data.get("flashinfer"))
        if header != (device.name, device.sms, flashinfer or "not installed"):
            raise ValueError(f"{path}: measured on {header}, not on this device and flashinfer "
                             f"({device.name}, {device.sms} SMs, {flashinfer or 'not installed'})")
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        warnings.warn(f"slim_kernel: ignoring the tuned routing table: {exc}", RuntimeWarning, stacklevel=2)
        return None
    return tab


def lookup(op: str, shape: dict, m: int, pdl: bool, device: Device) -> Decision | None:
    """The decision for one call (see the module docstring for the order of the sources)."""
    version = flashinfer_version()
    tuned = tuned_table(device, version)
    if tuned is not None:  # what it measured, not past the M range it measured (the shipped table may have those)
        dec = tuned.lookup(op, shape, m, version, pdl, inside=True)
        if dec is not None and dec.point.flashinfer == (version or "not installed"):
            return dec
    shipped = table(device.arch)
    if shipped is None and tuned is None:
        return None
    same_sms = shipped is not None and shipped.sms in (None, device.sms)
    if same_sms:
        dec = shipped.lookup(op, shape, m, version, pdl)
        if dec is not None:
            if shipped.device and shipped.device != device.name:
                note = (f"measured on {shipped.device}, this is {device.name}: an estimate "
                        f"(`slim-kernel tune` measures this device)")
                dec = Decision(dec.point, note if dec.match == "exact" else f"{dec.match}; {note}", dec.source)
            return dec
    return _estimate(op, _shape_items(shape), m, pdl, device, version)


@cache
def _estimate(op: str, shape: tuple, m: int, pdl: bool, device: Device, version: str | None) -> Decision | None:
    from .estimate import estimate

    tables = [t for t in (tuned_table(device, version), table(device.arch)) if t is not None]
    return estimate(op, dict(shape), m, pdl, device, tables, version, flashinfer_tiles(op, device, version))


def flashinfer_tiles(op: str, device: Device, version: str | None):
    """The installed flashinfer's fused-A program tiles (``backends.flashinfer.fused_a_tile``; imports torch
    and flashinfer), or None: another op or arch, no flashinfer, or one that does not import (its backend
    reports that when selection loads it)."""
    from .names import FUSED_A

    if op != FUSED_A or device.arch != "sm_90" or version is None:
        return None
    try:
        from .backends.flashinfer import fused_a_tile
    except Exception:  # noqa: BLE001
        return None
    return fused_a_tile


@cache
def flashinfer_version() -> str | None:
    """The installed flashinfer-python version (read from its metadata: nothing is imported)."""
    try:
        return metadata.version("flashinfer-python")
    except metadata.PackageNotFoundError:
        return None


def reload() -> None:
    """Forget the loaded tables and version (tests, benchmarks, tune writing a new table)."""
    from . import knobs

    table.cache_clear()
    tuned_table.cache_clear()
    _estimate.cache_clear()
    flashinfer_version.cache_clear()
    knobs.bump()
