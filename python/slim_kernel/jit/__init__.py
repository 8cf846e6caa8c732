"""JIT runtime: kernel sources -> cubin (NVRTC or nvcc) -> content-addressed cache -> launcher.

Importing this package needs no GPU, driver or compiler; they are looked up on first use.

- :func:`get_kernel` ``(instance, device_index)`` -> :class:`LoadedKernel` (``.launch(...)``)
- :func:`compile_cubin` ``(instance, arch)`` -> cubin bytes, through the cache
- :func:`available` -> None, or why the JIT cannot run here (the JIT backend's probe)
- :func:`runtime_info` -> what ``slim-kernel info`` prints
- :func:`resource_usage` ``(instance, arch)`` -> registers / spills / static smem (ptxas report)

Environment: ``SLIM_KERNEL_JIT_COMPILER=nvrtc|nvcc``, ``SLIM_KERNEL_CACHE_DIR``,
``SLIM_KERNEL_LAUNCHER=native|python``, ``SLIM_KERNEL_JIT=compile|cache-only|cache-or-fallback``
(what a cache miss does: compile, :class:`CacheMissError`, or the next backend serves the call).
"""

from __future__ import annotations

from .arch import arch_for_capability, arch_for_device, normalize_arch
from .cache import CacheMissError, cache_root, cached_counts, compile_cubin, get_entry, is_cached
from .compiler import CompileError, CompilerUnavailableError, get_compiler
from .resources import ResourceUsage, check_limits
from .runtime import LoadedKernel, available, get_kernel, launcher_name
from .sources import declared_limits
from .spec import KernelInstance

__all__ = [
    "CacheMissError",
    "CompileError",
    "CompilerUnavailableError",
    "KernelInstance",
    "LoadedKernel",
    "ResourceUsage",
    "arch_for_capability",
    "arch_for_device",
    "available",
    "cache_root",
    "check_limits",
    "compile_cubin",
    "declared_limits",
    "get_entry",
    "get_kernel",
    "is_cached",
    "normalize_arch",
    "resource_usage",
    "runtime_info",
]


def resource_usage(instance: KernelInstance, arch: str, compiler: str | None = None) -> ResourceUsage:
    """Registers, spills, stack and static shared memory of ``instance`` on ``arch`` (compiles
    through the cache when needed; the numbers come from the ptxas report stored with the entry)."""
    usage = get_entry(instance, arch, compiler).usage
    if usage is None:
        raise RuntimeError(f"no ptxas resource report for {instance.entry} on {arch}")
    return usage


def runtime_info() -> dict:
    """Compiler, cache dir, launcher and cached instantiations per arch (for ``slim-kernel info``)."""
    import os

    from . import runtime

    info: dict = {}
    try:
        info["compiler"] = get_compiler().fingerprint()
    except (CompilerUnavailableError, ValueError) as exc:
        info["compiler"] = f"unavailable: {exc}"
    root = cache_root()
    writable = os.access(root if root.exists() else root.parent if root.parent.exists() else "/", os.W_OK)
    info["cache_dir"] = f"{root}{'' if writable else ' (not writable: compiles stay in memory)'}"
    try:
        name = launcher_name()
        native, why = runtime.native_module()
        info["launcher"] = name if name == "native" else f"python (cuda-python fallback{'' if native else ': ' + why})"
        info["driver"] = runtime.driver_error(name) or "ok"
    except (RuntimeError, ValueError) as exc:
        info["launcher"] = f"unavailable: {exc}"
    if info.get("driver") == "ok":
        try:  # a launch attribute since CUDA 12.6's driver (runtime.LoadedKernel.launch_carveout)
            info["carveout"] = ("each launch its own" if runtime.launch_carveout_supported(name) else
                                "one per kernel, the largest any call asked for (driver older than CUDA 12.6)")
        except RuntimeError as exc:  # the driver loads but does not initialize (no GPU)
            info["carveout"] = f"unknown: {exc}"
    counts = cached_counts()
    info["cached"] = ", ".join(f"{arch}: {n}" for arch, n in counts.items()) or "none"
    return info
