"""Where each call's fastest backend comes from: tuned, shipped and estimated routing tables.

Torch-free, and it imports no backend, no JIT module and no flashinfer: plain data. A table file
(schema 2) holds measurement groups, each made on one device (name, arch, SM count, measured memory
bandwidth) with one version of each versioned backend's library (``backend.DISTS``), and per op, shape,
M and launch context (``pdl``) the measured µs per call of every candidate the registry can run
(``<backend>`` or ``<backend>:<variant>``: a JIT configuration, a pinned library program), in the
decode-step pattern. Schema 1 (one device, a ``flashinfer`` column per entry: tuned tables written
before) is read as well. Selection (``registry.select``) ranks the eligible backends by the first
source that has the call, in this order:

1. **tuned**: the table ``slim-kernel tune`` measured on this device (in the cache directory, keyed
   by device name, SM count and library versions; another device's or version's is never read). Its
   shapes and M exactly; a table that does not parse is refused with one warning.
2. **shipped**: ``tables/routing_<arch>.json``, generated from the committed decode-step runs
   (``benchmark/make_routing.py``), one table per measured device (the H200 and the H100 on sm_90): this
   device's (by name), else the nearest one of the same SM count (another GPU's numbers: marked as an
   estimate; nearness: ``device_distance``, SM count and memory bandwidth); the call's shape exactly, the
   installed versions or the nearest measured ones, the nearest measured M within 8.
3. **estimate**: for a shape no table measured, or a device no shipped table matches, every
   candidate's µs from the measured shapes of the op (``estimate.py``: placed on this device's SMs; the
   shipped tables nearest device first, a shape of a farther one where the nearer lack it), marked as an
   estimate.
4. nothing: the op's priority order.

``slim-kernel info`` says which source decides each shape and M, and that ``slim-kernel tune``
would measure an estimated one.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from functools import cache
from importlib import resources
from pathlib import Path

from . import backend, knobs, paths
from .decision import Decision, Device, Point, shape_items, versions_text
from .estimate import estimate
from .models import MAX_M

SCHEMA = 2  # v2: measurement groups, each one device and a version per versioned backend; v1 is still read
TABLES = "tables"
TUNED_DIR = "routing"  # under the cache directory
MAX_US = 1e6  # a candidate slower than a second per call is not a measurement of these GEMMs
M_REACH = 8  # how far (in M) a measured point stands in for an unmeasured one of the same shape
NOT_INSTALLED = "not installed"
ENTRY_KEYS = {"op", "shape", "m", "pdl", "us"}
READ_SHARE = 0.89  # of its peak memory bandwidth a GPU reads in the benchmark (H100 0.91, H200 0.88: measured)
DEVICE_KEYS = ("device", "arch", "sms")  # what keys a measurement group's device (memory_gbps: optional, shown)


class Table:
    """The measurements of one device: its points, of every version set measured on it."""

    def __init__(self, header: dict, points: list[Point], source: str, kind: str = "shipped"):
        self.source, self.kind = source, kind
        self.arch = header["arch"]
        self.device = header.get("device") or ""
        self.sms = header.get("sms")
        self.memory_gbps = header.get("memory_gbps")
        self.generated_by = header.get("generated_by", "")
        self.points = points
        self._index = {(p.op, p.shape, p.m, p.versions, p.pdl): p for p in self.points}
        self._ms: dict[tuple, list[int]] = {}
        for p in self.points:
            self._ms.setdefault((p.op, p.shape, p.versions, p.pdl), []).append(p.m)
        self.versions = sorted({p.versions for p in self.points}, key=_versions_order)

    def subset(self, keep) -> Table:
        """This table with only the points ``keep(point)`` accepts (the estimate's leave-one-shape-out scoring)."""
        header = {"arch": self.arch, "device": self.device, "sms": self.sms, "memory_gbps": self.memory_gbps,
                  "generated_by": self.generated_by}
        return Table(header, [p for p in self.points if keep(p)], self.source, self.kind)

    def versions_of(self, name: str) -> list[str]:
        """The versions of backend ``name``'s library this table measured."""
        return sorted({v for key in self.versions for b, v in key if b == name}, key=version_key)

    def shapes(self, op: str) -> list[dict]:
        return [dict(s) for s in dict.fromkeys(p.shape for p in self.points if p.op == op)]

    def lookup(self, op: str, shape: dict, m: int, versions: tuple, pdl: bool,
               inside: bool = False) -> Decision | None:
        """The measured point of this shape: the installed versions or the nearest ones measured, the
        nearest M within M_REACH (``inside``: and M within the measured ones' range); None when the
        shape was not measured."""
        shape_t, versions = shape_items(shape), measured_as_set(versions)
        for key in self.versions_by_distance(versions):
            ms = self._ms.get((op, shape_t, key, pdl))
            if not ms:
                continue
            near = min(ms, key=lambda x: (abs(x - m), x))
            if abs(near - m) > M_REACH or (inside and not min(ms) <= m <= max(ms)):
                continue
            have = dict(key)
            notes = [f"{name} {want}: using the {have.get(name)} measurements"
                     for name, want in versions if have.get(name, want) != want]
            if near != m:
                notes.append(f"M={m} not measured: the nearest measured M={near}")
            return Decision(self._index[(op, shape_t, near, key, pdl)], "; ".join(notes) or "exact", self.kind)
        return None

    def point(self, op: str, shape: dict, m: int, versions: tuple, pdl: bool) -> Point | None:
        """The point measured at exactly this op, shape, M, version set and launch context."""
        return self._index.get((op, shape_items(shape), m, versions, pdl))

    def versions_by_distance(self, versions: tuple) -> list[tuple]:
        """The measured version sets, nearest the installed ``versions`` first (a library not installed:
        its newest measured version first)."""
        want = dict(versions)

        def order(key):
            dist, newest = 0.0, []
            for name, have in key:
                wanted = want.get(name, NOT_INSTALLED)
                if wanted == NOT_INSTALLED:
                    newest += [-x for x in version_key(have)]
                else:
                    dist += _distance(version_key(have), version_key(wanted))
                    newest += list(version_key(have))
            return dist, newest
        return sorted(self.versions, key=order)


def _versions_order(key: tuple) -> list:
    return [(name, version_key(version)) for name, version in key]


def parse(data, source: str, kind: str = "shipped") -> list[Table]:
    """The tables (one per device) of a routing-table file, v2 or v1; ValueError naming what is wrong
    (a tuned one may be hand-edited or truncated)."""
    if not isinstance(data, dict) or data.get("schema") not in (1, SCHEMA):
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{source}: routing table schema {got!r}, expected 1 or {SCHEMA}")
    found = _groups_v1(data, source) if data["schema"] == 1 else data.get("measurements")
    if not isinstance(found, list):
        raise ValueError(f"{source}: routing table needs 'measurements' (list)")
    by_device: dict[tuple, tuple[dict, list[Point]]] = {}
    for g, group in enumerate(found):
        where = f"{source}: measurements[{g}]"
        if not isinstance(group, dict) or not isinstance(group.get("arch"), str) \
                or not isinstance(group.get("entries"), list):
            raise ValueError(f"{where}: needs 'arch' (str) and 'entries' (list)")
        versions = group.get("versions", {})
        if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in versions.items()):
            raise ValueError(f"{where}: versions must map backend names to version strings")
        key = tuple(sorted(versions.items()))
        header = {k: group.get(k) for k in DEVICE_KEYS}
        _, points = by_device.setdefault(tuple(header.values()), (
            {**header, "memory_gbps": group.get("memory_gbps"), "generated_by": data.get("generated_by", "")}, []))
        for i, e in enumerate(group["entries"]):
            _validate_entry(e, f"{where}: entry {i}")
            points.append(Point(e["op"], shape_items(e["shape"]), int(e["m"]), key, bool(e["pdl"]),
                                tuple(sorted(((c, float(u)) for c, u in e["us"].items()),
                                             key=lambda cu: (cu[1], cu[0])))))
    return [Table(header, points, source, kind) for header, points in by_device.values()]


