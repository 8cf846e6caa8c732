"""NVIDIA fatbin containers: headers, entries and payload decompression.

Layout (little endian), as observed in nvcc 12/13 output and in sgl-kernel wheels:

container header (16 bytes): u32 magic 0xBA55ED50, u16 version 1, u16 header size 16,
u64 size of the entries that follow.

entry header (64 bytes, followed by 0/16/32/48 bytes of extension: 64/80/96/112 seen):
  0 u16 kind (1 PTX, 2 cubin, 8 LTO IR)   4 u32 header size   8 u64 payload size (padded)
 16 u32 compressed size        28 u32 sm arch (90, 100, ...)   40 u64 flags
 56 u64 uncompressed size
flags: 0x2000 LZ4 block payload, 0x8000 zstd frame payload, 0x100000 arch-specific ("a"),
0x200000 family-specific ("f"); a compressed LTO IR entry also has 0x10000 and its payload is
obfuscated (only nvJitLink reads it: `ltoir.py`).

Every size is validated against what remains of the container and the member before any
allocation; payloads are decompressed in windows as they are read (zstd: output may not outgrow
1000 x the input read so far; an LZ4 block decompresses in one piece up to `max_lz4_entry`, and a
larger one through `lz4block`'s 64 KiB window).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import lz4block
from .limits import HostileArchiveError, Limits, MalformedBinaryError, MissingDependencyError
from .stream import WINDOW, SubReader

MAGIC = 0xBA55ED50
HEADER_PATTERN = struct.pack("<IHH", MAGIC, 1, 16)
ENTRY_BASE = 64
MAX_ENTRY_HEADER = 4096
FLAG_LZ4, FLAG_ZSTD = 0x2000, 0x8000
FLAG_ARCH_SPECIFIC, FLAG_FAMILY = 0x100000, 0x200000
KINDS = {1: "ptx", 2: "cubin", 8: "LTO IR"}  # LTO IR: nvcc -dlto, cuFFT/cuSPARSE callbacks
ZSTD_READ = 16 << 10  # compressed bytes read at a time: a bomb is caught within 1000 x this


def _missing(what: str, kind: str, package: str) -> MissingDependencyError:
    return MissingDependencyError(
        f"{what}: reading {kind} payloads needs the '{package}' package, a dependency of slim-kernel "
        f"that is not installed: pip install {package}"
    )


@dataclass(frozen=True)
class Entry:
    offset: int  # absolute offset of the entry header in the member
    kind: str  # "ptx" | "cubin" | "kind<n>"
    arch: str  # "sm_90a", "compute_100", ...
    flags: int
    header_size: int
    stored: int  # payload bytes as stored (padded)
    compression: str  # "none" | "lz4" | "zstd"
    unpacked: int  # payload bytes after decompression
    header: bytes = b""  # the entry header as stored (an LTO IR entry is handed to nvJitLink whole)


def find_container(src, start: int = 0) -> int:
    """The first container header buffered in `src` (a `stream.Pull`) from `start`, or -1.
    Searched by its first 4 bytes (the magic: bytes.find is slow for a pattern ending in a byte
    the data is full of, like the header's trailing zero in zero-filled data), then checked whole."""
    at = src.find(HEADER_PATTERN[:4], start)
    while at >= 0 and src.peek(4, at + 4) != HEADER_PATTERN[4:] and src.buffered - at >= 8:
        at = src.find(HEADER_PATTERN[:4], at + 1)
    return at


def arch_label(kind: str, sm: int, flags: int) -> str:
    suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
    return f"{'compute' if kind == 'ptx' else 'sm'}_{sm}{suffix}"


def read_container(src, limits: Limits, on_entry) -> int:
    """Consume one container from `src` (a `stream.Pull` positioned at its header), calling
    `on_entry(entry, payload)` for each entry, where `payload` yields the decompressed payload
    in windows of at most `stream.WINDOW` bytes (what the callback leaves unread is skipped,
    undecompressed). Returns the container's total size."""
    at = src.pos
    magic, version, hsize, fat_size = struct.unpack("<IHHQ", src.take(16))
    if magic != MAGIC or version != 1 or hsize != 16:
        raise MalformedBinaryError(f"{src.what}: bad fatbin header at offset {at}")
    src.budget.count(limits, src.what)
    if fat_size > src.remaining:
        raise MalformedBinaryError(
            f"{src.what}: fatbin header at offset {at} declares {fat_size} bytes of entries, "
            f"only {src.remaining} remain"
        )
    end = src.pos + fat_size
    while src.pos < end:
        if end - src.pos < ENTRY_BASE:
            tail = src.take(end - src.pos)
            if tail.strip(b"\x00"):
                raise MalformedBinaryError(
                    f"{src.what}: {len(tail)} stray bytes at the end of fatbin at {at}"
                )
            break
        entry, csize = _read_entry(src, end, limits)
        src.budget.count(limits, src.what)
        start = src.pos
        on_entry(entry, _payload(src, entry, csize, limits))
        src.skip(start + entry.stored - src.pos)
    return 16 + fat_size


def _read_entry(src, end: int, limits: Limits) -> tuple[Entry, int]:
    """The entry header (declared sizes checked against the container and `limits`), leaving
    `src` at the payload; returns it and the compressed size."""
    at = src.pos
    head = src.take(ENTRY_BASE)
    kind_id, _, hsize, stored = struct.unpack_from("<HHIQ", head, 0)
    csize, _, _, _, sm = struct.unpack_from("<IIHHI", head, 16)
    flags, _, usize = struct.unpack_from("<QQQ", head, 40)
    what = f"{src.what}: fatbin entry at {at}"
    if not ENTRY_BASE <= hsize <= MAX_ENTRY_HEADER or at + hsize > end:
        raise MalformedBinaryError(f"{what} has absurd header size {hsize}")
    if hsize > ENTRY_BASE:
        head += src.take(hsize - ENTRY_BASE)
    if stored > end - src.pos:
        raise MalformedBinaryError(
            f"{what} declares a {stored}-byte payload, only {end - src.pos} remain in its container"
        )
    if stored > limits.max_entry_unpacked:
        raise HostileArchiveError(f"{what}: payload of {stored} bytes is over the limit")
    kind = KINDS.get(kind_id, f"kind{kind_id}")
    compression = "lz4" if flags & FLAG_LZ4 else "zstd" if flags & FLAG_ZSTD else "none"
    if compression == "none":
        usize = stored
    else:
        _check_declared(compression, stored, csize, usize, limits, what)
    entry = Entry(at, kind, arch_label(kind, sm, flags), flags, hsize, stored, compression, usize, head)
    return entry, csize


def _check_declared(method: str, stored: int, csize: int, usize: int, limits: Limits, what: str) -> None:
    if not 0 < csize <= stored:
        raise MalformedBinaryError(f"{what}: compressed size {csize} outside its {stored}-byte payload")
    if usize > limits.max_entry_unpacked or usize > max(csize, 1) * limits.max_entry_ratio:
        raise HostileArchiveError(
            f"{what}: declares {usize} bytes uncompressed from {csize} (decompression bomb?)"
        )
    if method == "lz4" and csize > usize + usize // 255 + 16:  # LZ4_COMPRESSBOUND
        raise MalformedBinaryError(f"{what}: {csize}-byte LZ4 payload cannot hold {usize} bytes")


def _payload(src, entry: Entry, csize: int, limits: Limits):
    """The payload's windows, decompressed; an LTO IR payload as stored (only nvJitLink reads it:
    compressed, it is also obfuscated)."""
    what = f"{src.what}: fatbin entry at {entry.offset}"
    if entry.compression == "none" or entry.kind == "LTO IR":
        for _, data in src.pieces(entry.stored):
            yield data
    elif entry.compression == "lz4" and entry.unpacked <= limits.max_lz4_entry:
        yield _lz4(src.take(csize), entry.unpacked, what)
    elif entry.compression == "lz4":  # too large for one piece: decoded in bounded memory (slower)
        yield from lz4block.decode(SubReader(src, csize), entry.unpacked, WINDOW, what, src.budget.check_time)
    else:
        yield from _zstd(SubReader(src, csize), entry.unpacked, limits, what)


def _lz4(data: bytes, usize: int, what: str) -> bytes:
    try:
        import lz4.block
    except ImportError:
        raise _missing(what, "LZ4", "lz4") from None
    try:
        out = lz4.block.decompress(data, uncompressed_size=usize)
    except Exception as exc:  # lz4.block.LZ4BlockError and size errors
        raise MalformedBinaryError(f"{what}: corrupt LZ4 payload: {exc}") from None
    if len(out) != usize:
        raise MalformedBinaryError(f"{what}: decompressed to {len(out)} bytes, header says {usize}")
    return out


def _zstd(raw: SubReader, usize: int, limits: Limits, what: str):
    """Stream one zstd frame; its output may not outgrow `max_entry_ratio` x the input read."""
    try:
        import zstandard
    except ImportError:
        raise _missing(what, "zstd", "zstandard") from None
    got = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_size=ZSTD_READ, closefd=False)
        with reader:
            while got <= usize:
                part = reader.read(min(WINDOW, usize + 1 - got))
                if not part:
                    break
                got += len(part)
                if got > max(raw.consumed, 1) * limits.max_entry_ratio:
                    raise HostileArchiveError(
                        f"{what}: zstd payload expands more than {limits.max_entry_ratio:.0f}:1 "
                        "(decompression bomb?)"
                    )
                if got <= usize:
                    yield part
    except zstandard.ZstdError as exc:
        raise MalformedBinaryError(f"{what}: corrupt zstd payload: {exc}") from None
    if got != usize:
        raise MalformedBinaryError(f"{what}: decompressed to {got} bytes, header says {usize}")
