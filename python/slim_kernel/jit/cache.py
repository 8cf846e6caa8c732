"""Content-addressed cubin cache, safe across processes.

Layout: ``<root>/cubin-v1/<arch>/<entry>-<key>.slimcubin`` where ``<root>`` is
``$SLIM_KERNEL_CACHE_DIR`` or ``$XDG_CACHE_HOME/slim_kernel`` (``~/.cache/slim_kernel``).

The key hashes the source and every file it includes, the -D macros, the arch, the compiler
name and version, its flags and the slim-kernel version. A build goes to a private staging file
and is published with an atomic rename, under an ``fcntl`` lock per entry, so N processes
starting together compile once. Each entry is ``MAGIC | u32 header length | JSON header |
cubin``; the header carries the key, arch, size and sha256 of the cubin (and the ptxas resource
report), so a truncated, corrupt or wrong-arch entry is detected and rebuilt, never loaded.
Reads trust nothing: an entry is opened only when it is a regular file (not a link, FIFO or
device) of bounded size, and its header is bounded in size and nesting.

The root directory is the user's (created with their umask); everything inside is made for
sharing, dirs 0755 and entries 0644, so a cache built by root at image build serves the user a
server runs as. A cache that is readable but not writable serves its hits silently; a compile
that cannot be stored (read-only, full, not permitted, a file where a dir belongs) gives one
warning naming the real cause and stays in memory. Each publish sweeps what killed processes
left behind: staging files and nvcc work dirs older than :data:`STALE_AFTER_S`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .. import knobs
from .._version import __version__
from ..knobs import ENV_TRACE
from ..paths import ENV_CACHE_DIR, cache_root  # noqa: F401  (re-exported: the cache's API)
from .arch import normalize_arch, sm_version
from .compiler import NVCC_TIMEOUT_S, Compiler, get_compiler, nvcc_temp_parent
from .resources import ResourceUsage, cubin_sm
from .sources import source_digest
from .spec import KernelInstance

log = logging.getLogger("slim_kernel.jit")

FORMAT = 1
MAGIC = b"SLIMCUBIN1\n\0"
SUFFIX = ".slimcubin"
_HEAD = struct.Struct("<12sI")
# A real entry is one cubin (~100 KiB here) behind a ~1 KiB header with about a dozen brackets;
# anything past these bounds is not an entry of ours and is not read further.
MAX_ENTRY_BYTES = 64 << 20
MAX_HEADER_BYTES = 64 << 10
MAX_HEADER_BRACKETS = 128  # bounds the nesting depth json.loads recurses to
ENTRY_MODE, DIR_MODE = 0o644, 0o755
# A staging file lives for the milliseconds of one write, an nvcc work dir for one compile (at most
# NVCC_TIMEOUT_S): anything older was left by a killed process.
STALE_AFTER_S = 2 * NVCC_TIMEOUT_S
_KINDS = {stat.S_IFLNK: "a symlink", stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO",
          stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def cubin_dir(arch: str, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"cubin-v{FORMAT}" / normalize_arch(arch)


@dataclass(frozen=True)
class CacheEntry:
    cubin: bytes
    header: dict
    path: Path | None  # None: compiled in memory only
    compiled: bool  # True when this call ran the compiler
    store_error: str | None = None  # why it is in memory only

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


def _check_file(st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"not a regular file ({_KINDS.get(stat.S_IFMT(st.st_mode), 'unknown type')})")
    if st.st_size > MAX_ENTRY_BYTES:
        raise ValueError(f"{st.st_size} bytes, more than an entry can be ({MAX_ENTRY_BYTES})")


def _read_bounded(path: Path) -> bytes:
    """The bytes of ``path``; ValueError when it is not a regular file of at most MAX_ENTRY_BYTES."""
    _check_file(os.lstat(path))  # before open: opening a FIFO blocks, a device may have side effects
    with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
        _check_file(os.fstat(f.fileno()))  # what was opened: the name may have been swapped meanwhile
        data = f.read(MAX_ENTRY_BYTES + 1)
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError(f"grew past {MAX_ENTRY_BYTES} bytes while read")
    return data


def read_entry(path: Path, key: str, arch: str) -> tuple[CacheEntry | None, str | None]:
    """The valid entry at ``path``, or ``(None, why not)`` (missing, not a regular file, too large,
    truncated, corrupt, wrong arch)."""
    try:
        data = _read_bounded(path)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable ({os_reason(exc)})"
    except ValueError as exc:
        return None, str(exc)
    if len(data) < _HEAD.size:
        return None, "truncated header"
    magic, head_len = _HEAD.unpack_from(data)
    if magic != MAGIC:
        return None, "bad magic"
    head = data[_HEAD.size:_HEAD.size + head_len]
    if head_len > MAX_HEADER_BYTES or len(head) < head_len:
        return None, f"header length {head_len} out of bounds"
    if head.count(b"[") + head.count(b"{") > MAX_HEADER_BRACKETS:
        return None, f"header has more than {MAX_HEADER_BRACKETS} brackets"
    try:
        header = json.loads(head)
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


def os_reason(exc: OSError) -> str:
    """``"<path>: Read-only file system (EROFS)"``: what failed, in the system's words."""
    code = errno.errorcode.get(exc.errno or 0)
    text = f"{exc.filename}: " if exc.filename else ""
    text += f"{exc.strerror} ({code})" if exc.strerror and code else str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        text += f" for uid {os.getuid()}"
    return text


