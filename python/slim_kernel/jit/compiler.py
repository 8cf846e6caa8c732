"""Compiler front: one kernel instance -> a cubin for one exact arch, through NVRTC or nvcc.

Both compilers sit behind :class:`Compiler`. :func:`get_compiler` picks NVRTC when it is usable
(in-process, ships as the ``nvidia-cuda-nvrtc`` wheel with torch's CUDA builds) and nvcc
otherwise; ``SLIM_KERNEL_JIT_COMPILER=nvrtc|nvcc`` forces one. When none is usable the error
names what is missing for each.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..knobs import ENV_COMPILER
from .resources import ResourceUsage, parse_ptxas_log
from .sources import include_dirs, source_path
from .spec import KernelInstance

COMPILER_NAMES = ("nvrtc", "nvcc")
# Flags shared by both compilers (the arch and -D macros are added per instance).
COMMON_FLAGS = ("-std=c++17",)
NVCC_TIMEOUT_S = 600


class CompilerUnavailableError(RuntimeError):
    """No usable CUDA compiler (or the forced one is unusable); the message says what is missing."""


class CompileError(RuntimeError):
    """The compiler rejected a kernel source; the message carries the compiler log."""


@dataclass(frozen=True)
class CompileResult:
    cubin: bytes
    log: str
    seconds: float
    usage: ResourceUsage | None


def define_flags(instance: KernelInstance) -> list[str]:
    return [f"-D{name}={value}" for name, value in instance.defines]


def _has_headers(d: Path) -> bool:
    return (d / "cuda_bf16.h").is_file()


def _cuda_include_dirs() -> list[Path]:
    """Directories holding the CUDA headers kernels include (cuda_bf16.h, cuda/std/...).

    Cheap places first ($CUDA_HOME, /usr/local/cuda, next to nvcc); the pip wheels (through
    cuda.pathfinder, slower to import) only when those have none."""
    candidates: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(Path(os.environ[var]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent / "include")
    found = next((d for d in candidates if _has_headers(d)), None)
    dirs: list[Path] = []
    if found is not None:
        dirs.append(found)
    else:
        try:  # the nvidia-cuda-runtime / cccl pip wheels
            from cuda import pathfinder

            for lib in ("cudart", "cccl"):
                hdr = pathfinder.find_nvidia_header_directory(lib)
                if hdr and Path(hdr) not in dirs:
                    dirs.append(Path(hdr))
        except Exception:  # noqa: BLE001 - pathfinder is optional
            pass
    for d in list(dirs):
        if (d / "cccl").is_dir():
            dirs.append(d / "cccl")
    return dirs if any(_has_headers(d) for d in dirs) else []


def _nvrtc_candidates() -> list[Path]:
    """libnvrtc files, in the order cuda.pathfinder searches: pip wheels, then the toolkit."""
    found: list[Path] = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            for pattern in ("cu1*/lib/libnvrtc.so.*", "cuda_nvrtc/lib/libnvrtc.so.*"):
                found += sorted(p for p in base.glob(pattern) if ".alt." not in p.name)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            found += sorted(Path(os.environ[var]).glob("lib*/libnvrtc.so*"))
    found += sorted(Path("/usr/local/cuda").glob("lib*/libnvrtc.so*"))
    return found


def _load_nvrtc() -> tuple[str, int, int]:
    """Find and load libnvrtc; return its path and version (without importing cuda.bindings)."""
    errors = []
    for cand in [*map(str, _nvrtc_candidates()), "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]:
        try:
            # libnvrtc dlopens its builtins library by soname at compile time: load the one next
            # to it first (cuda.pathfinder does the same), so a pip-wheel libnvrtc finds it.
            for builtins in sorted(Path(cand).parent.glob("libnvrtc-builtins.so.*")) if "/" in cand else ():
                if ".alt." not in builtins.name:
                    ctypes.CDLL(str(builtins))
            lib = ctypes.CDLL(cand)
            major, minor = ctypes.c_int(), ctypes.c_int()
            if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
                raise OSError("nvrtcVersion failed")
            return cand, major.value, minor.value
        except (OSError, AttributeError) as exc:
            errors.append(f"{cand}: {exc}")
    raise CompilerUnavailableError("libnvrtc not found or not loadable (pip install nvidia-cuda-nvrtc or install "
                                   "a CUDA toolkit); tried " + "; ".join(errors[:4]))


class Compiler:
    name: str = ""

    @property
    def version(self) -> str:
        raise NotImplementedError

    def flags(self, instance: KernelInstance, arch: str) -> list[str]:
        """The path-independent flags that decide the output (part of the cache key)."""
        raise NotImplementedError

    def compile(self, instance: KernelInstance, arch: str) -> CompileResult:
        raise NotImplementedError

    def fingerprint(self) -> str:
        return f"{self.name} {self.version}"

    def _usage(self, log: str, instance: KernelInstance) -> ResourceUsage | None:
        try:
            return parse_ptxas_log(log, instance.entry)
        except ValueError:
            return None


class NvrtcCompiler(Compiler):
    name = "nvrtc"
    _lock = threading.Lock()

    def __init__(self):
        try:
            found = importlib.util.find_spec("cuda.bindings") is not None
        except ModuleNotFoundError:  # no `cuda` package at all
            found = False
        if not found:
            raise CompilerUnavailableError("cuda.bindings (cuda-python) is not installed; pip install cuda-bindings")
        path, major, minor = _load_nvrtc()
        self._include = _cuda_include_dirs()
        if not self._include:
            raise CompilerUnavailableError(
                "NVRTC needs the CUDA headers (cuda_bf16.h) and none were found: set CUDA_HOME, install a "
                "CUDA toolkit, or pip install the nvidia-cuda-runtime and nvidia-cuda-cccl wheels")
        self._nvrtc = None  # cuda.bindings.nvrtc, imported on the first compile (it costs ~50 ms)
        real = Path(path).resolve()
        size = real.stat().st_size if real.is_file() else 0
        # nvrtcVersion() has no patch level; the library's file name and size stand in for it.
        self._version = f"{major}.{minor} ({real.name}, {size} bytes)"
        self._major_minor = (major, minor)
        self.library = path

    def _bindings(self):
        if self._nvrtc is None:
            from cuda.bindings import nvrtc

            _, major, minor = nvrtc.nvrtcVersion()
            if (major, minor) != self._major_minor:  # cuda.pathfinder found another libnvrtc than we did
                raise CompilerUnavailableError(
                    f"cuda.bindings loaded NVRTC {major}.{minor} but {self.library} is "
                    f"{self._major_minor[0]}.{self._major_minor[1]}; keep one NVRTC installed or force "
                    f"{ENV_COMPILER}=nvcc")
            self._nvrtc = nvrtc
        return self._nvrtc

    @property
    def version(self) -> str:
        return self._version

    def flags(self, instance: KernelInstance, arch: str) -> list[str]:
        return [f"--gpu-architecture={arch}", *COMMON_FLAGS, "--ptxas-options=-v", *define_flags(instance)]

    def compile(self, instance: KernelInstance, arch: str) -> CompileResult:
        nvrtc = self._bindings()
        path = source_path(instance)
        includes = [f"-I{d}" for d in (*include_dirs(instance), *self._include)]
        options = [o.encode() for o in (*self.flags(instance, arch), *includes)]
        start = time.perf_counter()
        with self._lock:
            err, prog = nvrtc.nvrtcCreateProgram(path.read_bytes(), path.name.encode(), 0, [], [])
            _check_nvrtc(nvrtc, err, "nvrtcCreateProgram")
            try:
                (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
                _, size = nvrtc.nvrtcGetProgramLogSize(prog)
                log_buf = b" " * size
                nvrtc.nvrtcGetProgramLog(prog, log_buf)
                log = log_buf.rstrip(b"\0 ").decode(errors="replace")
                if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                    raise CompileError(f"NVRTC failed to compile {instance.source} ({instance.entry}, "
                                       f"{arch}, {dict(instance.defines)}):\n{log}")
                err, size = nvrtc.nvrtcGetCUBINSize(prog)
                _check_nvrtc(nvrtc, err, "nvrtcGetCUBINSize")
                cubin = b" " * size
                (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
                _check_nvrtc(nvrtc, err, "nvrtcGetCUBIN")
            finally:
                nvrtc.nvrtcDestroyProgram(prog)
        return CompileResult(cubin, log, time.perf_counter() - start, self._usage(log, instance))


def _check_nvrtc(nvrtc, err, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err}")


def find_nvcc() -> str | None:
    """nvcc from CUDACXX (what CMake uses too), CUDA_HOME/CUDA_PATH, PATH, or /usr/local/cuda."""
    cudacxx = os.environ.get("CUDACXX")
    if cudacxx and os.path.isfile(cudacxx) and os.access(cudacxx, os.X_OK):
        return cudacxx
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            cand = Path(os.environ[var]) / "bin" / "nvcc"
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    found = shutil.which("nvcc")
    if found:
        return found
    cand = Path("/usr/local/cuda/bin/nvcc")
    return str(cand) if cand.is_file() and os.access(cand, os.X_OK) else None


def nvcc_temp_parent(create: bool = False) -> Path | None:
    """The per-user directory nvcc's work dirs live in, so the ones a killed compile leaves can be
    found and swept (the cache does, by age); None when it is missing or is not a real directory of
    this user (someone squatting on the name in a shared /tmp)."""
    parent = Path(tempfile.gettempdir()) / f"slim_kernel_nvcc-{os.getuid()}"
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                parent.mkdir(mode=0o700)
        st = parent.lstat()
    except OSError:
        return None
    return parent if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() else None


class NvccCompiler(Compiler):
    name = "nvcc"

    def __init__(self):
        nvcc = find_nvcc()
        if nvcc is None:
            raise CompilerUnavailableError("nvcc not found (looked in $CUDA_HOME/bin, $PATH, /usr/local/cuda/bin)")
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise CompilerUnavailableError(f"{nvcc} --version failed: {exc}") from exc
        lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
        release = next((ln.split(",")[-1].strip() for ln in lines if "release" in ln), "unknown")
        build = lines[-1] if lines else ""
        self.path = nvcc
        self._version = f"{release.lstrip('V')} ({build})"

    @property
    def version(self) -> str:
        return self._version

    def flags(self, instance: KernelInstance, arch: str) -> list[str]:
        num = arch.removeprefix("sm_")
        return ["-x", "cu", "-cubin", f"-gencode=arch=compute_{num},code=sm_{num}", *COMMON_FLAGS, "-O3",
                "-Xptxas", "-v", *define_flags(instance)]

    def compile(self, instance: KernelInstance, arch: str) -> CompileResult:
        path = source_path(instance)
        includes = [f"-I{d}" for d in include_dirs(instance)]
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="slim_nvcc_", dir=nvcc_temp_parent(create=True)) as tmp:
            out = Path(tmp) / "kernel.cubin"
            cmd = [self.path, *self.flags(instance, arch), *includes, "-o", str(out), str(path)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
            except subprocess.TimeoutExpired as exc:
                raise CompileError(f"nvcc timed out after {NVCC_TIMEOUT_S} s: {' '.join(cmd)}") from exc
            log = (proc.stdout + proc.stderr).strip()
            if proc.returncode != 0 or not out.is_file():
                raise CompileError(f"nvcc failed to compile {instance.source} ({instance.entry}, {arch}, "
                                   f"{dict(instance.defines)}), exit {proc.returncode}:\n$ {' '.join(cmd)}\n{log}")
            cubin = out.read_bytes()
        return CompileResult(cubin, log, time.perf_counter() - start, self._usage(log, instance))


_CLASSES = {"nvrtc": NvrtcCompiler, "nvcc": NvccCompiler}


def requested_compiler() -> str | None:
    value = os.environ.get(ENV_COMPILER, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in COMPILER_NAMES:
        raise ValueError(f"{ENV_COMPILER} must be one of {', '.join(COMPILER_NAMES)} or auto, got {value!r}")
    return value


@functools.cache
def _make(name: str) -> Compiler:
    return _CLASSES[name]()


def get_compiler(name: str | None = None) -> Compiler:
    """The compiler to use: ``name``, else ``SLIM_KERNEL_JIT_COMPILER``, else NVRTC, else nvcc."""
    if name is not None and name not in COMPILER_NAMES:
        raise ValueError(f"compiler must be one of {', '.join(COMPILER_NAMES)}, got {name!r}")
    name = name or requested_compiler()
    if name is not None:
        try:
            return _make(name)
        except CompilerUnavailableError as exc:
            raise CompilerUnavailableError(f"JIT compiler {name!r} is not usable: {exc}") from None
    reasons = []
    for cand in COMPILER_NAMES:
        try:
            return _make(cand)
        except CompilerUnavailableError as exc:
            reasons.append(f"{cand}: {exc}")
    raise CompilerUnavailableError("no CUDA compiler is usable for the JIT kernels (" + "; ".join(reasons) + ")")


def reset() -> None:
    """Forget detected compilers (tests change the environment)."""
    _make.cache_clear()