def groups(data: dict) -> list[dict]:
    """The measurement groups of a (parsed-valid) v2 or v1 table (a v1 table: one per flashinfer version)."""
    return data["measurements"] if data.get("schema") == SCHEMA else _groups_v1(data, "")


def flat_entries(data: dict) -> list[dict]:
    """Every entry of a (parsed-valid) v2 or v1 table, each with its ``versions`` key (``((backend, version), ...)``)."""
    return [{**{k: v for k, v in e.items() if k in ENTRY_KEYS}, "versions": tuple(sorted(g.get("versions", {}).items()))}
            for g in groups(data) for e in g["entries"]]


def _groups_v1(data: dict, source: str) -> list[dict]:
    """A v1 table (one device, a ``flashinfer`` column per entry) as v2 measurement groups."""
    if not isinstance(data.get("arch"), str) or not isinstance(data.get("entries"), list):
        raise ValueError(f"{source}: routing table needs 'arch' (str) and 'entries' (list)")
    groups: dict[str, dict] = {}
    for i, e in enumerate(data["entries"]):
        if not isinstance(e, dict) or not isinstance(e.get("flashinfer"), str):
            raise ValueError(f"{source}: entry {i}: needs op, shape, m, flashinfer (str), pdl, us")
        group = groups.setdefault(e["flashinfer"], {"device": data.get("device", ""), "arch": data["arch"],
                                                    "sms": data.get("sms"), "versions": {"flashinfer": e["flashinfer"]},
                                                    "entries": []})
        group["entries"].append(e)
    return list(groups.values())


