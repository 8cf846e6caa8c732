"""Kernel sources: where they live, what they include, and the limits they declare.

A :class:`~slim_kernel.jit.spec.KernelInstance` names its source relative to the shipped
``kernels/`` directory (or as an absolute path, for tests). ``#include "..."`` lines are resolved
against the including file's directory, then ``kernels/``, recursively; the contents of every
resolved file are part of the cache key. Angle-bracket includes (CUDA headers) are covered by
the compiler's version instead.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .spec import KernelInstance

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
SOURCE_SUFFIXES = (".cuh", ".cu")

_INCLUDE_RE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)
_LIMITS_RE = re.compile(r"//\s*slim:limits\b(.*)$", re.MULTILINE)
LIMIT_NAMES = ("max_registers", "max_spill_bytes", "max_smem_static")


def source_path(instance: KernelInstance) -> Path:
    """The file of ``instance.source`` (absolute paths are used as given)."""
    path = Path(instance.source)
    if not path.is_absolute():
        path = KERNELS_DIR / path
    if not path.is_file():
        raise FileNotFoundError(f"kernel source {instance.source!r} not found (looked at {path})")
    return path


def include_dirs(instance: KernelInstance) -> list[Path]:
    """User include directories passed to the compiler: the source's own dir, then ``kernels/``."""
    dirs = [source_path(instance).parent]
    if KERNELS_DIR not in dirs:
        dirs.append(KERNELS_DIR)
    return dirs


def source_closure(path: Path, search: list[Path] | None = None) -> list[tuple[str, bytes]]:
    """``(name, contents)`` of ``path`` and every file it ``#include "..."``s, recursively, in a
    deterministic order. Names are relative to their search dir so the key is path-independent."""
    search = list(search) if search is not None else [KERNELS_DIR]
    seen: dict[Path, str] = {}
    out: list[tuple[str, bytes]] = []

    def visit(file: Path, name: str) -> None:
        file = file.resolve()
        if file in seen:
            return
        seen[file] = name
        data = file.read_bytes()
        out.append((name, data))
        for match in _INCLUDE_RE.finditer(data):
            inc = match.group(1).decode()
            for base in (file.parent, *search):
                candidate = base / inc
                if candidate.is_file():
                    visit(candidate, inc)
                    break
            # unresolved quoted includes are CUDA/system headers: covered by the compiler version

    visit(path, path.name)
    return out


def source_digest(instance: KernelInstance) -> str:
    """sha256 over the source and everything it includes (names and contents)."""
    path = source_path(instance)
    h = hashlib.sha256()
    for name, data in source_closure(path, include_dirs(instance)):
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return h.hexdigest()


def declared_limits(instance_or_path: KernelInstance | Path | str) -> dict[str, int]:
    """Resource limits from the source's ``// slim:limits key=N ...`` lines (any subset)."""
    path = (source_path(instance_or_path) if isinstance(instance_or_path, KernelInstance)
            else Path(instance_or_path))
    limits: dict[str, int] = {}
    for match in _LIMITS_RE.finditer(path.read_text()):
        for item in match.group(1).split():
            name, sep, value = item.partition("=")
            if not sep or name not in LIMIT_NAMES:
                raise ValueError(f"{path.name}: bad slim:limits item {item!r}; expected "
                                 f"{'|'.join(LIMIT_NAMES)}=N")
            try:
                limits[name] = int(value)
            except ValueError:
                raise ValueError(f"{path.name}: slim:limits {name} must be an integer, got {value!r}") from None
    return limits


def shipped_sources() -> list[Path]:
    """Every kernel source shipped as package data."""
    if not KERNELS_DIR.is_dir():
        return []
    return sorted(p for p in KERNELS_DIR.iterdir() if p.suffix in SOURCE_SUFFIXES)
