"""Backends, kernel specs and deterministic backend selection.

A :class:`KernelSpec` says which backend can serve an op, where its implementation lives
(imported lazily, on first use), what the device must offer (device type, SM window) and which
calls it accepts (``check``: shape, dtype, layout). Selection is deterministic:

1. a pinned ``backend=``, else ``SLIM_KERNEL_BACKEND_<OP>``: that backend or a clear error;
2. else, among the eligible specs, the one fastest for this call by the routing tables
   (``routing.py``: the device's tuned table, the shipped table of its arch, an estimate for
   shapes neither measured; ops register their shape key with :func:`register_op`), the JIT
   backend with the configuration fastest there;
3. where no table says anything, the first eligible spec in the op's priority order; on an arch
   nothing measured (no shipped or tuned table: sm_100, sm_120 today) a backend whose kernels are
   made for every arch (``Backend.measured_only`` False: flashinfer, torch) before one tuned on the
   measured archs (the JIT), which then serves only when pinned or after ``slim-kernel tune``.

A spec whose implementation fails to load (no flashinfer, no CUDA compiler, a broken install)
is skipped with one warning, unless pinned. A spec's ``target`` is either the implementation
``fn(output, *inputs)`` or, with ``prepare=True``, a factory ``prepare(args, variant, pdl) -> fn``
called once per call signature (the op layer caches what :func:`select` returns).
"""

from __future__ import annotations

import enum
import functools
import importlib
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from . import backend, devices, knobs, routing
from .errors import BackendUnavailableError, CallNotServed

__all__ = [
    "BackendUnavailableError",
    "CallNotServed",
    "KernelBackend",
    "KernelSpec",
    "Selection",
    "register",
    "register_op",
    "select",
    "explain",
    "load",
    "pick_label",
]


class _Names(str, enum.Enum):
    @classmethod
    def parse(cls, value, what: str) -> KernelBackend:
        if isinstance(value, KernelBackend):
            return value
        if not isinstance(value, str):
            raise TypeError(f"{what} must be a str (one of {cls.names()}) or None, got {type(value).__name__}")
        try:
            return cls(value.strip().lower())
        except ValueError:
            raise ValueError(f"{what} must be one of {cls.names()} or None, got {value!r}") from None

    @classmethod
    def names(cls) -> str:
        return ", ".join(repr(b.value) for b in cls)


# the registered backends (slim_kernel/backend.py REGISTERED), in priority order: KernelBackend.JIT, ...
KernelBackend = _Names("KernelBackend", [(name.upper(), name) for name in backend.NAMES])


# A per-call eligibility check gets the op's implementation arguments and returns None when
# the call is supported, else the reason it is not.
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
    probe: Callable[[], str | None] | None = None  # cheap availability check (no heavy import)
    prepare: bool = False  # target is prepare(args, variant, pdl) -> fn (pdl None: the knob)
    note: str = ""  # what the backend runs, shown by `slim-kernel info`

    def device_reason(self, device: torch.device) -> str | None:
        if device.type not in self.device_types:
            return f"needs a {'/'.join(sorted(self.device_types))} device, got {device.type}"
        if device.type == "cuda" and (self.min_sm or self.max_sm):
            sm = capability(device)
            if self.min_sm and sm < self.min_sm:
                return f"needs SM >= {_fmt_sm(self.min_sm)}, device is SM {_fmt_sm(sm)}"
            if self.max_sm and sm > self.max_sm:
                return f"needs SM <= {_fmt_sm(self.max_sm)}, device is SM {_fmt_sm(sm)}"
        return None

    def call_reason(self, args: Sequence) -> str | None:
        return self.check(*args) if self.check is not None else None


@dataclass(frozen=True)
class Selection:
    spec: KernelSpec
    fn: Callable  # fn(output, *inputs)
    why: str


_REGISTRY: dict[str, list[KernelSpec]] = {}
_SHAPE_KEYS: dict[str, Callable] = {}  # op -> args -> (routing shape dict, m)
_IMPLS: dict[tuple[str, KernelBackend], Callable] = {}  # loaded targets
_BROKEN: dict[tuple[str, KernelBackend], str] = {}  # targets that failed to load, and why


def register(*specs: KernelSpec) -> None:
    """Append specs to their op's priority list (registration order is priority order)."""
    for spec in specs:
        existing = _REGISTRY.setdefault(spec.op, [])
        if any(s.backend == spec.backend for s in existing):
            raise ValueError(f"{spec.op}: backend {spec.backend.value!r} registered twice")
        existing.append(spec)


