"""Device code wherever it sits in a member: fatbin containers and raw cubins (an ELF image for
EM_CUDA, as TensorRT-LLM-style ``unsigned char cubin[]`` arrays or cache files hold them) are
searched for in every byte of every member, in one forward pass (`device_split`).

A header is checked before it is trusted: a fatbin header must declare a size that fits and a
first entry that parses, a cubin header must be a 64-bit little-endian ELF for EM_CUDA whose
tables (and the sections they place) fit in the member. In a host library or a shipped fatbin a
header that fails the check is malformed input (exit 2; a fatbin is then parsed by
`fatbin.read_container`, whose error says precisely what is wrong); anywhere else (a .pyc
holding the fatbin magic as a constant, a data file) it is only a mention.
"""

from __future__ import annotations

import struct
import sys
from array import array
from itertools import compress
from operator import add, not_

from . import fatbin, ltoir
from .device import summarize_cubin, summarize_ptx
from .elf import CUDA_NO_FILE_BYTES, ELF_MAGIC, EM_CUDA, SHT_NOBITS
from .limits import UNPARSABLE, MalformedBinaryError, unparsable_reason
from .stream import CHUNK, SpanStore

CUBIN_HEADER = 64
TABLES_READ = 1 << 20  # header table bytes read ahead to size a raw cubin whose tables come first
LOOKAHEAD = 16 + fatbin.ENTRY_BASE  # bytes a header check reads
_EM_CUDA = EM_CUDA.to_bytes(2, "little")
_NO_FILE_BYTES = frozenset((SHT_NOBITS, *CUDA_NO_FILE_BYTES))  # section types that occupy no bytes


def device_split(src, col, layers, strict: bool):
    """Yield (offset, bytes) of every byte of `src` (a `stream.Pull`) outside fatbin containers
    (cubins are yielded too: they may sit inside a data section), recording the device code
    found into `col`. `layers(kind)`: (layer for translation units, layer for names) of code of
    that kind (`"cubin"` for a raw cubin, `"fatbin-cubin"`/`"fatbin-ptx"` for entries)."""
    stats = col.scan.stats
    fat = _FatbinSearch()
    while src.remaining:
        avail = src.fill(CHUNK)
        i, kind = _next_magic(src, fat)
        more = src.remaining > avail
        if i < 0 or (more and i + LOOKAHEAD > avail):  # none, or too near the buffer's end to check
            n = i if i >= 0 else avail - LOOKAHEAD if more else avail
            if n > 0:
                yield src.pos, src.take(n)
            continue
        if i:
            yield src.pos, src.take(i)
        at = src.pos
        col.ctx.budget.count(col.ctx.limits, src.what)  # each magic costs a header check, however small
        # strict: a fatbin header is parsed as one, so the container parser says what is wrong
        why, size = ("", 0) if strict and kind == "fatbin" else _implausible(kind, src, col.ctx.limits)
        if why:
            if strict:
                raise MalformedBinaryError(f"{src.what}: {kind} header at offset {at}: {why}")
            col.mention("", "binary-magic", f"{kind} magic at offset {at} is not a valid {kind}: {why}")
            yield at, src.take(4)
            continue
        if kind == "fatbin":
            stats["fatbin_containers"] += 1
            stats["fatbin_bytes"] += fatbin.read_container(
                src, col.ctx.limits, lambda e, p: _entry(e, p, col, layers)
            )
        else:
            stats["raw_cubins"] += 1
            pieces = []  # the cubin's bytes also belong to the section around it
            device_code(
                col,
                "cubin",
                _tee(src.pieces(size), pieces),
                size,
                f"{src.what}: cubin at {at}",
                layers("cubin"),
                size,
            )
            yield from pieces


def _tee(pieces, out: list):
    for off, data in pieces:
        out.append((off, data))
        yield data


