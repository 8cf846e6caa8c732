"""A minimal, bounds-checked ELF reader (host libraries and CUDA cubins).

Works on any object with ``len()`` and slicing that returns bytes (bytes, memoryview, or the
sparse `SpanStore` used for streamed host libraries). Every offset and size read from the file is
checked against the data before use; inconsistencies raise `MalformedBinaryError`.
"""

from __future__ import annotations

import struct
from bisect import bisect_left
from dataclasses import dataclass

from .limits import Limits, MalformedBinaryError

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS, SHT_DYNSYM = 2, 3, 8, 11
STT_OBJECT, STT_FUNC = 1, 2
SHN_UNDEF, SHN_XINDEX = 0, 0xFFFF


@dataclass(frozen=True)
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    entsize: int

    @property
    def file_size(self) -> int:
        return 0 if self.type == SHT_NOBITS else self.size


@dataclass(frozen=True)
class Symbol:
    name: bytes
    value: int
    size: int
    type: int
    bind: int
    shndx: int

    @property
    def defined(self) -> bool:
        return self.shndx != SHN_UNDEF


class ElfFile:
    def __init__(self, data, limits: Limits | None = None, what: str = "ELF"):
        self.data = data
        self.what = what
        self.limits = limits or Limits()
        self.size = len(data)
        ident = self._read(0, 16)
        if ident[:4] != ELF_MAGIC:
            raise MalformedBinaryError(f"{what}: not an ELF file")
        cls, enc = ident[4], ident[5]
        if cls not in (1, 2) or enc not in (1, 2):
            raise MalformedBinaryError(f"{what}: bad ELF class/encoding ({cls}, {enc})")
        self.is64 = cls == 2
        self.endian = "<" if enc == 1 else ">"
        self.osabi, self.abiversion = ident[7], ident[8]
        ident = self._read(0, 64 if self.is64 else 52)
        if self.is64:
            fields = struct.unpack_from(self.endian + "HHIQQQIHHHHHH", ident, 16)
        else:
            fields = struct.unpack_from(self.endian + "HHIIIIIHHHHHH", ident, 16)
        (_, self.machine, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum, shstrndx) = fields
        self.sections = self._read_sections(shoff, shentsize, shnum, shstrndx)

    # -- raw access -------------------------------------------------------------------------
    def _read(self, off: int, n: int) -> bytes:
        if off < 0 or n < 0 or off + n > self.size:
            raise MalformedBinaryError(
                f"{self.what}: truncated ELF (needs bytes {off}..{off + n}, file has {self.size})"
            )
        return bytes(self.data[off : off + n])

    def _read_sections(self, shoff: int, entsize: int, shnum: int, shstrndx: int) -> list[Section]:
        if shoff == 0:
            return []
        want = 64 if self.is64 else 40
        if entsize != want:
            raise MalformedBinaryError(f"{self.what}: section header size {entsize}, expected {want}")
        fmt = self.endian + ("IIQQQQIIQQ" if self.is64 else "IIIIIIIIII")
        first = struct.unpack(fmt, self._read(shoff, entsize))
        if shnum == 0:
            shnum = first[5]  # extended numbering: sh_size of section 0
        if shstrndx == SHN_XINDEX:
            shstrndx = first[6]
        if shnum > self.limits.max_sections:
            raise MalformedBinaryError(f"{self.what}: {shnum} sections exceed the limit")
        table = self._read(shoff, shnum * entsize)
        raw = [struct.unpack_from(fmt, table, i * entsize) for i in range(shnum)]
        names = b""
        if 0 < shstrndx < shnum:
            s = raw[shstrndx]
            names = self._read(s[4], s[5]) if s[1] != SHT_NOBITS else b""
        sections = []
        for i, (name, typ, flags, _addr, off, size, link, _info, _align, ent) in enumerate(raw):
            if typ != SHT_NOBITS and i and (off + size > self.size):
                raise MalformedBinaryError(
                    f"{self.what}: truncated ELF (section {i} ends at {off + size}, file has {self.size})"
                )
            sections.append(Section(i, cstr(names, name).decode("latin-1"), typ, flags, off, size, link, ent))
        return sections

    # -- queries ----------------------------------------------------------------------------
    def section(self, name: str) -> Section | None:
        for s in self.sections:
            if s.name == name:
                return s
        return None

    def section_data(self, sec: Section) -> bytes:
        return self._read(sec.offset, sec.file_size)

    def linked_strtab(self, sec: Section) -> bytes:
        if not 0 < sec.link < len(self.sections):
            raise MalformedBinaryError(f"{self.what}: {sec.name} links to missing section {sec.link}")
        return self.section_data(self.sections[sec.link])

    def iter_symbols(self, sec: Section, wanted_names: StringHits | None = None):
        """Symbols of a SYMTAB/DYNSYM section; with `wanted_names`, only those whose name
        contains one of the hits (a cheap prefilter for huge tables)."""
        strtab = self.linked_strtab(sec)
        entsize = 24 if self.is64 else 16
        if sec.size % entsize:
            raise MalformedBinaryError(f"{self.what}: {sec.name} size is not a multiple of {entsize}")
        if sec.size // entsize > self.limits.max_symbols:
            raise MalformedBinaryError(f"{self.what}: {sec.name} has too many symbols")
        data = self.section_data(sec)
        if self.is64:
            rows = ((n, v, s, i, x) for n, i, _o, x, v, s in struct.iter_unpack(self.endian + "IBBHQQ", data))
        else:
            rows = ((n, v, s, i, x) for n, v, s, i, _o, x in struct.iter_unpack(self.endian + "IIIBBH", data))
        for name_off, value, size, info, shndx in rows:
            if wanted_names is not None and not wanted_names.covers(name_off):
                continue
            if name_off >= len(strtab):
                raise MalformedBinaryError(f"{self.what}: symbol name offset {name_off} outside {sec.name}")
            yield Symbol(cstr(strtab, name_off), value, size, info & 0xF, info >> 4, shndx)


def cstr(buf: bytes, off: int, limit: int = 1 << 16) -> bytes:
    """NUL-terminated string at `off` (empty if `off` is out of range)."""
    if off >= len(buf):
        return b""
    end = buf.find(b"\x00", off, off + limit)
    return buf[off : end if end >= 0 else min(len(buf), off + limit)]


class StringHits:
    """Positions of pattern hits in a string table, to select the strings that contain them.

    A symbol whose name starts at `off` contains a hit at `h >= off` iff no NUL lies between:
    that is, the enclosing string of `h` starts at or before `off`.
    """

    def __init__(self, table: bytes, positions: list[int]):
        self.table = table
        self.hits = sorted(positions)
        self.starts = [table.rfind(b"\x00", 0, h) + 1 for h in self.hits]

    def __bool__(self) -> bool:
        return bool(self.hits)

    def covers(self, off: int) -> bool:
        i = bisect_left(self.hits, off)
        return i < len(self.hits) and self.starts[i] <= off

    def strings(self) -> list[tuple[int, bytes]]:
        """The distinct enclosing strings (offset, bytes)."""
        seen = dict.fromkeys(self.starts)
        return [(s, cstr(self.table, s)) for s in seen]
