"""Archives inside a wheel (a vendored .whl/.zip/.egg/.jar, a .tar/.tar.gz of libraries) are
read as forward-only streams and their members scanned like the wheel's own, so compiled code
cannot hide there. Nothing is written to disk.

A nested zip of at most `ZIP_IN_MEMORY` bytes (TorchScript archives, small vendored wheels) is
read into memory and opened like the wheel itself (central directory, same checks). A larger
one is read by its local headers, in order: declared sizes get the same limits as the wheel's
members, data is inflated with the same bounded, CRC-checked reader; a member whose sizes
follow its data (a data descriptor, flag bit 3) cannot be delimited that way and is refused.
A tar is read with
tarfile's stream mode; a gzip/bz2/xz layer is decompressed here so its ratio can be bounded
like a zip member's. Nesting deeper than `MAX_DEPTH` is refused. Evidence from inside is
prefixed with the inner path.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import struct
import tarfile
import zipfile
import zlib

from .limits import NESTED_MEMBER_WEIGHT, AuditInputError, HostileArchiveError, check_ratio
from .stream import SubReader
from .wheel import Member, MemberStream, WheelArchive, check_name, check_sizes, open_member

MAX_DEPTH = 3
ZIP_IN_MEMORY = 16 << 20
ZIP_MAGIC = b"PK\x03\x04"
_ZIP_END = (b"PK\x01\x02", b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07")  # central directory, EOCD
_TAR_NAMES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_OPENERS = {
    b"\x1f\x8b": lambda f: gzip.GzipFile(fileobj=f, mode="rb"),
    b"BZh": lambda f: bz2.BZ2File(f, "rb"),
    b"\xfd7zXZ\x00": lambda f: lzma.LZMAFile(f, "rb"),
}


def archive_kind(name: str, head: bytes) -> str | None:
    if head[:4] == ZIP_MAGIC:
        return "zip"
    if head[257:262] == b"ustar" or (name.lower().endswith(_TAR_NAMES) and head.startswith(tuple(_OPENERS))):
        return "tar"
    return None


def scan_archive(kind: str, src, col, ctx, depth: int, scan_member) -> None:
    """Scan every file inside the archive `src` (a `stream.Pull`) into `col` (the member's
    collector); `scan_member` is `scan.scan_member` (passed in to avoid an import cycle)."""
    scan = col.scan
    if depth >= MAX_DEPTH:
        raise HostileArchiveError(f"{scan.member}: archives nested more than {MAX_DEPTH} deep")
    try:
        for stream, name, unpacked, compressed in (_zip_members if kind == "zip" else _tar_members)(src, ctx):
            ctx.budget.count(ctx.limits, name, NESTED_MEMBER_WEIGHT)
            _merge(col, scan_member(stream, name, unpacked, compressed, ctx, depth=depth + 1))
        src.skip(src.remaining)  # the rest (a central directory, padding) still gets its CRC checked
    except AuditInputError as exc:
        raise type(exc)(f"{scan.member} (nested {kind}): {exc}") from None
    except (tarfile.TarError, EOFError, OSError, ValueError, struct.error, zlib.error, lzma.LZMAError) as exc:
        raise AuditInputError(f"{scan.member} (nested {kind}): unreadable: {exc}") from None
    scan.stats[f"nested_{kind}"] += 1


def _zip_members(src, ctx):
    """(stream, name, unpacked, compressed) of each file of a zip."""
    if src.remaining <= ZIP_IN_MEMORY:
        data = src.take(src.remaining)
        for m in WheelArchive(src.what, ctx.limits, data=data).members:
            yield open_member(io.BytesIO(data), m), m.name, m.unpacked, m.compressed
        return
    lim, total, count = ctx.limits, 0, 0
    while src.remaining >= 4:
        src.fill(4)
        if bytes(src.buf[:4]) in _ZIP_END:
            break
        head = src.take(30)
        sig, _, flags, method, _, _, crc, csize, usize, n, m = struct.unpack("<4sHHHHHIIIHH", head)
        if sig != ZIP_MAGIC:
            raise AuditInputError(f"bad local header at offset {src.pos - 30}")
        name = src.take(n).decode("utf-8" if flags & 0x800 else "cp437")
        csize, usize = _zip64_sizes(src.take(m), csize, usize)
        check_name(name)
        if flags & 0x1:
            raise AuditInputError(f"encrypted member cannot be read: {name!r}")
        if flags & 0x8:
            raise AuditInputError(
                f"member {name!r} stores its sizes after its data (data descriptor), and the archive is "
                f"larger than {ZIP_IN_MEMORY // (1 << 20)} MiB: it cannot be read as a stream; extract "
                "the archive and audit its files"
            )
        count += 1
        if count > lim.max_members:
            raise HostileArchiveError(f"more than {lim.max_members} members")
        if name.endswith("/") and usize == 0:
            src.skip(csize)
            continue
        if method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise AuditInputError(f"member {name!r}: compression method {method} is not supported here")
        total = check_sizes(name, csize, usize, total, lim)
        raw = SubReader(src, csize)
        try:
            yield MemberStream(raw, Member(name, csize, usize, crc=crc, method=method)), name, usize, csize
        except zipfile.BadZipFile as exc:
            raise AuditInputError(f"member {name!r} is corrupt: {exc}") from None
        raw.drain()


def _zip64_sizes(extra: bytes, csize: int, usize: int) -> tuple[int, int]:
    """Sizes from the zip64 extended-information field when the header says 0xFFFFFFFF."""
    at = 0
    while at + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, at)
        if tag == 1:
            values = iter(struct.unpack_from(f"<{min(size, 16) // 8}Q", extra, at + 4))
            usize = next(values, usize) if usize == 0xFFFFFFFF else usize
            csize = next(values, csize) if csize == 0xFFFFFFFF else csize
        at += 4 + size
    return csize, usize


def _tar_members(src, ctx):
    lim, total, count = ctx.limits, 0, 0
    src.fill(6)
    opener = next((o for magic, o in _OPENERS.items() if bytes(src.buf[: len(magic)]) == magic), None)
    raw = SubReader(src, src.remaining)  # the rest of the source, counting what was read
    f = raw if opener is None else _RatioGuard(opener(raw), raw, lim)
    with tarfile.open(fileobj=f, mode="r|") as tf:
        for info in tf:
            count += 1
            if count > lim.max_members:
                raise HostileArchiveError(f"more than {lim.max_members} tar members")
            if not info.isfile():
                continue  # links and devices are never followed or created
            total += info.size
            if info.size > lim.max_member_unpacked or total > lim.max_total_unpacked:
                raise HostileArchiveError(f"tar member {info.name!r} exceeds the size limits (bomb?)")
            yield tf.extractfile(info), info.name, info.size, info.size


class _RatioGuard(io.RawIOBase):
    """A decompressed stream that may not outgrow `max_ratio` x the compressed bytes read."""

    def __init__(self, stream, raw: SubReader, limits):
        self._stream, self._raw, self._limits = stream, raw, limits
        self._produced = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._produced += len(data)
        check_ratio(self._produced, self._raw.consumed, self._limits, "compressed tar stream")
        return data


def _merge(col, inner) -> None:
    outer = col.scan
    for hit in inner.hits:
        hit.evidence = f"{inner.member}: {hit.evidence}"
        col.hit(hit)
    outer.blobs.extend(inner.blobs)
    for r in inner.routed:
        r["member"] = f"{outer.member}!{r['member']}"
        outer.routed.append(r)
    outer.stats.update(inner.stats)
    outer.stats["nested_members"] += 1
