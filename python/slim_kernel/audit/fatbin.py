"""NVIDIA fatbin containers: headers, entries and payload decompression.

Layout (little endian), as observed in nvcc 12/13 output and in sgl-kernel wheels:

container header (16 bytes): u32 magic 0xBA55ED50, u16 version 1, u16 header size 16,
u64 size of the entries that follow.

entry header (64 bytes, followed by 0/16/32/48 bytes of extension: 64/80/96/112 seen):
  0 u16 kind (1 PTX, 2 cubin)   4 u32 header size   8 u64 payload size (padded)
 16 u32 compressed size        28 u32 sm arch (90, 100, ...)   40 u64 flags
 56 u64 uncompressed size
flags: 0x2000 LZ4 block payload, 0x8000 zstd frame payload, 0x100000 arch-specific ("a"),
0x200000 family-specific ("f").

Every size is validated against what remains of the container and the member before any
allocation; decompressed sizes are capped by `Limits`.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from .limits import AuditInputError, Limits, MalformedBinaryError

MAGIC = 0xBA55ED50
HEADER_PATTERN = struct.pack("<IHH", MAGIC, 1, 16)
ENTRY_BASE = 64
MAX_ENTRY_HEADER = 4096
FLAG_LZ4, FLAG_ZSTD = 0x2000, 0x8000
FLAG_ARCH_SPECIFIC, FLAG_FAMILY = 0x100000, 0x200000
KINDS = {1: "ptx", 2: "cubin"}


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


def find_container(buf, start: int = 0) -> int:
    return buf.find(HEADER_PATTERN, start)


def arch_label(kind: str, sm: int, flags: int) -> str:
    suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
    return f"{'compute' if kind == 'ptx' else 'sm'}_{sm}{suffix}"


def read_container(src, limits: Limits, on_entry) -> int:
    """Consume one container from `src` (a `stream.Pull` positioned at its header), calling
    `on_entry(entry, payload_bytes)` for each entry with the decompressed payload.
    Returns the container's total size."""
    at = src.pos
    magic, version, hsize, fat_size = struct.unpack("<IHHQ", src.take(16))
    if magic != MAGIC or version != 1 or hsize != 16:
        raise MalformedBinaryError(f"{src.what}: bad fatbin header at offset {at}")
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
        entry, payload = _read_entry(src, end, limits)
        on_entry(entry, payload)
    return 16 + fat_size


def _read_entry(src, end: int, limits: Limits) -> tuple[Entry, bytes]:
    at = src.pos
    head = src.take(ENTRY_BASE)
    kind_id, _, hsize, stored = struct.unpack_from("<HHIQ", head, 0)
    csize, _, _, _, sm = struct.unpack_from("<IIHHI", head, 16)
    flags, _, usize = struct.unpack_from("<QQQ", head, 40)
    if not ENTRY_BASE <= hsize <= MAX_ENTRY_HEADER or at + hsize > end:
        raise MalformedBinaryError(f"{src.what}: fatbin entry at {at} has absurd header size {hsize}")
    if hsize > ENTRY_BASE:
        src.take(hsize - ENTRY_BASE)
    if stored > end - src.pos:
        raise MalformedBinaryError(
            f"{src.what}: fatbin entry at {at} declares a {stored}-byte payload, "
            f"only {end - src.pos} remain in its container"
        )
    if stored > limits.max_entry_unpacked:
        raise MalformedBinaryError(
            f"{src.what}: fatbin entry at {at} payload of {stored} bytes is over the limit"
        )
    payload = src.take(stored)
    kind = KINDS.get(kind_id, f"kind{kind_id}")
    compression = "lz4" if flags & FLAG_LZ4 else "zstd" if flags & FLAG_ZSTD else "none"
    what = f"{src.what}: fatbin entry at {at}"
    if compression != "none":
        payload = decompress(compression, payload, csize, usize, limits, what)
    entry = Entry(at, kind, arch_label(kind, sm, flags), flags, hsize, stored, compression, len(payload))
    return entry, payload


def decompress(method: str, payload: bytes, csize: int, usize: int, limits: Limits, what: str) -> bytes:
    if not 0 < csize <= len(payload):
        raise MalformedBinaryError(f"{what}: compressed size {csize} outside its {len(payload)}-byte payload")
    if usize > limits.max_entry_unpacked or usize > max(csize, 1) * limits.max_entry_ratio:
        raise MalformedBinaryError(
            f"{what}: declares {usize} bytes uncompressed from {csize} (decompression bomb?)"
        )
    data = payload[:csize]
    if method == "lz4":
        try:
            import lz4.block
        except ImportError:
            raise AuditInputError(
                f"{what}: LZ4 payload needs the 'lz4' package, a dependency of slim-kernel (pip install lz4)"
            ) from None
        try:
            out = lz4.block.decompress(data, uncompressed_size=usize)
        except Exception as exc:  # lz4.block.LZ4BlockError and size errors
            raise MalformedBinaryError(f"{what}: corrupt LZ4 payload: {exc}") from None
    else:
        try:
            import zstandard
        except ImportError:
            raise AuditInputError(
                f"{what}: zstd payload needs the 'zstandard' package, a dependency of slim-kernel (pip install zstandard)"
            ) from None
        try:
            parts, got = [], 0
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
                while got <= usize:
                    part = reader.read(usize + 1 - got)
                    if not part:
                        break
                    parts.append(part)
                    got += len(part)
            out = b"".join(parts)
        except zstandard.ZstdError as exc:
            raise MalformedBinaryError(f"{what}: corrupt zstd payload: {exc}") from None
    if len(out) != usize:
        raise MalformedBinaryError(f"{what}: decompressed to {len(out)} bytes, header says {usize}")
    return out
