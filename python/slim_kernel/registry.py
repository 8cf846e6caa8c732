"""Backends, kernel specs and deterministic backend selection.

A :class:`KernelSpec` says which backend can serve an op, where its implementation
lives (imported lazily, on first use), what the device must offer (device type, SM
window) and which calls it accepts (``check``: shape, dtype, layout). Selection is
deterministic: a pinned ``backend=``, else ``SLIM_KERNEL_BACKEND_<OP>``, else the
first eligible spec in the op's priority order. A spec whose implementation fails to
load (no flashinfer, no CUDA compiler) is skipped with one warning, unless pinned.
"""

from __future__ import annotations

import enum
import functools
import importlib
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

__all__ = [
    "BackendUnavailableError",
    "KernelBackend",
    "KernelSpec",
    "register",
    "select",
    "specs_for",
    "explain",
]


class BackendUnavailableError(RuntimeError):
    """A pinned backend cannot serve a call (the message says why)."""


class KernelBackend(str, enum.Enum):
    JIT = "jit"
    FLASHINFER = "flashinfer"
    TORCH = "torch"

    @classmethod
    def parse(cls, value: str | KernelBackend, what: str) -> KernelBackend:
        if isinstance(value, KernelBackend):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            names = ", ".join(repr(b.value) for b in cls)
            raise ValueError(f"{what} must be one of {names} or None, got {value!r}") from None


# A per-call eligibility check gets the op's implementation arguments and returns
# None when the call is supported, else the reason it is not.
CallCheck = Callable[..., "str | None"]


@dataclass(frozen=True)
class KernelSpec:
    op: str
    backend: KernelBackend
    target: str  # "package.module:function", imported on first use
    device_types: frozenset[str] = frozenset({"cuda"})
    min_sm: tuple[int, int] | None = None
    max_sm: tuple[int, int] | None = None  # inclusive
    check: CallCheck | None = None
    # Per-call preference: a reason to let the next backend serve this call (measured to be
    # faster there) although this one could. Skipped by unpinned selection only.
    defer: CallCheck | None = None
    probe: Callable[[], str | None] | None = None  # cheap availability check (no heavy import)
    note: str = ""  # the documented priority rule, shown by `slim-kernel info`
    _loaded: dict = field(default_factory=dict, compare=False, repr=False)

    def device_reason(self, device: torch.device) -> str | None:
        if device.type not in self.device_types:
            return f"needs a {'/'.join(sorted(self.device_types))} device, got {device.type}"
        if device.type == "cuda" and (self.min_sm or self.max_sm):
            sm = _capability(device.index if device.index is not None else torch.cuda.current_device())
            if self.min_sm and sm < self.min_sm:
                return f"needs SM >= {_fmt_sm(self.min_sm)}, device is SM {_fmt_sm(sm)}"
            if self.max_sm and sm > self.max_sm:
                return f"needs SM <= {_fmt_sm(self.max_sm)}, device is SM {_fmt_sm(sm)}"
        return None

    def call_reason(self, args: Sequence) -> str | None:
        return self.check(*args) if self.check is not None else None

    def load(self) -> Callable:
        """Import the implementation. Raises ImportError/RuntimeError when it cannot be used."""
        fn = self._loaded.get("fn")
        if fn is None:
            module_name, _, attr = self.target.partition(":")
            fn = getattr(importlib.import_module(module_name), attr, None)
            if fn is None:
                raise ImportError(f"{self.target} does not exist")
            self._loaded["fn"] = fn
        return fn


_REGISTRY: dict[str, list[KernelSpec]] = {}
_BROKEN: dict[tuple[str, KernelBackend], str] = {}


def register(*specs: KernelSpec) -> None:
    """Append specs to their op's priority list (registration order is priority order)."""
    for spec in specs:
        existing = _REGISTRY.setdefault(spec.op, [])
        if any(s.backend == spec.backend for s in existing):
            raise ValueError(f"{spec.op}: backend {spec.backend.value!r} registered twice")
        existing.append(spec)


def specs_for(op: str) -> list[KernelSpec]:
    return list(_REGISTRY.get(op, ()))


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _fmt_sm(sm: tuple[int, int]) -> str:
    return f"{sm[0]}.{sm[1]}"


def env_var(op: str) -> str:
    return f"SLIM_KERNEL_BACKEND_{op.upper()}"


def pinned_backend(op: str, backend: str | KernelBackend | None) -> KernelBackend | None:
    if backend is not None:
        return KernelBackend.parse(backend, "backend")
    value = os.environ.get(env_var(op))
    if value:
        return KernelBackend.parse(value, env_var(op))
    return None


def _reason(spec: KernelSpec, device: torch.device, args: Sequence) -> str | None:
    broken = _BROKEN.get((spec.op, spec.backend))
    if broken:
        return broken
    return spec.device_reason(device) or spec.call_reason(args)


def _try_load(spec: KernelSpec) -> tuple[Callable | None, str | None]:
    """Import the implementation; on first load also ask the probe (compiler, driver present?)."""
    try:
        first = "fn" not in spec._loaded
        fn = spec.load()
        reason = spec.probe() if first and spec.probe is not None else None
        if reason is None:
            return fn, None
        spec._loaded.pop("fn")
        reason = f"unavailable: {reason}"
    except (ImportError, RuntimeError, OSError) as exc:
        reason = f"unavailable: {type(exc).__name__}: {exc}"
    _BROKEN[(spec.op, spec.backend)] = reason
    return None, reason


def select(op: str, device: torch.device, args: Sequence, backend=None) -> tuple[KernelSpec, Callable]:
    """Return the spec and implementation that serve this call."""
    specs = _REGISTRY.get(op)
    if not specs:
        raise KeyError(f"no backends registered for op {op!r}")
    pinned = pinned_backend(op, backend)
    if pinned is not None:
        spec = next((s for s in specs if s.backend == pinned), None)
        if spec is None:
            raise BackendUnavailableError(f"{op}: backend {pinned.value!r} is not registered for this op")
        reason = _reason(spec, device, args)
        fn = None
        if reason is None:
            fn, reason = _try_load(spec)
        if reason is not None:
            raise BackendUnavailableError(f"{op}: backend {pinned.value!r} cannot serve this call: {reason}")
        return spec, fn
    for spec in specs:
        if _reason(spec, device, args) is not None or (spec.defer is not None and spec.defer(*args)):
            continue
        fn, reason = _try_load(spec)
        if fn is not None:
            return spec, fn
        warnings.warn(f"slim_kernel: {op} backend {spec.backend.value!r} {reason}; falling back",
                      RuntimeWarning, stacklevel=3)
    raise BackendUnavailableError(f"{op}: no backend can serve this call")


def explain(op: str, device: torch.device, args: Sequence | None = None) -> list[tuple[KernelSpec, str | None]]:
    """Each spec of ``op`` with the reason it cannot serve (None = eligible), for `info`."""
    rows = []
    for spec in _REGISTRY.get(op, ()):
        reason = _BROKEN.get((op, spec.backend)) or (spec.probe() if spec.probe else None)
        reason = reason or spec.device_reason(device)
        if reason is None and args is not None:
            reason = spec.call_reason(args)
        rows.append((spec, reason))
    return rows
