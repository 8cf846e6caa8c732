"""What a wheel member is: sniffed from its first bytes (never trusted from its name), and for
text, from its path."""

from __future__ import annotations

from . import fatbin, ltoir, nested
from .elf import ELF_MAGIC, EM_CUDA

AR_MAGIC = b"!<arch>\n"
SNIFF = 4096  # bytes looked at to tell a member's kind
_PYTHON = {".py", ".pyi", ".pyx", ".pxd"}
_SOURCES = {".cu", ".cuh", ".h", ".hh", ".hpp", ".cc", ".cpp", ".cxx", ".c", ".inl", ".inc"}
_ROUTED = {**dict.fromkeys(_PYTHON, "python"), **dict.fromkeys(_SOURCES, "jit-source")}  # by suffix
# Mach-O (32/64-bit, either byte order; a universal binary only by its library name: its magic
# is also a Java class file's)
_MACHO = (b"\xfe\xed\xfa\xce", b"\xfe\xed\xfa\xcf", b"\xce\xfa\xed\xfe", b"\xcf\xfa\xed\xfe")


def routed_kind(name: str) -> str:
    """What a text member is, from its path (string operations: called for every member)."""
    if ".dist-info/" in name and any(part.endswith(".dist-info") for part in name.split("/")[:-1]):
        return "metadata"
    base = name[name.rfind("/") + 1 :]
    dot = base.rfind(".")
    suffix = base[dot:].lower() if 0 < dot < len(base) - 1 else ""  # PurePosixPath.suffix
    return _ROUTED.get(suffix, "other")


def classify(name: str, head: bytes) -> str:
    if head[:4] == ELF_MAGIC and len(head) >= 20:
        machine = int.from_bytes(head[18:20], "little" if head[5] != 2 else "big")
        return "cubin" if machine == EM_CUDA else "elf"
    if head[:8] == fatbin.HEADER_PATTERN:
        return "fatbin"
    if head[:8] == AR_MAGIC:
        return "ar"
    if head[:4] == ltoir.NVVM_MAGIC:
        return "ltoir"
    if head[:4] in _MACHO or (head[:4] == b"\xca\xfe\xba\xbe" and name.endswith((".dylib", ".so"))):
        return "macho"
    archive = nested.archive_kind(name, head)
    if archive:
        return archive
    if name.lower().endswith(".ptx"):
        return "ptx"
    if b"\x00" in head and routed_kind(name) == "other":
        return "binary"
    return "text"  # searched for device code like any file, and its lines reported as routed