def register_op(op: str, shape_key: Callable) -> None:
    """How to find a call of ``op`` in the routing tables: ``shape_key(*args) -> (shape dict, m)``."""
    _SHAPE_KEYS[op] = shape_key


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def capability(device: torch.device) -> tuple[int, int]:
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def arch(device: torch.device) -> str:
    major, minor = capability(device)
    return f"sm_{major}{minor}"


def _fmt_sm(sm: tuple[int, int]) -> str:
    return f"{sm[0]}.{sm[1]}"


env_var = knobs.backend_var  # SLIM_KERNEL_BACKEND_<OP>


def pinned_backend(op: str, backend) -> tuple[KernelBackend | None, str]:
    """The pinned backend (``backend=`` first, then the environment) and who pinned it."""
    if backend is not None:
        return KernelBackend.parse(backend, "backend"), "backend="
    value = os.environ.get(env_var(op))
    if value:
        return KernelBackend.parse(value, env_var(op)), env_var(op)
    return None, ""


def _reason(spec: KernelSpec, device: torch.device, args: Sequence) -> str | None:
    return _BROKEN.get((spec.op, spec.backend)) or spec.device_reason(device) or spec.call_reason(args)


def _load(spec: KernelSpec) -> tuple[Callable | None, str | None]:
    """The implementation, or (None, why). On first load the probe also runs; any failure of an
    optional dependency (a broken flashinfer raising AttributeError at import, say) is a reason."""
    key = (spec.op, spec.backend)
    fn = _IMPLS.get(key)
    if fn is not None:
        return fn, None
    if key in _BROKEN:
        return None, _BROKEN[key]
    try:
        reason = spec.probe() if spec.probe is not None else None
        if reason is None:
            module_name, _, attr = spec.target.partition(":")
            fn = getattr(importlib.import_module(module_name), attr, None)
            if fn is None:
                reason = f"{spec.target} does not exist"
            else:
                backend.get(spec.backend.value).load()  # the library it runs (a broken install fails here)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a broken backend install is unavailable, not fatal
        fn, reason = None, f"{type(exc).__name__}: {exc}"
    if reason is not None:
        reason = _BROKEN[key] = f"unavailable: {reason}"
        return None, reason
    _IMPLS[key] = fn
    return fn, None


def load(spec: KernelSpec) -> Callable | None:
    """The spec's implementation (its ``prepare`` factory where it has one), or None if it cannot load."""
    return _load(spec)[0]


def decision(op: str, device: torch.device, args: Sequence, pdl: bool | None = None) -> routing.Decision | None:
    """The routing decision for this call (tuned, shipped or estimated), or None (no table says
    anything). ``pdl``: the launch context (slim_kernel.pdl.launch_pdl; default: the knob)."""
    shape_key = _SHAPE_KEYS.get(op)
    if shape_key is None or device.type != "cuda":
        return None
    shape, m = shape_key(*args)
    return routing.lookup(op, shape, m, knobs.pdl() if pdl is None else pdl, devices.routing_device(device))


def _bind(spec: KernelSpec, fn: Callable, args: Sequence, dec: routing.Decision | None, pdl: bool | None) -> Callable:
    if not spec.prepare:
        return fn
    best = dec.point.best(spec.backend.value) if dec is not None else None
    return fn(args, best[0] if best else None, pdl)


def unmeasured_arch(op: str, device: torch.device) -> str | None:
    """The device's arch where nothing measured routed op ``op`` on it (no shipped table of the arch; a
    tuned table gives a decision before this is asked), else None."""
    if op not in _SHAPE_KEYS or device.type != "cuda":
        return None
    name = arch(device)
    return None if routing.tables(name) else name


def order_rule(op: str, device: torch.device, dec: routing.Decision | None) -> str:
    """Which rule ordered the backends: the decision's source, ``maker-first`` or ``priority``."""
    if dec is not None:
        return dec.source
    return "maker-first" if unmeasured_arch(op, device) else "priority"


def _ranked(specs: list[KernelSpec], dec: routing.Decision | None, maker_first: bool = False) -> list[KernelSpec]:
    if dec is None:
        return sorted(specs, key=lambda s: backend.get(s.backend.value).measured_only) if maker_first else specs
    def key(item):
        i, spec = item
        best = dec.point.best(spec.backend.value)
        return (best is None, best[1] if best else 0.0, i)
    return [spec for _, spec in sorted(enumerate(specs), key=key)]


