"""Content-addressed cubin cache, safe across processes.

Layout: ``<root>/cubin-v1/<arch>/<entry>-<key>.slimcubin`` where ``<root>`` is
``$SLIM_KERNEL_CACHE_DIR`` or ``$XDG_CACHE_HOME/slim_kernel`` (``~/.cache/slim_kernel``).

The key hashes the source and every file it includes, the -D macros, the arch, the compiler
name and version, its flags and the slim-kernel version. A build goes to a private staging file
and is published with an atomic rename, under an ``fcntl`` lock per entry, so N processes
starting together compile once. Each entry is ``MAGIC | u32 header length | JSON header |
cubin``; the header carries the key, arch, size and sha256 of the cubin (and the ptxas resource
report), so a truncated, corrupt or wrong-arch entry is detected and rebuilt, never loaded. A
read-only or full cache dir gives one warning and an in-memory compile.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .._version import __version__
from .arch import normalize_arch, sm_version
from .compiler import Compiler, get_compiler
from .resources import ResourceUsage, cubin_sm
from .sources import source_digest
from .spec import KernelInstance

log = logging.getLogger("slim_kernel.jit")

ENV_CACHE_DIR = "SLIM_KERNEL_CACHE_DIR"
ENV_TRACE = "SLIM_KERNEL_JIT_TRACE"  # append one JSON line per real compile (tests, debugging)
FORMAT = 1
MAGIC = b"SLIMCUBIN1\n\0"
SUFFIX = ".slimcubin"
_HEAD = struct.Struct("<12sI")


def cache_root() -> Path:
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slim_kernel"


def cubin_dir(arch: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"cubin-v{FORMAT}" / normalize_arch(arch)


@dataclass(frozen=True)
class CacheEntry:
    cubin: bytes
    header: dict
    path: Path | None  # None: compiled in memory only
    compiled: bool  # True when this call ran the compiler

    @property
    def usage(self) -> ResourceUsage | None:
        data = self.header.get("resources")
        return ResourceUsage.from_dict(data) if data else None


def cache_key(instance: KernelInstance, arch: str, compiler: Compiler) -> str:
    arch = normalize_arch(arch)
    payload = {
        "format": FORMAT,
        "slim_kernel": __version__,
        "source": Path(instance.source).name,
        "source_sha256": source_digest(instance),
        "entry": instance.entry,
        "defines": [[k, str(v)] for k, v in instance.defines],
        "arch": arch,
        "compiler": compiler.fingerprint(),
        "flags": compiler.flags(instance, arch),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def entry_path(instance: KernelInstance, arch: str, key: str, root: Path | None = None) -> Path:
    return cubin_dir(arch, root) / f"{instance.entry}-{key[:32]}{SUFFIX}"


def pack_entry(header: dict, cubin: bytes) -> bytes:
    head = json.dumps(header, sort_keys=True).encode()
    return _HEAD.pack(MAGIC, len(head)) + head + cubin


def read_entry(path: Path, key: str, arch: str) -> tuple[CacheEntry | None, str | None]:
    """The valid entry at ``path``, or ``(None, why not)`` (missing, truncated, corrupt, wrong arch)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable ({exc})"
    if len(data) < _HEAD.size:
        return None, "truncated header"
    magic, head_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        return None, "bad magic"
    try:
        header = json.loads(data[_HEAD.size:_HEAD.size + head_len])
    except ValueError:
        return None, "corrupt header"
    cubin = data[_HEAD.size + head_len:]
    arch = normalize_arch(arch)
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("key") != key:
        return None, "header does not match the key"
    if header.get("arch") != arch:
        return None, f"built for {header.get('arch')}, wanted {arch}"
    if header.get("cubin_size") != len(cubin):
        return None, f"truncated cubin ({len(cubin)} of {header.get('cubin_size')} bytes)"
    if hashlib.sha256(cubin).hexdigest() != header.get("cubin_sha256"):
        return None, "cubin checksum mismatch"
    try:
        built_sm = cubin_sm(cubin)
    except ValueError as exc:
        return None, f"not a cubin ({exc})"
    if built_sm != sm_version(arch):
        return None, f"cubin is for SM {built_sm}, wanted {arch}"
    return CacheEntry(cubin, header, path, compiled=False), None


_MEMORY: dict[str, CacheEntry] = {}
_MEMORY_LOCK = threading.Lock()
_WARNED: set[str] = set()


