"""The backend interface and the one place backends are registered. Torch-free leaf.

A backend is one module under ``slim_kernel/backends/`` whose ``BACKEND`` object implements
:class:`Backend`: its name, the installed version of the library it runs, a cheap probe and the
import of its dependencies, which table candidates it still offers, how its candidates' grids land
on a device (for ``estimate.py``), the candidates ``slim-kernel tune`` times, and the health of
every read of a third-party library's private internals. :data:`REGISTERED` lists the backends in
priority order; the registry, routing, the estimate, tune, info and the benchmark iterate over it
and never name a backend. Importing this module imports no backend: :func:`get` loads one on first use.

A table candidate is ``<backend>`` or ``<backend>:<variant>`` (a JIT configuration, a pinned
library program).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache

# (name, module), in priority order: where nothing was measured, the first eligible one serves
REGISTERED: tuple[tuple[str, str], ...] = (
    ("jit", "slim_kernel.backends.jit"),
    ("flashinfer", "slim_kernel.backends.flashinfer"),
    ("torch", "slim_kernel.backends.torch_ref"),
)
NAMES: tuple[str, ...] = tuple(name for name, _ in REGISTERED)
# each versioned backend's distribution (its version keys the routing tables) and its tag in tuned tables' names
DISTS: dict[str, tuple[str, str]] = {"flashinfer": ("flashinfer-python", "fi")}


def version(name: str) -> str | None:
    """The installed version of backend ``name``'s library (its package metadata: nothing is imported)."""
    from importlib import metadata

    dist = DISTS.get(name)
    if dist is None:
        return None
    try:
        return metadata.version(dist[0])
    except metadata.PackageNotFoundError:
        return None


class Backend:
    """What every backend answers; the defaults fit a backend with no variants and an unknown grid."""

    name = ""
    # True: its kernels are tuned on the archs the routing tables measured; on an arch nothing measured, the
    # backends whose kernels are made for it go first, and this one serves when pinned or after `slim-kernel tune`
    measured_only = False

    def version(self) -> str | None:
        """The installed version of the library this backend runs (None: none, or not installed)."""
        return version(self.name)

    def probe(self) -> str | None:
        """Cheap availability check, no heavy import: None when usable, else why not."""
        return None

    def load(self) -> None:
        """Import what the backend runs (first use; an exception makes it unavailable, with one warning)."""

    def canonical(self, op: str, variant: str | None) -> str | None:
        """The current name of candidate ``variant`` (an older name is an alias of it)."""
        return variant

    def offers(self, op: str, variant: str | None, m: int, nk: tuple[int, int]) -> bool:
        """Whether the candidate ``variant`` (None: the backend's own call) still exists and serves (N, K, M)."""
        return variant is None

    def reader(self, op: str, arch: str):
        """What ``grid``/``body`` may ask of the installed library about its own dispatch on ``arch``
        (None: nothing; the estimate then takes its grid as unknown)."""
        return None

    def grid(self, op: str, variant: str | None, n: int, k: int, m: int, sms: int, reader) -> tuple[int, int] | None:
        """(CTAs, CTAs running at once) of the candidate on ``sms`` SMs, or None where unknown."""
        return None

    def body(self, op: str, variant: str | None, n: int, k: int, m: int, reader) -> str:
        """Which compiled body the candidate runs at (N, K, M): points of another body never stand in."""
        return ""

    def lane_fill(self, op: str, variant: str | None, k: int) -> float:
        """The share of the candidate's lanes that hold data at K (1.0: every lane)."""
        return 1.0

    def margin(self, op: str, variant: str | None, reader) -> float:
        """Log-regret added to the candidate's estimate where its program cannot be known."""
        return 0.0

    def describe(self, op: str, n: int, k: int, m: int, sms: int, reader) -> str | None:
        """A note on what the backend's own call runs at (N, K, M), for the estimate's explanation."""
        return None

    def tune_candidates(self, op: str, target: Callable, args, pdl: bool, prepare: bool, point) -> dict:
        """``{table candidate: fn(output, *inputs)}`` that ``slim-kernel tune`` times for this call (``target``:
        the loaded spec target; ``point``: the tune point, with ``m``, ``shape`` and ``device``)."""
        return {self.name: target(args, None, pdl) if prepare else target}

    def first_use_builds(self, calls, device) -> dict:
        """``{module: loader}`` of what the calls ``(op, m, n, k)`` build on first use (tune runs them first)."""
        return {}

    def health(self) -> list[str]:
        """Reads of a third-party library's private internals that stopped working (``info`` lists them)."""
        return []


@cache
def get(name: str) -> Backend:
    """The registered backend ``name`` (imports its module); KeyError naming the registered ones."""
    module = dict(REGISTERED).get(name)
    if module is None:
        raise KeyError(f"no backend {name!r} is registered (registered: {', '.join(NAMES)})")
    return importlib.import_module(module).BACKEND


def split(candidate: str) -> tuple[str, str | None]:
    """``"jit:skinny"`` -> ``("jit", "skinny")``; ``"torch"`` -> ``("torch", None)``."""
    name, _, variant = candidate.partition(":")
    return name, variant or None


def canonical(op: str, candidate: str) -> str:
    """``candidate`` under its current name (a renamed variant's old name is an alias: ``Backend.canonical``)."""
    name, variant = split(candidate)
    if variant is None or name not in NAMES:
        return candidate
    return f"{name}:{get(name).canonical(op, variant)}"


class Geometry:
    """Every candidate's grid, body, lane fill and margin, asked of its backend: what ``estimate.py`` needs.

    ``readers``: per backend, what it may ask of the installed library (:meth:`Backend.reader`); empty
    where the points the estimate learns from were measured on another release, whose dispatch it was."""

    def __init__(self, readers: dict | None = None):
        self.readers = dict(readers or {})

    @classmethod
    def installed(cls, op: str, arch: str) -> Geometry:
        return cls({name: r for name in NAMES if (r := get(name).reader(op, arch)) is not None})

    def opaque(self) -> Geometry:
        return Geometry() if self.readers else self

    def _at(self, candidate: str):
        name, variant = split(candidate)
        unit = get(name) if name in NAMES else None
        return unit, variant, self.readers.get(name)

    def grid(self, op: str, candidate: str, n: int, k: int, m: int, sms: int) -> tuple[int, int]:
        """(CTAs, CTAs at once); a grid the backend does not know is taken as one CTA per SM."""
        unit, variant, reader = self._at(candidate)
        got = unit.grid(op, variant, n, k, m, sms, reader) if unit else None
        return got if got is not None else (sms, sms)

    def body(self, op: str, candidate: str, n: int, k: int, m: int) -> str:
        unit, variant, reader = self._at(candidate)
        return unit.body(op, variant, n, k, m, reader) if unit else ""

    def lane_fill(self, op: str, candidate: str, k: int) -> float:
        unit, variant, _ = self._at(candidate)
        return unit.lane_fill(op, variant, k) if unit else 1.0

    def margin(self, op: str, candidate: str) -> float:
        unit, variant, reader = self._at(candidate)
        return unit.margin(op, variant, reader) if unit else 0.0

    def describe(self, op: str, n: int, k: int, m: int, sms: int) -> list[str]:
        notes = (get(name).describe(op, n, k, m, sms, reader) for name, reader in self.readers.items())
        return [note for note in notes if note]