class _FatbinSearch:
    """Where the next fatbin header is, remembered across calls, so the buffer is searched for
    it once however many other magics lie before it (a search per magic is quadratic)."""

    def __init__(self):
        self.at = -1  # absolute offset of a checked header ahead, or -1
        self.clear_to = 0  # absolute offset before which there is none

    def next(self, src) -> int:
        if self.at >= src.pos:
            return self.at - src.pos
        at = fatbin.find_container(src, max(0, self.clear_to - src.pos))
        if at >= 0 and src.buffered - at >= 8:  # checked whole: remembered
            self.at = src.pos + at
        else:  # none (or one cut by the buffer's end, checked again once more is buffered)
            self.at = -1
            self.clear_to = src.pos + (at if at >= 0 else max(src.buffered - 7, 0))
        return at


def _next_magic(src, search: _FatbinSearch) -> tuple[int, str]:
    """The first fatbin header or cubin ELF header buffered in `src` (a `stream.Pull`):
    (offset from its position, "fatbin"|"cubin"), or -1."""
    fat = search.next(src)
    # only before it: back-to-back headers must not rescan the buffer each
    end = fat if fat >= 0 else src.buffered
    at = src.find(ELF_MAGIC, 0, end)
    while at >= 0:
        if src.peek(2, at + 18) == _EM_CUDA or src.buffered - at < 20:
            return at, "cubin"
        at = src.find(ELF_MAGIC, at + 1, end)
    return fat, "fatbin"


