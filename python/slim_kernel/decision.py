"""What routing decides with: a measured point, a decision and the device it is for. Torch-free leaf."""

from __future__ import annotations

from dataclasses import dataclass

Versions = tuple  # ((backend, version), ...): the library versions a measurement was made with, sorted


def versions_text(versions: Versions) -> str:
    return ", ".join(f"{name} {version}" for name, version in versions) or "no versioned backend"


@dataclass(frozen=True)
class Point:
    """One measured (or estimated) routing-table point: every candidate's µs per call."""
    op: str
    shape: tuple[tuple[str, object], ...]
    m: int
    versions: Versions
    pdl: bool
    us: tuple[tuple[str, float], ...]  # candidate -> µs per call, fastest first

    def version(self, backend: str) -> str | None:
        """The version of ``backend``'s library this point was measured with (None: not versioned)."""
        return dict(self.versions).get(backend)

    def best(self, backend: str) -> tuple[str | None, float] | None:
        """(variant or None, µs) of ``backend``'s fastest candidate here, or None if unmeasured."""
        for cand, us in self.us:
            name, _, variant = cand.partition(":")
            if name == backend:
                return variant or None, us
        return None

    def describe(self) -> str:
        shape = ", ".join(f"{k}={v}" for k, v in self.shape)
        return f"{self.op} {shape} M={self.m} {versions_text(self.versions)} pdl={'on' if self.pdl else 'off'}"


@dataclass(frozen=True)
class Decision:
    point: Point
    match: str  # "exact", or what was approximated
    source: str = "shipped"  # "tuned" | "shipped" | "estimate"

    estimated: bool = False  # True: not measured on this device at this shape (an estimate or another GPU's numbers)

    def why(self, backend: str) -> str:
        best = self.point.best(backend)
        if best is None:
            return f"not measured at {self.point.describe()}"
        variant, us = best
        label = f"{backend}:{variant}" if variant else backend
        what = "predicted" if self.source == "estimate" else f"{self.source} table"
        return f"{label} {us:.2f} us ({what}) at {self.point.describe()} ({self.match})"


# Peak memory bandwidth (GB/s) of GPUs by name, where torch does not report memory clock and bus width:
# the estimate's nearness of a GPU to the measured ones (the first name contained in the device's wins).
MEMORY_GBPS = {"H100 PCIe": 2000, "H100 NVL": 3900, "H100": 3350, "H800": 3350, "H20": 4000, "H200": 4800,
               "GH200": 4000,
               "GH200 144G": 4900}


def memory_gbps(name: str, clock_khz: int = 0, bus_bits: int = 0) -> float | None:
    """A GPU's peak memory bandwidth in GB/s: from its memory clock and bus width where known (double data
    rate), else ``MEMORY_GBPS`` by name, else None."""
    if clock_khz > 0 and bus_bits > 0:
        return round(2 * clock_khz * 1e3 * bus_bits / 8 / 1e9)
    return next((gbps for key, gbps in sorted(MEMORY_GBPS.items(), key=lambda kv: -len(kv[0])) if key in name), None)


@dataclass(frozen=True)
class Device:
    """What selection needs to know of a GPU: its name, SM count, arch (``sm_90``) and peak memory bandwidth
    (GB/s; None where unknown): what decides which measurements stand nearest its own."""
    name: str
    sms: int
    arch: str
    memory_gbps: float | None = None


def shape_items(shape: dict) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(shape.items()))