def _mkdir(path: Path, mode: int | None) -> None:
    """Create ``path`` (and, with ``mode`` None, its parents, as the umask says); exists is fine."""
    try:
        if mode is None:
            path.mkdir(parents=True)
        else:
            os.mkdir(path, mode)
            os.chmod(path, mode)  # mkdir applied the umask
    except FileExistsError:
        if not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "exists and is not a directory", str(path)) from None


def prepare_dir(arch: str, root: Path | None = None) -> Path:
    """Create the dirs entries for ``arch`` go to and prove a file can be written there; OSError if not."""
    arch_dir = cubin_dir(arch, root)
    _mkdir(arch_dir.parent.parent, None)  # the root: the user's, umask applies
    for d in (arch_dir.parent, arch_dir, arch_dir / ".staging", arch_dir / ".locks"):
        _mkdir(d, DIR_MODE)
    fd, probe = tempfile.mkstemp(prefix="probe.", dir=arch_dir / ".staging")
    os.close(fd)
    os.unlink(probe)
    return arch_dir


def _sweep(directory: Path | None) -> None:
    """Remove what killed processes left in ``directory``: anything not modified for STALE_AFTER_S."""
    if directory is None:
        return
    cutoff = time.time() - STALE_AFTER_S
    with contextlib.suppress(OSError), os.scandir(directory) as items:
        for item in items:
            with contextlib.suppress(OSError):
                if item.stat(follow_symlinks=False).st_mtime >= cutoff:
                    continue
                if item.is_dir(follow_symlinks=False):
                    shutil.rmtree(item.path)
                else:
                    os.unlink(item.path)


def _publish(path: Path, blob: bytes) -> None:
    """Write ``blob`` to a private staging file next to ``path`` and rename it into place."""
    staging = path.parent / ".staging"
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=staging)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
            f.flush()
            os.fchmod(f.fileno(), ENTRY_MODE)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _sweep(staging)
    _sweep(nvcc_temp_parent())


def _resolve(instance: KernelInstance, arch: str, compiler: Compiler | str | None):
    arch = normalize_arch(arch)
    if not isinstance(compiler, Compiler):
        compiler = get_compiler(compiler)
    key = cache_key(instance, arch, compiler)
    return arch, compiler, key, entry_path(instance, arch, key)


class CacheMissError(RuntimeError):
    """A kernel is not in the cache and ``SLIM_KERNEL_JIT`` forbids compiling it at run time."""


def get_entry(instance: KernelInstance, arch: str, compiler: Compiler | str | None = None) -> CacheEntry:
    """The cache entry for ``instance`` on ``arch``, compiling (once, across processes) if needed;
    :class:`CacheMissError` instead of a compile under ``SLIM_KERNEL_JIT=cache-only|cache-or-fallback``."""
    arch, compiler, key, path = _resolve(instance, arch, compiler)
    entry = _MEMORY.get(key)
    if entry is None:
        entry = _load_or_compile(instance, arch, compiler, key, path, knobs.jit_mode())
        with _MEMORY_LOCK:
            _MEMORY[key] = entry
    return entry


def load_or_compile(instance: KernelInstance, arch: str, compiler: Compiler | str | None = None) -> CacheEntry:
    """Like :func:`get_entry` but never answered from this process's memory: the entry on disk, else
    compiled and published (``path`` None and ``store_error`` set when it could not be stored)."""
    return _load_or_compile(instance, *_resolve(instance, arch, compiler))