def _validate_entry(e, where: str) -> None:
    if not isinstance(e, dict) or not ENTRY_KEYS <= set(e):
        raise ValueError(f"{where}: needs {', '.join(sorted(ENTRY_KEYS))}")
    if not isinstance(e["op"], str) or not isinstance(e["pdl"], bool):
        raise ValueError(f"{where}: op must be a str, pdl a bool")
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
SAME_KERNELS = {"flashinfer": {"0.7.2": "0.7.2.post1"}}


def measured_as(name: str, version: str | None) -> str | None:
    """The measured release of backend ``name``'s library whose numbers ``version`` reads as its own
    (itself if none)."""
    return SAME_KERNELS.get(name, {}).get(version, version) if version else version


def measured_as_set(versions: tuple) -> tuple:
    """An installed version set ``((backend, version), ...)`` as the measured releases it reads."""
    return tuple((name, measured_as(name, version)) for name, version in versions)


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)) or (0,)


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return sum(abs(x - y) / 100.0 ** i for i, (x, y) in enumerate(zip(a, b)))


# ---- the tables -------------------------------------------------------------------------------

@cache
def tables(arch: str) -> tuple[Table, ...]:
    """The shipped tables of ``arch``, one per measured device (``sm_90`` and ``sm_90a`` read
    ``routing_sm90.json``); empty where none ships."""
    name = f"routing_{arch.replace('_', '').removesuffix('a')}.json"
    try:
        ref = resources.files(__package__).joinpath(TABLES, name)
        if not ref.is_file():
            return ()
        text = ref.read_text()
    except (FileNotFoundError, ModuleNotFoundError):
        return ()
    return tuple(parse(json.loads(text), f"slim_kernel/{TABLES}/{name}"))


def shipped_archs() -> list[str]:
    """The archs a shipped table exists for (``sm_90`` for ``routing_sm90.json``)."""
    try:
        names = [ref.name for ref in resources.files(__package__).joinpath(TABLES).iterdir()]
    except (FileNotFoundError, ModuleNotFoundError, NotADirectoryError):
        return []
    found = (re.fullmatch(r"routing_sm(\d+)(\d)\.json", name) for name in names)
    return sorted(f"sm_{m[1]}{m[2]}" for m in found if m)


def table(arch: str) -> Table | None:
    """The first shipped table of ``arch`` (its reference device), or None."""
    found = tables(arch)
    return found[0] if found else None


def shipped_for(device: Device) -> Table | None:
    """The shipped table measured on ``device``: the same device name, else the nearest (``device_distance``)
    of the same SM count (another GPU's numbers: an estimate), else None (the estimate re-derives the
    numbers for its SM count)."""
    found = tables(device.arch)
    same = [t for t in found if t.sms in (None, device.sms)]
    return next((t for t in same if t.device == device.name),
                min(same, key=lambda t: device_distance(device, t), default=None))


def nearest_shipped(device: Device) -> Table | None:
    """The shipped table the estimate learns from first: the device's own, else the nearest one (``device_distance``)."""
    return next(iter(shipped_by_nearness(device)), None)


def shipped_by_nearness(device: Device) -> list[Table]:
    """Every shipped table of the device's arch, ``shipped_for``'s first, then by ``device_distance``: what the
    estimate learns from (a shape the nearer ones lack comes from a farther one)."""
    first = shipped_for(device)
    rest = sorted((t for t in tables(device.arch) if t is not first), key=lambda t: device_distance(device, t))
    return ([first] if first is not None else []) + rest


