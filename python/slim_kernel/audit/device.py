"""What a cubin or a PTX module says about its origin: kernels, symbols and translation units.

A cubin names its kernels in `.text.<mangled>` sections and its symbol table; the translation
unit it was compiled from survives in internal-linkage names, which nvcc spells
``_INTERNAL_<hash>_<len>_<file with . -> _>_<hash>`` (``<len>`` counts the file part, so
``_29_dsv3_router_gemm_float_out_cu`` is ``dsv3_router_gemm_float_out.cu``). PTX names its
kernels in `.entry` directives and its target in `.target`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .elf import STT_FUNC, ElfFile, StringHits
from .limits import Limits
from .rules import Rules

_TU = re.compile(rb"_INTERNAL_[0-9a-f]+_(\d{1,4})_")
_PTX_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$%][\w$%]*)")
_PTX_TARGET = re.compile(rb"\.target\s+(sm_\w+)")
_FILE_OK = re.compile(rb"^[A-Za-z0-9_]+$")


@dataclass
class DeviceCode:
    kind: str  # "cubin" | "ptx"
    arch: str
    tus: tuple[str, ...] = ()  # source files, e.g. "dsv3_router_gemm_float_out.cu"
    tu_ops: tuple[str, ...] = ()  # retired ops the TU names match
    names: list[tuple[str, int, str]] = field(default_factory=list)  # (raw name, size, what)
    kernel_count: int = 0


def tu_files(blob: bytes) -> tuple[str, ...]:
    """Distinct translation-unit file names in a string table or PTX text."""
    found: dict[str, None] = {}
    for m in _TU.finditer(blob):
        n = int(m.group(1))
        raw = blob[m.end() : m.end() + n]
        if n == 0 or len(raw) != n or not _FILE_OK.match(raw):
            continue
        name = raw.decode("ascii")
        for ext in ("_cu", "_cuh", "_cpp"):
            if name.endswith(ext):
                name = name[: -len(ext)] + "." + ext[1:]
                break
        found[name] = None
    return tuple(found)


def _tu_ops(tus: tuple[str, ...], rules: Rules) -> tuple[str, ...]:
    return tuple(dict.fromkeys(op for tu in tus for op in rules.match(tu)))


def cubin_arch(elf: ElfFile) -> str:
    # CUDA ELF ABI v7 (OS/ABI 0x33) keeps the SM in the low byte of e_flags; v8 (0x41) in bits 8-15.
    sm = (elf.flags >> 8) & 0xFF if elf.osabi == 0x41 else elf.flags & 0xFF
    return f"sm_{sm}"


def summarize_cubin(data: bytes, rules: Rules, limits: Limits, what: str, arch: str = "") -> DeviceCode:
    elf = ElfFile(data, limits, what)
    texts = [(s.name[6:], s.size) for s in elf.sections if s.name.startswith(".text.")]
    strtab_sec = elf.section(".strtab")
    strtab = elf.section_data(strtab_sec) if strtab_sec else b""
    tus = tu_files(strtab)
    code = DeviceCode("cubin", arch or cubin_arch(elf), tus, _tu_ops(tus, rules), kernel_count=len(texts))
    if code.tu_ops:  # the whole cubin belongs to a retired op: list every kernel
        code.names = [(name, size, "kernel") for name, size in texts]
    else:
        code.names = [(name, size, "kernel") for name, size in texts if rules.maybe(name.encode("latin-1"))]
    hits = StringHits(strtab, rules.positions(strtab))
    symtab = elf.section(".symtab")
    if hits and symtab is not None:
        seen = {name for name, _, _ in code.names}
        for sym in elf.iter_symbols(symtab, hits):
            name = sym.name.decode("latin-1")
            if sym.defined and sym.type != 3 and name not in seen:
                seen.add(name)
                code.names.append((name, sym.size, "kernel" if sym.type == STT_FUNC else "symbol"))
    return code


def summarize_ptx(text: bytes, rules: Rules, arch: str = "") -> DeviceCode:
    target = _PTX_TARGET.search(text)
    entries = [m.group(1).decode("latin-1") for m in _PTX_ENTRY.finditer(text)]
    tus = tu_files(text)
    code = DeviceCode(
        "ptx",
        arch or (target.group(1).decode().replace("sm_", "compute_") if target else "ptx"),
        tus,
        _tu_ops(tus, rules),
        kernel_count=len(entries),
    )
    code.names = [(e, 0, "entry") for e in entries if code.tu_ops or rules.maybe(e.encode("latin-1"))]
    return code
