"""Device-index rules: which CUDA device each step of a call uses. The one place they are written down.

A call runs on its tensors' device, never on "the current device" (``torch.cuda.current_device()``),
which may be another one: a tool driving several GPUs from one thread, a caller that set cuda:0 and
passes tensors on cuda:1, a capture on cuda:1's stream inside ``torch.cuda.device(0)``.

1. The device is the first input's. Validation (``ops/<op>.py``) requires every tensor on it.
2. Plans are keyed by device: the ops' plans (``ops/_dispatch.py``) by every tensor's device, the
   bmm_fp8 fast path's by ``A``'s index. Capability, arch and SM count are cached per index
   (``registry.capability``, ``jit.arch_for_device``, ``backends/jit._limits``); the routing table
   per arch.
3. JIT kernels: the cubin cache is per arch (a cubin holds no device); a loaded kernel is per
   (instance, device index, launcher) (``jit.runtime.get_kernel``), loaded into that device's primary
   context, which the launcher (``csrc/native/launcher.cpp``, ``jit/_pylauncher.py``) retains and makes
   current around the load, attribute calls and every launch when the thread's current context is
   another. A module loaded for one device is never launched on another.
4. Streams: a launch goes to the current stream of the tensors' device
   (``torch.cuda.current_stream(index)``), never of the current device.
5. PDL under capture (``pdl.launch_pdl``): the capture status and the node a launch will follow are
   read from the current stream of the tensors' device.
6. Code that launches on the current device (flashinfer: runtime-API launches, the cuBLAS handle of
   ``torch.cuda.current_blas_handle()``, per-stream workspaces) runs under :func:`on_device`: the
   tensors' device is made current for the call when it is not already (one index compare otherwise).
   torch's own ops (the torch reference backend) are guarded by torch's dispatcher.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .decision import Device, memory_gbps

_get_device = getattr(torch._C, "_cuda_getDevice", None)  # ~50 ns; torch.cuda.current_device() adds a lazy-init check


def current() -> int:
    """The calling thread's current CUDA device index."""
    return _get_device() if _get_device is not None else torch.cuda.current_device()


def index(device) -> int:
    """The CUDA index of ``device`` (a torch.device, ``"cuda:1"`` or an int; ``"cuda"`` without an index
    and None mean the current device). TypeError/ValueError naming ``device`` otherwise."""
    if device is None:
        return current()
    if isinstance(device, bool) or not isinstance(device, (int, str, torch.device)):
        raise TypeError(f"device must be a torch.device, str or int, got {type(device).__name__}")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device must be a non-negative CUDA index, got {device}")
        return device
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"device must be a CUDA device like 'cuda:1', got {device!r}") from None
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {dev}")
    return current() if dev.index is None else dev.index


def other(device) -> int | None:
    """``device``'s index when it is a CUDA device other than the current one, else None (None, a CPU
    or meta device, or the current device)."""
    if device is None:
        return None
    if not isinstance(device, int):
        if getattr(device, "type", None) != "cuda" or device.index is None:
            return None
        device = device.index
    return None if device == current() else device


def on_device(fn: Callable, device: torch.device | None = None) -> Callable:
    """``fn(*args)`` with ``device`` current during the call when it is a CUDA device other than the
    current one. ``device`` None: the device of ``args[0]``, read per call; a CPU device: ``fn`` itself."""
    if device is None:
        def run(*args):
            i = args[0].get_device()
            if i < 0 or i == current():
                return fn(*args)
            with torch.cuda.device(i):
                return fn(*args)
        return run
    if device.type != "cuda":
        return fn
    fixed = index(device)

    def run_on(*args):
        if fixed == current():
            return fn(*args)
        with torch.cuda.device(fixed):
            return fn(*args)
    return run_on


@functools.cache
def _routing_device(index: int) -> Device:
    props = torch.cuda.get_device_properties(index)
    gbps = memory_gbps(props.name, getattr(props, "memory_clock_rate", 0) or 0, getattr(props, "memory_bus_width", 0) or 0)
    return Device(props.name, props.multi_processor_count, f"sm_{props.major}{props.minor}", gbps)


def routing_device(device: torch.device) -> Device:
    """The GPU as the routing tables key it (name, SM count, arch, peak memory bandwidth)."""
    return _routing_device(device.index if device.index is not None else torch.cuda.current_device())