def cubin_size(src, room: int) -> int:
    """Bytes of the 64-bit little-endian cubin whose ELF header is at `src.pos` (a `stream.Pull`):
    up to the end of its section and program header tables and of every section and segment they
    place. nvcc writes the tables last, but a relocatable object may put its section table first
    (CUPTI's do) with the sections after it. The tables are read where they end within the first
    `TABLES_READ` bytes and the whole image fits in `room`; otherwise the tables' end stands (a
    section past it is then reported by the ELF reader as truncated)."""
    src.fill(CUBIN_HEADER)
    head = src.peek(CUBIN_HEADER)
    phoff, shoff = struct.unpack_from("<QQ", head, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
    tables = max(shoff + shnum * shentsize, phoff + phnum * phentsize, CUBIN_HEADER)
    if tables > min(TABLES_READ, room) or src.fill(tables) < tables or shentsize != 64:
        return tables
    src.budget.step(shnum + phnum, src.what)
    table = src.peek(shnum * 64, shoff)
    words = _words(table, "I")  # 16 a section: sh_type is the 2nd
    quads = _words(table, "Q")  # 8 a section: sh_offset the 4th, sh_size the 5th
    has_bytes = map(not_, map(_NO_FILE_BYTES.__contains__, words[1::16]))
    ends = list(compress(map(add, quads[3::8], quads[4::8]), has_bytes))
    if phentsize == 56:  # 7 quads a segment: p_offset the 2nd, p_filesz the 5th
        seg = _words(src.peek(phnum * 56, phoff), "Q")
        ends += map(add, seg[1::7], seg[4::7])
    end = max(ends, default=tables)
    return max(end, tables) if end <= room else tables


def _words(data: bytes, code: str) -> array:
    words = array(code, data)
    if sys.byteorder != "little":
        words.byteswap()
    return words


def _implausible(kind: str, src, limits) -> tuple[str, int]:
    """Why the header at `src.pos` cannot be what its magic says ("" if it can), and a cubin's size."""
    head = src.peek(LOOKAHEAD)
    if kind == "fatbin":
        if len(head) < 16:
            return "truncated header", 0
        (size,) = struct.unpack_from("<Q", head, 8)
        if size > src.remaining - 16:
            return f"declares {size:,} bytes of entries, only {src.remaining - 16:,} remain", 0
        if size and len(head) < 16 + fatbin.ENTRY_BASE:
            return "truncated first entry", 0
        if size:
            kind_id, _, hsize, stored = struct.unpack_from("<HHIQ", head, 16)
            if not fatbin.ENTRY_BASE <= hsize <= fatbin.MAX_ENTRY_HEADER or stored > size:
                return "its first entry header is not one", 0
        return "", 0
    if len(head) < CUBIN_HEADER or head[4:6] != b"\x02\x01" or head[18:20] != b"\xbe\x00":
        return "not a 64-bit little-endian ELF header", 0
    if struct.unpack_from("<H", head, 58)[0] != 64 or struct.unpack_from("<H", head, 60)[0] == 0:
        return "no section header table", 0
    size = cubin_size(src, min(src.remaining, limits.max_entry_unpacked))
    if size > src.remaining or size > limits.max_entry_unpacked:
        return f"its tables end at {size:,}, past the {min(src.remaining, limits.max_entry_unpacked):,} bytes there", 0
    return "", size


def _entry(entry: fatbin.Entry, payload, col, layers) -> None:
    col.scan.stats["fatbin_entries"] += 1
    col.scan.stats[f"fatbin_{entry.compression}"] += 1
    what = f"{col.scan.member}: fatbin entry at {entry.offset}"
    stored = entry.header_size + entry.stored
    if entry.kind == "LTO IR":
        col.scan.stats["fatbin_ltoir"] += 1
        _lto_entry(entry, payload, col, layers("fatbin-ltoir"), what, stored)
        return
    if entry.kind not in ("cubin", "ptx"):
        col.unreadable(
            layers("fatbin-cubin")[1],
            f"fatbin entry at {entry.offset} of kind {entry.kind} (not cubin, PTX or LTO IR: its payload is not read)",
        )
        return
    device_code(
        col,
        entry.kind,
        payload,
        entry.unpacked,
        what,
        layers(f"fatbin-{entry.kind}"),
        stored,
        entry.compression,
        entry.arch,
    )


def shipped_ltoir(src, col) -> None:
    """A raw LTO IR module shipped as a file (NVRTC's `-dlto` output), read as the PTX it links to."""
    col.scan.stats["shipped_ltoir"] += 1
    pieces = (piece for _, piece in src.pieces())
    _link_ltoir(col, pieces, src.size, None, "", ("shipped-ltoir",) * 2, "raw LTO IR", col.scan.member, src.size)


def _lto_entry(entry: fatbin.Entry, payload, col, layers, what: str, stored: int) -> None:
    """An LTO IR fatbin entry, handed to nvJitLink whole (header and payload as stored)."""
    label = f"fatbin entry at {entry.offset} (LTO IR)"
    _link_ltoir(col, payload, entry.stored, entry.header, entry.arch, layers, label, what, stored, entry.compression, entry.unpacked)


def _link_ltoir(col, pieces, size, header, arch, layers, label, what, stored, compression="none", unpacked=0) -> None:
    """Hand `size` bytes of LTO IR (`pieces`: a fatbin entry's payload after its `header`, or with
    no header a raw module) to nvJitLink; when the answer comes, the PTX is read as device code
    recorded as that LTO IR, or `label` is listed unreadable with the reason."""
    limits = col.ctx.limits

    def done(ptx: bytes | None, reason: str) -> None:
        if ptx is None:
            return col.unreadable(layers[1], f"{label}: {reason}")
        device_code(col, "ptx", [ptx], len(ptx), what, layers, stored, compression, arch, ltoir_size=unpacked)

    if size > limits.max_lto_entry:
        return done(None, f"{size:,} bytes, over the {limits.max_lto_entry:,}-byte limit for nvJitLink")
    data = b"".join(pieces)
    raw = header is None
    ltoir.LINKER.submit(arch, data if raw else ltoir.wrap(header, data), limits, col.ctx.budget, done, raw=raw)


def device_code(col, kind, windows, size, what, layers, stored, compression="none", arch="", ltoir_size=0) -> None:
    """Summarize a cubin or PTX payload (consecutive windows of bytes) into `col`; `layers` =
    (layer for its translation units, layer for its names). `ltoir_size`: the PTX is what an
    LTO IR entry of that many bytes links to (recorded as that entry)."""
    ctx = col.ctx
    with SpanStore(size, ctx.limits.retained_in_memory, what, ctx.budget) as store:
        at = 0
        for data in windows:
            store.add(at, data)
            at += len(data)
        try:
            if kind == "cubin":
                code = summarize_cubin(store, ctx.rules, ctx.limits, what, arch, ctx.budget)
            else:
                code = summarize_ptx(store, ctx.rules, ctx.limits, what, arch, ctx.budget)
        except UNPARSABLE as exc:  # this payload cannot be parsed: listed, the rest is read on
            col.unreadable(layers[1], unparsable_reason(exc))
            return
        if ltoir_size:
            code.kind, size = "ltoir", ltoir_size
        col.add_device(code, layers, stored, size, compression)