def _load_or_compile(instance, arch: str, compiler: Compiler, key: str, path: Path, mode: str = "compile") -> CacheEntry:
    entry, why = read_entry(path, key, arch)
    if entry is not None:
        return entry
    if mode != "compile":
        raise CacheMissError(
            f"slim_kernel: JIT kernel {instance.label} for {arch} is not in the cache {path.parent} "
            f"({why}) and {knobs.ENV_JIT}={mode} forbids compiling it at run time; fill the cache with "
            f"`slim-kernel precompile --arch {arch} --model NAME` (or --router/--fused-a) under the same "
            f"compiler ({compiler.fingerprint()}) and {ENV_CACHE_DIR}")
    store_error: OSError | None = None
    with contextlib.ExitStack() as stack:
        try:
            prepare_dir(arch, path.parent.parent.parent)
            stack.enter_context(_locked(path.parent / ".locks" / (path.name + ".lock")))
        except OSError as exc:
            store_error = exc
        if store_error is None:
            entry, why = read_entry(path, key, arch)  # another process may have published it meanwhile
            if entry is not None:
                return entry
            if why != "missing":
                log.warning("slim_kernel JIT cache entry %s is invalid (%s); rebuilding", path, why)
                _trace({"event": "invalid", "path": str(path), "reason": why, "pid": os.getpid()})
        header, cubin = _compile(instance, arch, compiler, key)
        if store_error is None:
            try:
                _publish(path, pack_entry(header, cubin))
                return CacheEntry(cubin, header, path, compiled=True)
            except OSError as exc:
                store_error = exc
    reason = os_reason(store_error)
    refused = f"; the entry there was refused: {why}" if why != "missing" else ""
    _warn_once(f"store:{path.parent}", f"slim_kernel: cannot store JIT cache entries in {path.parent} ({reason})"
               f"{refused}; the kernel is compiled in memory, not shared with other processes (set "
               f"{ENV_CACHE_DIR} to a writable directory)")
    return CacheEntry(cubin, header, None, compiled=True, store_error=reason)


def compile_cubin(instance: KernelInstance, arch: str, compiler: Compiler | str | None = None) -> bytes:
    """The cubin of ``instance`` for ``arch`` (``"sm_90a"``, ``"9.0a"``), through the cache."""
    return get_entry(instance, arch, compiler).cubin


def verify_on_disk(instance: KernelInstance, arch: str, compiler: Compiler | str | None = None) -> str | None:
    """None when a valid entry is on disk (re-read now, memory aside), else why not; compiles nothing."""
    arch, _, key, path = _resolve(instance, arch, compiler)
    return read_entry(path, key, arch)[1]


def is_cached(instance: KernelInstance, arch: str, compiler: Compiler | str | None = None) -> bool:
    """True when a valid entry is on disk (or in memory); compiles nothing."""
    arch, compiler, key, path = _resolve(instance, arch, compiler)
    return key in _MEMORY or read_entry(path, key, arch)[0] is not None


def cached_counts(root: Path | None = None) -> dict[str, int]:
    """Number of cache entries per arch (files; validity is checked on load)."""
    base = (root or cache_root()) / f"cubin-v{FORMAT}"
    if not base.is_dir():
        return {}
    return {d.name: sum(1 for _ in d.glob(f"*{SUFFIX}")) for d in sorted(base.iterdir()) if d.is_dir()}


def compilers_of_entries(arch: str, root: Path | None = None) -> dict[str, int]:
    """``{compiler fingerprint: entries}`` of the ``arch`` entries on disk, read from their headers (an
    entry whose header does not parse counts as ``"unreadable"``); compiles and verifies nothing."""
    counts: dict[str, int] = {}
    directory = cubin_dir(arch, root)
    for path in sorted(directory.glob(f"*{SUFFIX}")) if directory.is_dir() else ():
        try:
            with open(path, "rb") as f:
                magic, head_len = _HEAD.unpack(f.read(_HEAD.size))
                header = json.loads(f.read(head_len)) if magic == MAGIC and head_len <= MAX_HEADER_BYTES else {}
            name = header.get("compiler") if isinstance(header, dict) else None
        except (OSError, ValueError, struct.error):
            name = None
        name = name if isinstance(name, str) else "unreadable"
        counts[name] = counts.get(name, 0) + 1
    return counts


def clear_memory() -> None:
    """Forget in-process entries (tests)."""
    with _MEMORY_LOCK:
        _MEMORY.clear()
    _WARNED.clear()
