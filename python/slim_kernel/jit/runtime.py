"""Loaded kernels: ``get_kernel(instance, device_index)`` -> :class:`LoadedKernel` with ``launch``.

The launcher is ``slim_kernel._native`` (nanobind, CUDA driver API) when it was built, else the
cuda-python fallback (``_pylauncher``); ``SLIM_KERNEL_LAUNCHER=native|python`` forces one.
Kernels are memoized per (instance, device, launcher): the second ``get_kernel`` is a dict lookup.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading
from types import ModuleType

from ..knobs import ENV_LAUNCHER
from . import _pylauncher
from .arch import arch_for_device
from .cache import get_entry
from .catalogue import SMEM_RESERVED_PER_CTA
from .compiler import CompilerUnavailableError, get_compiler
from .resources import ResourceUsage
from .spec import KernelInstance

LAUNCHERS = ("native", "python")
CARVEOUT_ATTR = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
MAX_THREADS_ATTR = 0  # CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: what the function's registers leave
MAX_DYNAMIC_SMEM_ATTR = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
DEFAULT_DYNAMIC_SMEM = 48 * 1024  # what a launch gets without opting in
LAUNCH_CARVEOUT_DRIVER = 12060  # CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT is in CUDA 12.6's cuda.h
# what cuModuleLoadData answers for an image this driver cannot run (a newer toolkit's cubin, say)
UNLOADABLE = ("CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "CUDA_ERROR_NO_BINARY_FOR_GPU", "CUDA_ERROR_INVALID_IMAGE")


class KernelLoadError(RuntimeError):
    """The driver cannot load a cubin (built by a newer CUDA than the driver's): the call goes to the next
    backend (``backends/jit.py``), the message naming both versions."""


def driver_cuda_version() -> int:
    """cuDriverGetVersion() read straight from libcuda (13000 = CUDA 13.0; nothing is initialized), 0 if unreadable."""
    try:
        value = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(value)) != 0:
            return 0
    except (OSError, AttributeError):
        return 0
    return value.value


def _version_text(driver: int) -> str:
    return f"CUDA {driver // 1000}.{driver % 1000 // 10}" if driver else "an unknown CUDA version"


def load_check(compiled_by: str, driver: int) -> str | None:
    """Why a cubin compiled by ``compiled_by`` (the cache header's ``"nvrtc 13.0 (...)"``/``"nvcc 12.8.93"``)
    cannot load under a driver of version ``driver`` (``cuDriverGetVersion``), or None: a cubin of a newer
    CUDA major than the driver's is refused (CUDA's compatibility holds within a major only)."""
    found = re.search(r"\b(\d+)\.(\d+)", compiled_by)
    if not found or not driver or int(found[1]) <= driver // 1000:
        return None
    return (f"compiled by {compiled_by} (CUDA {found[1]}.{found[2]}), the driver supports {_version_text(driver)}: "
            f"update the driver or compile with a CUDA {driver // 1000}.x NVRTC/nvcc")


def _load(name: str, instance: KernelInstance, arch: str, device_index: int):
    """The launcher's kernel object for ``instance`` (compiled through the cache), or KernelLoadError
    naming the compiler and driver versions where the driver cannot load the cubin."""
    entry = get_entry(instance, arch)
    compiled_by = str(entry.header.get("compiler", ""))
    driver = driver_cuda_version()
    why = load_check(compiled_by, driver)
    if why is not None:
        raise KernelLoadError(f"slim_kernel: cannot load JIT kernel {instance.entry} ({arch}): {why}")
    try:
        if name == "native":
            module, _ = native_module()
            impl = module.Kernel(entry.cubin, instance.entry, instance.signature, device_index)
        else:
            impl = _pylauncher.Kernel(entry.cubin, instance.entry, instance.signature, device_index)
    except RuntimeError as exc:
        if not any(code in str(exc) for code in UNLOADABLE):
            raise
        raise KernelLoadError(f"slim_kernel: the driver ({_version_text(driver)}) cannot load JIT kernel "
                              f"{instance.entry} ({arch}) compiled by {compiled_by}: {exc}") from None
    return impl, entry


def carveout_percent(smem: int, ctas: int, sms: int, per_sm: int, room: int, cluster: bool = False) -> int | None:
    """The preferred shared-memory carveout (percent of ``per_sm``, the SM's shared memory) for a kernel
    of ``ctas`` CTAs of ``smem`` bytes: what the CTAs the grid puts on one SM need, plus ``room`` bytes for
    a CTA of the kernel before it on the stream. With PDL our CTAs start while that kernel's last CTAs
    run; where the driver's own choice leaves them no room, those SMs take our CTA only after theirs
    exit (H200, GLM-5's router at M=10: 31 KB in a 32 KB carveout, 4.31 us against 3.59 with room after
    flashinfer's RMSNorm, 4.57 against 3.57 after its fused_add_rmsnorm, whose CTA takes 24-29 KB).
    None: leave the driver's choice: no room asked for, no CTA fits, or a cluster launch (sized for one
    CTA per SM, 8-CTA clusters of ring_s8 and skinny took a second wave: 1.6-1.8x slower)."""
    block = smem + SMEM_RESERVED_PER_CTA
    fit = per_sm // block if per_sm > 0 else 0
    if room <= 0 or fit < 1 or cluster:
        return None
    need = min(per_sm, min(fit, -(-ctas // max(sms, 1))) * block + room)
    return -(-100 * need // per_sm)


class LoadedKernel:
    """One kernel instance loaded on one device.

    ``launch(grid, block, args, *, stream, smem=0, pdl=False, cluster=None, carveout=None)``: grid/block are
    tuples of up to 3 positive ints; args a tuple matching the signature (p = device pointer int,
    i = int32, l = int64, f = float32); stream the raw ``cudaStream_t`` int
    (``torch.cuda.current_stream().cuda_stream``); smem the dynamic shared memory in bytes (the
    kernel's limit is raised once when above 48 KiB); pdl launches with programmatic stream
    serialization (the kernel should ``griddepcontrol.wait`` before reading its predecessor's
    output); cluster a thread-block-cluster shape (SM >= 9.0); carveout this launch's preferred
    shared-memory carveout in percent (:meth:`launch_carveout`). A failed launch raises
    RuntimeError naming the CUresult.
    """

    __slots__ = ("instance", "device_index", "arch", "launcher", "impl", "launch", "usage", "carveout")

    def __init__(self, instance: KernelInstance, device_index: int, arch: str, launcher: str, impl,
                 usage: ResourceUsage | None):
        self.instance = instance
        self.device_index = device_index
        self.arch = arch
        self.launcher = launcher
        self.impl = impl
        self.usage = usage
        self.launch = impl.launch  # the C++ method itself for the native launcher: no Python frame
        self.carveout = -1  # the preferred shared-memory carveout set (percent; -1: the driver's choice)

    def launch_carveout(self, percent: int | None) -> int | None:
        """The ``carveout`` argument of the launches of a plan that wants ``percent`` (None: the driver's
        choice). Each launch carries its own where the driver takes it (:func:`launch_carveout_supported`):
        plans of one kernel at different M want different carveouts, and one raised for M=16 slowed the
        same kernel at M 6-10 by 3-8% (H200). Older drivers: the function's attribute,
        raised to the largest any plan asked for, and None."""
        if percent is None:
            return None
        if launch_carveout_supported(self.launcher):
            return percent
        self.prefer_carveout(percent)
        return None

    def launch_reason(self, threads: int, smem: int) -> str | None:
        """Why a launch of ``threads`` per CTA with ``smem`` bytes of dynamic shared memory would fail, asked of
        the driver before the first one (the function's threads per block at its real register count, the
        shared memory it may opt into: the opt-in is made here, as the first launch would), or None."""
        try:
            most = self.impl.attribute(MAX_THREADS_ATTR)
            if threads > most:
                return f"needs {threads} threads per CTA, {self.instance.entry} allows {most} at its registers"
            if smem > DEFAULT_DYNAMIC_SMEM:
                self.impl.set_attribute(MAX_DYNAMIC_SMEM_ATTR, smem)
        except RuntimeError as exc:
            return str(exc)
        return None

    def prefer_carveout(self, percent: int) -> None:
        """Raise the function's preferred carveout to ``percent`` (never lowers it: the largest any plan of
        this kernel asked for holds them all)."""
        if percent > self.carveout:
            self.impl.set_attribute(CARVEOUT_ATTR, percent)
            self.carveout = percent

    def __repr__(self) -> str:
        return (f"LoadedKernel({self.instance.entry}, {dict(self.instance.defines)}, cuda:{self.device_index}, "
                f"{self.arch}, launcher={self.launcher})")


_NATIVE: dict[str, object] = {}


def native_module() -> tuple[ModuleType | None, str | None]:
    """``(slim_kernel._native, None)`` or ``(None, why it cannot be imported)``."""
    if "module" not in _NATIVE:
        try:
            from .. import _native

            _NATIVE["module"], _NATIVE["why"] = _native, None
        except ImportError as exc:
            _NATIVE["module"], _NATIVE["why"] = None, f"slim_kernel._native is not built ({exc})"
    return _NATIVE["module"], _NATIVE["why"]  # type: ignore[return-value]


def launcher_name(requested: str | None = None) -> str:
    """``native`` or ``python``: ``requested``, else ``SLIM_KERNEL_LAUNCHER``, else native when built."""
    value = (requested or os.environ.get(ENV_LAUNCHER, "") or "auto").strip().lower()
    if value not in ("auto", *LAUNCHERS):
        what = "launcher" if requested else ENV_LAUNCHER
        raise ValueError(f"{what} must be one of native, python or auto, got {value!r}")
    if value == "python":
        return "python"
    module, why = native_module()
    if module is not None:
        return "native"
    if value == "native":
        raise RuntimeError(f"the native launcher was requested but {why}")
    return "python"


_LAUNCH_CARVEOUT: dict[str, bool] = {}


def launch_carveout_supported(launcher: str) -> bool:
    """Whether ``launcher``'s launches can carry their own preferred carveout (a CUDA >= 12.6 driver)."""
    supported = _LAUNCH_CARVEOUT.get(launcher)
    if supported is None:
        module = native_module()[0] if launcher == "native" else _pylauncher
        supported = _LAUNCH_CARVEOUT[launcher] = module.driver_version() >= LAUNCH_CARVEOUT_DRIVER
    return supported


def driver_error(launcher: str) -> str | None:
    if launcher == "native":
        module, why = native_module()
        return why if module is None else module.driver_error()
    return _pylauncher.driver_error()


_KERNELS: dict[tuple, LoadedKernel] = {}
_LOCK = threading.Lock()


def get_kernel(instance: KernelInstance, device_index: int, *, launcher: str | None = None) -> LoadedKernel:
    """``instance`` compiled (through the cache) for device ``device_index``'s exact arch and
    loaded into its primary context. Memoized: the second call is a dict lookup."""
    key = (instance, device_index, launcher)
    kernel = _KERNELS.get(key)
    if kernel is not None:
        return kernel
    if not isinstance(instance, KernelInstance):
        raise TypeError(f"instance must be a KernelInstance, got {type(instance).__name__}")
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            name = launcher_name(launcher)
            resolved = (instance, device_index, name)
            kernel = _KERNELS.get(resolved)
            if kernel is None:
                why = driver_error(name)
                if why is not None:
                    raise RuntimeError(f"slim_kernel: cannot load JIT kernel {instance.entry}: {why}")
                arch = arch_for_device(device_index)
                impl, entry = _load(name, instance, arch, device_index)
                kernel = LoadedKernel(instance, device_index, arch, name, impl, entry.usage)
                _KERNELS[resolved] = kernel
            _KERNELS[key] = kernel
    return kernel


def available() -> str | None:
    """None when a compiler and the driver are usable, else the reason (the JIT backend's probe)."""
    try:
        get_compiler()
        name = launcher_name()
    except (CompilerUnavailableError, RuntimeError, ValueError) as exc:
        return str(exc)
    return driver_error(name)


def clear_loaded() -> None:
    """Forget loaded kernels (tests); modules stay loaded in the driver."""
    with _LOCK:
        _KERNELS.clear()