def ranked(op: str, device: torch.device, args: Sequence,
           pdl: bool | None = None) -> tuple[list[KernelSpec], list[str], routing.Decision | None]:
    """The eligible specs in the order selection tries them, why the others are not eligible,
    and the routing-table point that ordered them (None: priority order). Loads nothing."""
    specs = _REGISTRY.get(op)
    if not specs:
        raise KeyError(f"no backends registered for op {op!r}")
    eligible, reasons = [], []
    for spec in specs:
        reason = _reason(spec, device, args)
        if reason is None:
            eligible.append(spec)
        else:
            reasons.append(f"{spec.backend.value}: {reason}")
    dec = decision(op, device, args, pdl) if eligible else None
    return _ranked(eligible, dec, dec is None and unmeasured_arch(op, device) is not None), reasons, dec


def pick_label(spec: KernelSpec, dec: routing.Decision | None) -> str:
    """``backend`` or ``backend:variant`` (the configuration the decision names for it)."""
    best = dec.point.best(spec.backend.value) if dec is not None else None
    return f"{spec.backend.value}:{best[0]}" if best and best[0] else spec.backend.value


def why(spec: KernelSpec, dec: routing.Decision | None, unmeasured: str | None = None) -> str:
    """Why ``spec`` serves; ``unmeasured``: the device's arch where nothing measured the op (:func:`unmeasured_arch`)."""
    if dec is not None and dec.point.best(spec.backend.value):
        what = "estimated" if dec.estimated else "measured"
        return f"{what} fastest of the eligible backends: {dec.why(spec.backend.value)}"
    if dec is None and unmeasured:
        return (f"nothing measured on {unmeasured}: the first eligible backend with kernels made for it (ours run "
                f"there when pinned or after `slim-kernel tune` measures them fastest)")
    return "first eligible in priority order"


def select(op: str, device: torch.device, args: Sequence, backend=None, pdl: bool | None = None) -> Selection:
    """The spec and bound implementation that serve this call, and why. ``pdl``: the launch
    context of a PDL-sensitive op (slim_kernel.pdl.launch_pdl), None for the knob."""
    knobs.check_env()
    pinned, by = pinned_backend(op, backend)
    if pinned is not None:
        spec = next((s for s in _REGISTRY.get(op, ()) if s.backend == pinned), None)
        if spec is None:
            raise BackendUnavailableError(f"{op}: backend {pinned.value!r} is not registered for this op")
        reason = _reason(spec, device, args)
        fn = None
        if reason is None:
            fn, reason = _load(spec)
        if reason is not None:
            raise BackendUnavailableError(f"{op}: backend {pinned.value!r} cannot serve this call: {reason}")
        dec = decision(op, device, args, pdl)
        return Selection(spec, _bind(spec, fn, args, dec, pdl), f"pinned by {by}")
    order, reasons, dec = ranked(op, device, args, pdl)
    for spec in order:
        fn, reason = _load(spec)
        if fn is not None:
            try:
                return Selection(spec, _bind(spec, fn, args, dec, pdl), why(spec, dec, unmeasured_arch(op, device)))
            except CallNotServed as exc:
                reason = str(exc)
        warnings.warn(f"slim_kernel: {op} backend {spec.backend.value!r} {reason}; falling back",
                      RuntimeWarning, stacklevel=3)
        reasons.append(f"{spec.backend.value}: {reason}")
    raise BackendUnavailableError(f"{op}: no backend can serve this call ({'; '.join(reasons)})")


def explain(op: str, device: torch.device, args: Sequence | None = None) -> list[tuple[KernelSpec, str | None]]:
    """Each spec of ``op`` with the reason it cannot serve (None = eligible), for `info`."""
    rows = []
    for spec in _REGISTRY.get(op, ()):
        reason = _BROKEN.get((op, spec.backend))
        if reason is None and spec.probe is not None:
            try:
                reason = spec.probe()
            except (Exception, SystemExit) as exc:  # noqa: BLE001 - a broken install is a reason, not a crash
                reason = f"{type(exc).__name__}: {exc}"
        reason = reason or spec.device_reason(device)
        if reason is None and args is not None:
            reason = spec.call_reason(args)
        rows.append((spec, reason))
    return rows