def device_distance(device: Device, tab: Table) -> float:
    """How far a table's GPU stands from ``device``: |log SM-count ratio| + |log memory-bandwidth ratio| (the
    table's measured read bandwidth over ``READ_SHARE`` against the device's peak), a term dropped where either
    side does not know it; ties keep the table order."""
    far = abs(math.log((tab.sms or device.sms) / device.sms))
    if device.memory_gbps and tab.memory_gbps:
        far += abs(math.log(tab.memory_gbps / READ_SHARE / device.memory_gbps))
    return far


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def tuned_path(device: Device, versions: tuple, root: Path | None = None) -> Path:
    """Where ``slim-kernel tune`` keeps this device's table: one file per device name, SM count and
    version set, so no other device's or version's measurements are ever read."""
    if root is None:
        root = paths.cache_root()
    tags = "".join(f"-{backend.DISTS[name][1]}{slug(v if v != NOT_INSTALLED else 'none')}" for name, v in versions)
    return root / TUNED_DIR / f"{slug(device.name)}-{device.sms}sm-{device.arch}{tags}.json"


@cache
def tuned_table(device: Device, versions: tuple) -> Table | None:
    """This device's tuned table, or None (none written; or refused with one warning: a bad file,
    another device's or version's measurements)."""
    path = tuned_path(device, versions)
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        found = parse(json.loads(text), str(path), kind="tuned")
        mine = (device.name, device.sms)
        for tab in found:
            if (tab.device, tab.sms) != mine or tab.versions != [versions]:
                raise ValueError(f"{path}: measured on {tab.device}, {tab.sms} SMs, "
                                 f"{', '.join(map(versions_text, tab.versions))}: not this device and its libraries "
                                 f"({device.name}, {device.sms} SMs, {versions_text(versions)})")
        if len(found) != 1:
            raise ValueError(f"{path}: holds {len(found)} devices' measurements, not one")
    except (ValueError, TypeError, KeyError, RecursionError) as exc:
        warnings.warn(f"slim_kernel: ignoring the tuned routing table: {exc}", RuntimeWarning, stacklevel=2)
        return None
    return found[0]


def lookup(op: str, shape: dict, m: int, pdl: bool, device: Device) -> Decision | None:
    """The decision for one call (see the module docstring for the order of the sources)."""
    versions = installed_versions()
    tuned = tuned_table(device, versions)
    if tuned is not None:  # what it measured, not past the M range it measured (the shipped table may have those)
        dec = tuned.lookup(op, shape, m, versions, pdl, inside=True)
        if dec is not None and dec.point.versions == versions:
            return dec
    if not tables(device.arch) and tuned is None:
        return None
    shipped = shipped_for(device)
    if shipped is not None:
        dec = shipped.lookup(op, shape, m, versions, pdl)
        if dec is not None:
            if shipped.device and shipped.device != device.name:
                note = (f"measured on {shipped.device}, this is {device.name}: an estimate "
                        f"(`slim-kernel tune` measures this device)")
                dec = Decision(dec.point, note if dec.match == "exact" else f"{dec.match}; {note}", dec.source, True)
            return dec
    return _estimate(op, shape_items(shape), m, pdl, device, versions)


@cache
def _estimate(op: str, shape: tuple, m: int, pdl: bool, device: Device, versions: tuple) -> Decision | None:
    learn = [t for t in (tuned_table(device, versions), *shipped_by_nearness(device)) if t is not None]
    return estimate(op, dict(shape), m, pdl, device, learn, versions, backend.Geometry.installed(op, device.arch))


@cache
def installed_versions() -> tuple:
    """``((backend, version), ...)`` of every versioned backend's installed library (``not installed``
    where absent; read from package metadata: nothing is imported): what the tables are keyed by."""
    return tuple(sorted((name, backend.version(name) or NOT_INSTALLED) for name in backend.DISTS))


def reload() -> None:
    """Forget the loaded tables and version (tests, benchmarks, tune writing a new table)."""
    tables.cache_clear()
    tuned_table.cache_clear()
    _estimate.cache_clear()
    installed_versions.cache_clear()
    knobs.bump()