def _warn_once(tag: str, message: str) -> None:
    if tag not in _WARNED:
        _WARNED.add(tag)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _trace(event: dict) -> None:
    target = os.environ.get(ENV_TRACE)
    if not target:
        return
    line = (json.dumps(event, sort_keys=True) + "\n").encode()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _compile(instance: KernelInstance, arch: str, compiler: Compiler, key: str) -> tuple[dict, bytes]:
    result = compiler.compile(instance, arch)
    header = {
        "format": FORMAT, "key": key, "arch": arch, "source": Path(instance.source).name,
        "entry": instance.entry, "defines": [[k, str(v)] for k, v in instance.defines],
        "compiler": compiler.fingerprint(), "slim_kernel": __version__,
        "cubin_size": len(result.cubin), "cubin_sha256": hashlib.sha256(result.cubin).hexdigest(),
        "resources": result.usage.to_dict() if result.usage else None,
        "compile_seconds": round(result.seconds, 4), "created": time.time(),
    }
    log.info("compiled %s (%s, %s) with %s in %.2f s", instance.entry, dict(instance.defines), arch,
             compiler.name, result.seconds)
    _trace({"event": "compile", "entry": instance.entry, "arch": arch, "compiler": compiler.name,
            "key": key, "pid": os.getpid(), "seconds": result.seconds})
    return header, result.cubin


@contextlib.contextmanager
def _locked(lock_path: Path):
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _publish(path: Path, blob: bytes) -> None:
    """Write ``blob`` to a private staging file next to ``path`` and rename it into place."""
    staging = path.parent / ".staging"
    staging.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=staging)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def get_entry(instance: KernelInstance, arch: str, compiler: Compiler | str | None = None) -> CacheEntry:
    """The cache entry for ``instance`` on ``arch``, compiling (once, across processes) if needed."""
    arch = normalize_arch(arch)
    if not isinstance(compiler, Compiler):
        compiler = get_compiler(compiler)
    key = cache_key(instance, arch, compiler)
    hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    path = entry_path(instance, arch, key)
    entry, why = read_entry(path, key, arch)
    if entry is None:
        entry = _build(instance, arch, compiler, key, path, why)
    with _MEMORY_LOCK:
        _MEMORY[key] = entry
    return entry


def _build(instance, arch, compiler, key, path: Path, why: str | None) -> CacheEntry:
    try:
        (path.parent / ".locks").mkdir(parents=True, exist_ok=True)
        lock_cm = _locked(path.parent / ".locks" / (path.name + ".lock"))
        lock_cm.__enter__()
    except OSError as exc:
        return _in_memory(instance, arch, compiler, key, path, exc)
    try:
        entry, why = read_entry(path, key, arch)  # another process may have published it meanwhile
        if entry is not None:
            return entry
        if why != "missing":
            log.warning("slim_kernel JIT cache entry %s is invalid (%s); rebuilding", path, why)
            _trace({"event": "invalid", "path": str(path), "reason": why, "pid": os.getpid()})
        header, cubin = _compile(instance, arch, compiler, key)
        try:
            _publish(path, pack_entry(header, cubin))
        except OSError as exc:
            _warn_once(f"write:{path.parent}", f"slim_kernel: cannot write the JIT cache entry {path} ({exc}); "
                       "using the kernel compiled in memory (free space or set SLIM_KERNEL_CACHE_DIR)")
            return CacheEntry(cubin, header, None, compiled=True)
        return CacheEntry(cubin, header, path, compiled=True)
    finally:
        lock_cm.__exit__(None, None, None)


def _in_memory(instance, arch, compiler, key, path: Path, exc: OSError) -> CacheEntry:
    reason = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    _warn_once(f"dir:{cache_root()}", f"slim_kernel: the JIT cache dir {cache_root()} is not writable ({reason}: "
               f"{exc.strerror or exc}); compiling in memory, nothing is cached across processes "
               f"(set {ENV_CACHE_DIR} to a writable directory)")
    header, cubin = _compile(instance, arch, compiler, key)
    return CacheEntry(cubin, header, None, compiled=True)


def compile_cubin(instance: KernelInstance, arch: str, compiler: Compiler | str | None = None) -> bytes:
    """The cubin of ``instance`` for ``arch`` (``"sm_90a"``, ``"9.0a"``), through the cache."""
    return get_entry(instance, arch, compiler).cubin


def is_cached(instance: KernelInstance, arch: str, compiler: Compiler | str | None = None) -> bool:
    """True when a valid entry is on disk (or in memory); compiles nothing."""
    arch = normalize_arch(arch)
    if not isinstance(compiler, Compiler):
        compiler = get_compiler(compiler)
    key = cache_key(instance, arch, compiler)
    return key in _MEMORY or read_entry(entry_path(instance, arch, key), key, arch)[0] is not None


def cached_counts(root: Path | None = None) -> dict[str, int]:
    """Number of cache entries per arch (files; validity is checked on load)."""
    base = (root or cache_root()) / f"cubin-v{FORMAT}"
    if not base.is_dir():
        return {}
    return {d.name: sum(1 for _ in d.glob(f"*{SUFFIX}")) for d in sorted(base.iterdir()) if d.is_dir()}


def clear_memory() -> None:
    """Forget in-process entries (tests)."""
    with _MEMORY_LOCK:
        _MEMORY.clear()
    _WARNED.clear()
