"""A minimal, bounds-checked ELF reader (host libraries and CUDA cubins).

Works on any object with ``len()`` and slicing that returns bytes (bytes, memoryview, or the
sparse `SpanStore` used for streamed libraries and cubins). Every offset and size read from the
file is checked against the data before use; inconsistencies raise `MalformedBinaryError`.
Tables are read a window at a time, so a huge string or symbol table is never held whole.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from typing import NamedTuple

from .limits import Budget, HostileArchiveError, Limits, MalformedBinaryError
from .stream import WINDOW, context_windows

ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
SHT_SYMTAB, SHT_STRTAB, SHT_NOBITS, SHT_DYNSYM = 2, 3, 8, 11
# a cubin's local- and shared-memory sections (SHT_CUDA_LOCAL, SHT_CUDA_SHARED) describe memory, not file
# bytes: ptxas writes them as NOBITS, some relocatable objects (torch's NVSHMEM) with these types instead
CUDA_NO_FILE_BYTES = (0x70000009, 0x7000000A)
STT_OBJECT, STT_FUNC = 1, 2
SHN_UNDEF, SHN_XINDEX = 0, 0xFFFF
MAX_NAME = 1 << 20  # symbol name bytes read (real: 172); each KiB examined is budgeted


class Section(NamedTuple):  # a tuple: cubins have thousands of sections
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


class Segment(NamedTuple):
    type: int
    flags: int
    offset: int
    vaddr: int
    file_size: int


PT_LOAD, PT_DYNAMIC = 1, 2
DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_GNU_HASH = 4, 5, 6, 10, 0x6FFFFEF5


class Symbol(NamedTuple):
    name: bytes
    size: int
    type: int


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
        (_, self.machine, _, _, phoff, shoff, self.flags, _, phentsize, phnum, shentsize, shnum, shstrndx) = (
            fields
        )
        self.sections = self._read_sections(shoff, shentsize, shnum, shstrndx)
        self.segments = self._read_segments(phoff, phentsize, phnum)

    def _read_segments(self, phoff: int, entsize: int, phnum: int) -> list[Segment]:
        """Program headers (what the loader maps); none in a relocatable object or a cubin
        without them. A table that does not fit is no table (sections still describe the file)."""
        want = 56 if self.is64 else 32
        if not phoff or not phnum or entsize != want or phoff + phnum * entsize > self.size:
            return []
        raw = self._read(phoff, phnum * entsize)
        if self.is64:
            rows = (
                (t, fl, off, va, fsz)
                for t, fl, off, va, _, fsz, _, _ in struct.iter_unpack(self.endian + "IIQQQQQQ", raw)
            )
        else:
            rows = (
                (t, fl, off, va, fsz)
                for t, off, va, _, fsz, _, fl, _ in struct.iter_unpack(self.endian + "IIIIIIII", raw)
            )
        return [Segment(*row) for row in rows if row[2] + row[4] <= self.size]

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
            raise HostileArchiveError(f"{self.what}: {shnum} sections exceed the limit")
        table = self._read(shoff, shnum * entsize)
        raw = list(struct.iter_unpack(fmt, table))
        names = b""
        if 0 < shstrndx < shnum:
            s = raw[shstrndx]
            if s[1] != SHT_NOBITS and s[5] > self.limits.max_section_names:
                raise HostileArchiveError(
                    f"{self.what}: section name table of {s[5]} bytes is over the limit"
                )
            names = self._read(s[4], s[5]) if s[1] != SHT_NOBITS else b""
        decoded: dict[int, str] = {}  # section names sharing an offset share one string
        budget = self.limits.max_section_names
        sections = []
        for i, (name, typ, flags, _addr, off, size, link, _info, _align, ent) in enumerate(raw):
            if self.machine == EM_CUDA and typ in CUDA_NO_FILE_BYTES:
                typ = SHT_NOBITS
            if typ != SHT_NOBITS and i and (off + size > self.size):
                raise MalformedBinaryError(
                    f"{self.what}: truncated ELF (section {i} ends at {off + size}, file has {self.size})"
                )
            text = decoded.get(name)
            if text is None:
                text = decoded[name] = cstr(names, name).decode("latin-1")
                budget -= len(text)
                if budget < 0:
                    raise HostileArchiveError(
                        f"{self.what}: section names total more than {self.limits.max_section_names:,} bytes"
                    )
            sections.append(Section(i, text, typ, flags, off, size, link, ent))
        return sections

    # -- queries ----------------------------------------------------------------------------
    def section(self, name: str) -> Section | None:
        for s in self.sections:
            if s.name == name:
                return s
        return None

    def section_data(self, sec: Section) -> bytes:
        return self._read(sec.offset, sec.file_size)

    def chunks(self, sec: Section, step: int = WINDOW):
        """(file offset, bytes) of the section, `step` bytes at a time."""
        end = sec.offset + sec.file_size
        for at in range(sec.offset, end, step):
            yield at, self._read(at, min(step, end - at))

    def linked(self, sec: Section) -> Section:
        if not 0 < sec.link < len(self.sections):
            raise MalformedBinaryError(f"{self.what}: {sec.name} links to missing section {sec.link}")
        return self.sections[sec.link]

    def string_at(self, strtab: Section, off: int, limit: int = MAX_NAME) -> bytes:
        """The NUL-terminated string at `off` in `strtab`, at most `limit` bytes of it."""
        if off >= strtab.file_size:
            raise MalformedBinaryError(f"{self.what}: string offset {off} outside {strtab.name}")
        data = self._read(strtab.offset + off, min(limit, strtab.file_size - off))
        end = data.find(b"\x00")
        return data if end < 0 else data[:end]

    def symbol_tables(self) -> list[tuple[str, Section, Section]]:
        """("dynsym"|"symtab", symbol table, its string table) found as the loader and linkers
        find them: sections by type (whatever their names), and the dynamic segment's
        DT_SYMTAB/DT_STRTAB (a library may have no section headers, or mislabelled ones); each
        table once."""
        tables, seen = [], set()
        for sec in self.sections:
            if sec.type in (SHT_DYNSYM, SHT_SYMTAB) and sec.offset not in seen:
                seen.add(sec.offset)
                tables.append(("dynsym" if sec.type == SHT_DYNSYM else "symtab", sec, self.linked(sec)))
        dynamic = self.dynamic_symbols()
        if dynamic is not None and dynamic[0].offset not in seen:
            tables.append(("dynsym", *dynamic))
        return tables

    def _file_offset(self, vaddr: int) -> int:
        for seg in self.segments:
            if seg.type == PT_LOAD and seg.vaddr <= vaddr < seg.vaddr + seg.file_size:
                return seg.offset + vaddr - seg.vaddr
        raise MalformedBinaryError(f"{self.what}: address {vaddr:#x} is in no loadable segment")

    def dynamic_symbols(self) -> tuple[Section, Section] | None:
        """(symbol table, string table) named by the dynamic segment, as synthetic sections;
        the symbol count from DT_HASH (nchain) or DT_GNU_HASH (the last chain's end)."""
        seg = next((s for s in self.segments if s.type == PT_DYNAMIC), None)
        if seg is None:
            return None
        word = 8 if self.is64 else 4
        fmt = self.endian + ("qQ" if self.is64 else "iI")
        tags: dict[int, int] = {}
        for at in range(seg.offset, seg.offset + min(seg.file_size, 1 << 16), 2 * word):
            tag, val = struct.unpack(fmt, self._read(at, 2 * word))
            if tag == 0:
                break
            tags.setdefault(tag, val)
        if DT_SYMTAB not in tags or DT_STRTAB not in tags:
            return None
        symoff, stroff = self._file_offset(tags[DT_SYMTAB]), self._file_offset(tags[DT_STRTAB])
        strsz = min(tags.get(DT_STRSZ, 0), self.size - stroff)
        if DT_HASH in tags:
            count = struct.unpack(self.endian + "I", self._read(self._file_offset(tags[DT_HASH]) + 4, 4))[0]
        elif DT_GNU_HASH in tags:
            count = self._gnu_hash_count(self._file_offset(tags[DT_GNU_HASH]), word)
        else:
            return None
        entsize = 24 if self.is64 else 16
        if count > self.limits.max_symbols:
            raise HostileArchiveError(f"{self.what}: dynamic symbol table has too many symbols")
        symtab = Section(-1, "dynamic DT_SYMTAB", SHT_DYNSYM, 0, symoff, count * entsize, -1, entsize)
        strtab = Section(-1, "dynamic DT_STRTAB", SHT_STRTAB, 0, stroff, max(strsz, 0), -1, 1)
        return symtab, strtab

    def _gnu_hash_count(self, at: int, word: int) -> int:
        """Symbols a DT_GNU_HASH table covers: past the highest bucket, to its chain's end."""
        nbuckets, symoffset, bloom, _ = struct.unpack(self.endian + "IIII", self._read(at, 16))
        if nbuckets > self.limits.max_symbols or bloom > self.limits.max_symbols:
            raise HostileArchiveError(f"{self.what}: GNU hash table over the symbol limit")
        buckets_at = at + 16 + bloom * word
        buckets = array("I", self._read(buckets_at, 4 * nbuckets))
        if self.endian == ">":
            buckets.byteswap()
        last = max(buckets, default=0)
        if last < symoffset:
            return symoffset
        chain_at = buckets_at + 4 * nbuckets
        for i in range(last - symoffset, self.limits.max_symbols):
            (value,) = struct.unpack(self.endian + "I", self._read(chain_at + 4 * i, 4))
            if value & 1:
                return symoffset + i + 1
        raise HostileArchiveError(f"{self.what}: GNU hash chain over the symbol limit")

    def iter_symbols(
        self,
        sec: Section,
        wanted_names: HitStrings | None = None,
        budget: Budget | None = None,
        strtab: Section | None = None,
    ):
        """Defined symbols of a SYMTAB/DYNSYM section, each distinct name once, read a window at
        a time with the columns cut out in C (a row costs one budgeted step, whatever the table
        holds); with `wanted_names`, only those whose name contains one of the hits."""
        strtab = strtab or self.linked(sec)
        entsize = 24 if self.is64 else 16
        if sec.size % entsize:
            raise MalformedBinaryError(f"{self.what}: {sec.name} size is not a multiple of {entsize}")
        if sec.size // entsize > self.limits.max_symbols:
            raise HostileArchiveError(f"{self.what}: {sec.name} has too many symbols")
        budget = budget or Budget()
        seen: set[int] = set()
        for _, data in self.chunks(sec, (WINDOW // entsize) * entsize):
            budget.step(len(data) // entsize, self.what)
            names, shndx, info, sizes = self._symbol_columns(data)
            defined = {off for off, ndx in zip(names, shndx) if ndx != SHN_UNDEF} - seen
            if wanted_names is not None:
                defined = {off for off in defined if wanted_names.covers(off)}
            if not defined:
                continue
            for i, off in enumerate(names):
                if off in defined and shndx[i] != SHN_UNDEF:
                    defined.discard(off)
                    seen.add(off)
                    yield Symbol(self.string_at(strtab, off), sizes[i], info[i] & 0xF)

    def _symbol_columns(self, data: bytes):
        """(st_name, st_shndx, st_info, st_size) columns of whole symbol-table rows."""
        swap = (self.endian == "<") != (sys.byteorder == "little")
        words, halves = array("I", data), array("H", data)
        if swap:
            words.byteswap()
            halves.byteswap()
        if self.is64:
            sizes = array("Q", data)
            if swap:
                sizes.byteswap()
            return words[0::6], halves[3::12], data[4::24], sizes[2::3]
        return words[0::4], halves[7::8], data[12::16], words[2::4]


def cstr(buf: bytes, off: int, limit: int = 1 << 16) -> bytes:
    """NUL-terminated string at `off` (empty if `off` is out of range)."""
    if off >= len(buf):
        return b""
    end = buf.find(b"\x00", off, off + limit)
    return buf[off : end if end >= 0 else min(len(buf), off + limit)]


class HitStrings:
    """The strings of a string table that hold a literal of `rules`, to select the symbols
    whose names contain one: one (start, last hit) interval per string, at most
    `limits.max_hit_strings`. The table is read a window at a time and each string's bytes
    once, so time is linear and memory bounded whatever the table holds.

    A name starting at `off` contains a hit iff an interval has start <= off <= last hit.
    """

    STEP = WINDOW  # table bytes read at a time

    def __init__(self, elf: ElfFile, strtab: Section, rules, limits: Limits, budget: Budget | None = None):
        budget = budget or Budget()
        self.starts, self.lasts = array("q"), array("q")
        base0 = strtab.offset
        last_nul = -1  # offset in the table of the last NUL before the current window
        windows = context_windows(elf.chunks(strtab, self.STEP), rules.longest_literal)
        for base, data, lo, hi in windows:
            find = rules.finder(data, lo, hi)
            p = find.find(lo)
            while p >= 0:
                nul = data.rfind(b"\x00", 0, p)
                start = base - base0 + nul + 1 if nul >= 0 else last_nul + 1
                end = data.find(b"\x00", p)  # the string's end, or past this window
                stop = hi if end < 0 else min(end, hi)
                nxt = find.find(p + 1)
                last = base - base0 + (p if nxt < 0 or nxt >= stop else find.last(nxt, stop))
                if self.starts and self.starts[-1] == start:
                    self.lasts[-1] = last
                elif len(self.starts) >= limits.max_hit_strings:
                    raise HostileArchiveError(
                        f"{elf.what}: more than {limits.max_hit_strings:,} strings in {strtab.name} "
                        "hold retired op names (hostile?)"
                    )
                else:
                    budget.count(limits, elf.what)
                    self.starts.append(start)
                    self.lasts.append(last)
                if end < 0:
                    break
                p = find.find(end)
            nul = data.rfind(b"\x00", 0, hi)
            if nul >= 0:
                last_nul = base - base0 + nul

    def __bool__(self) -> bool:
        return bool(self.starts)

    def covers(self, off: int) -> bool:
        i = bisect_right(self.starts, off) - 1
        return i >= 0 and self.lasts[i] >= off
