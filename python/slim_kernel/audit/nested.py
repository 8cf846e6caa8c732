"""Archives inside a wheel (a vendored .whl/.zip/.egg/.jar, a .tar/.tar.gz of libraries) are
read as forward-only streams and their members scanned like the wheel's own, so compiled code
cannot hide there. Nothing is written to disk.

A nested zip is copied (into memory up to `ZIP_IN_MEMORY` bytes, else into the private spill
file) and opened like the wheel itself: central directory, same checks, same member reader, so
members with data descriptors (jars, TorchScript archives) are read too. A tar is read with
tarfile's stream mode; a gzip/bz2/xz layer is decompressed here so its ratio can be bounded
(it declares no size); sparse tar members are refused (their holes would be read as zeros).
Nesting deeper than `MAX_DEPTH` is refused. Evidence from inside is prefixed with the inner
path.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import struct
import tarfile
import zlib

from .limits import (
    NESTED_MEMBER_WEIGHT,
    AuditInputError,
    HostileArchiveError,
    MalformedBinaryError,
    MissingDependencyError,
    TimeLimitError,
    check_ratio,
)
from .stream import WINDOW, PrivateSpill, SubReader, copy_to_file
from .wheel import WheelArchive

MAX_DEPTH = 3
ZIP_IN_MEMORY = 16 << 20
ZIP_MAGIC = b"PK\x03\x04"
_TAR_NAMES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_OPENERS = {
    b"\x1f\x8b": lambda f: gzip.GzipFile(fileobj=f, mode="rb"),
    b"BZh": lambda f: bz2.BZ2File(f, "rb"),
    b"\xfd7zXZ\x00": None,  # _XzReader: its decoder memory is capped
}


_FRAMES = {b"\x28\xb5\x2f\xfd": "zstd", b"\x04\x22\x4d\x18": "lz4"}  # a .zst / .lz4 file
_FRAME_SUFFIXES = (".zst", ".zstd", ".lz4")


def archive_kind(name: str, head: bytes) -> str | None:
    if head[:4] == ZIP_MAGIC:
        return "zip"
    if head[:4] in _FRAMES:
        return "compressed"
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
        members = {"zip": _zip_members, "tar": _tar_members, "compressed": _decompressed}[kind]
        for stream, name, unpacked, compressed in members(src, ctx):
            ctx.budget.count(ctx.limits, name, NESTED_MEMBER_WEIGHT)
            ctx.budget.unpack(unpacked, compressed, f"{scan.member}!{name}")
            _merge(col, scan_member(stream, name, unpacked, compressed, ctx, depth=depth + 1))
        src.skip(src.remaining)  # the rest (a central directory, padding) still gets its CRC checked
    except (HostileArchiveError, TimeLimitError) as exc:  # a bound: the wheel is refused
        raise type(exc)(f"{scan.member} (nested {kind}): {exc}") from None
    except AuditInputError as exc:  # a nested archive that cannot be read: this member is unreadable
        raise MalformedBinaryError(f"{scan.member} (nested {kind}): {exc}") from None
    except (tarfile.TarError, EOFError, OSError, ValueError, struct.error, zlib.error, lzma.LZMAError) as exc:
        raise MalformedBinaryError(f"{scan.member} (nested {kind}): unreadable: {exc}") from None
    scan.stats[f"nested_{kind}"] += 1


def _zip_members(src, ctx):
    """(stream, name, unpacked, compressed) of each file of a zip, read by its central directory
    (so members with data descriptors are delimited too) from a copy: in memory up to
    `ZIP_IN_MEMORY` bytes, else in the private spill file (counted against `Limits.max_spill`)."""
    f, owner = copy_to_file(src, ZIP_IN_MEMORY)
    try:
        archive = WheelArchive(src.what, ctx.limits, fileobj=f)
        for m in archive.members:
            yield archive.open(m), m.name, m.unpacked, m.compressed
    finally:
        owner.close()


def _decompressed(src, ctx):
    """The one file inside a zstd or LZ4 frame file (``k.fatbin.zst``, ``libs.tar.lz4``),
    decompressed into memory or the private spill file (ratio-guarded: no declared size)."""
    method = _FRAMES[src.peek(4)]
    raw = SubReader(src, src.remaining)
    try:
        if method == "zstd":
            import zstandard

            dctx = zstandard.ZstdDecompressor(max_window_size=ctx.limits.max_zstd_window)
            stream = dctx.stream_reader(raw, read_across_frames=True)
        else:
            import lz4.frame

            stream = lz4.frame.LZ4FrameFile(raw, "rb")
    except ImportError as exc:
        package = "zstandard" if method == "zstd" else "lz4"
        raise MissingDependencyError(
            f"{src.what}: reading {method} files needs the '{package}' package, a dependency of "
            f"slim-kernel that is not installed: pip install {package}"
        ) from exc
    guarded = _RatioGuard(stream, raw, ctx.limits, f"{method} stream")
    memory, spill, size = io.BytesIO(), None, 0
    try:
        while True:
            try:
                data = guarded.read(WINDOW)
            except AuditInputError:
                raise
            except Exception as exc:  # zstandard.ZstdError, lz4's RuntimeError: corrupt data
                raise AuditInputError(f"corrupt {method} data: {exc}") from None
            if not data:
                break
            size += len(data)
            if size > ctx.limits.max_member_unpacked:
                raise HostileArchiveError(
                    f"{method} stream: more than {ctx.limits.max_member_unpacked:,} bytes"
                )
            if spill is None and size > ZIP_IN_MEMORY:
                spill = PrivateSpill(src.what, src.budget)
                spill.write(memory.getvalue())
            if spill is None:
                memory.write(data)
            else:
                spill.write(data)
        f = memory if spill is None else spill.file
        f.seek(0)
        name = src.what.rsplit("/", 1)[-1]
        inner = name[: name.rfind(".")] if name.lower().endswith(_FRAME_SUFFIXES) else f"{name}!{method}"
        yield f, inner, size, raw.consumed
    finally:
        if spill is not None:
            spill.close()


def _tar_members(src, ctx):
    lim, total, count = ctx.limits, 0, 0
    src.fill(6)
    magic = next((m for m in _OPENERS if src.peek(len(m)) == m), None)
    raw = SubReader(src, src.remaining)  # the rest of the source, counting what was read
    if magic is None:
        f = raw
    else:
        opened = _XzReader(raw, lim.max_lzma_dict) if _OPENERS[magic] is None else _OPENERS[magic](raw)
        f = _RatioGuard(opened, raw, lim, "compressed tar stream")
    with tarfile.open(fileobj=f, mode="r|", tarinfo=_BoundedTarInfo) as tf:
        while (info := tf.next()) is not None:
            tf.members.clear()  # headers are not kept: memory does not grow with the member count
            count += 1
            if count > lim.max_members:
                raise HostileArchiveError(f"more than {lim.max_members} tar members")
            if not info.isfile():
                continue  # links and devices are never followed or created
            if info.issparse():
                raise HostileArchiveError(
                    f"tar member {info.name!r} is sparse ({info.size:,} bytes with holes): not read; "
                    "extract the archive and audit its files"
                )
            total += info.size
            if info.size > lim.max_member_unpacked or total > lim.max_total_unpacked:
                raise HostileArchiveError(f"tar member {info.name!r} exceeds the size limits (bomb?)")
            yield tf.extractfile(info), info.name, info.size, info.size


MAX_TAR_EXTENDED = 1 << 20  # bytes of one GNU long-name/long-link or PAX header record


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile reads a GNU long name or a PAX record whole, whatever size its header declares:
    the size is checked first."""

    def _check_extended(self) -> None:
        if self.size > MAX_TAR_EXTENDED:
            raise HostileArchiveError(
                f"tar extended header ({self.type!r}) of {self.size:,} bytes, over the limit of "
                f"{MAX_TAR_EXTENDED:,} (hostile?)"
            )

    def _proc_gnulong(self, tarfile):
        self._check_extended()
        return super()._proc_gnulong(tarfile)

    def _proc_pax(self, tarfile):
        self._check_extended()
        return super()._proc_pax(tarfile)


class _XzReader(io.RawIOBase):
    """An xz stream read forward, its decoder memory capped near `max_dict` (LZMAFile has no
    memory limit: a header may declare a 1.5 GiB dictionary)."""

    def __init__(self, raw: SubReader, max_dict: int):
        self._raw, self._limit = raw, max_dict
        self._d = lzma.LZMADecompressor(lzma.FORMAT_XZ, memlimit=max_dict + (16 << 20))

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = WINDOW if n is None or n < 0 else n
        while not self._d.eof:
            data = self._raw.read(1 << 16) if self._d.needs_input else b""
            if self._d.needs_input and not data:
                raise EOFError("xz stream ends early")
            try:
                out = self._d.decompress(data, n)
            except lzma.LZMAError as exc:
                if "memory" in str(exc).lower():
                    raise HostileArchiveError(
                        f"xz stream needs more decoder memory than a {self._limit:,}-byte dictionary (hostile?)"
                    ) from None
                raise
            if out:
                return out
        return b""


class _RatioGuard(io.RawIOBase):
    """A decompressed stream that may not outgrow `max_ratio` x the compressed bytes read."""

    def __init__(self, stream, raw: SubReader, limits, what: str):
        self._stream, self._raw, self._limits, self._what = stream, raw, limits, what
        self._produced = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._produced += len(data)
        check_ratio(self._produced, self._raw.consumed, self._limits, self._what)
        return data


def _merge(col, inner) -> None:
    outer = col.scan
    for hit in inner.hits:
        hit.evidence = f"{inner.member}: {hit.evidence}"
        col.hit(hit)
    for m in inner.mentions:
        col.mention(m["op"], m["layer"], f"{inner.member}: {m['evidence']}")
    for u in inner.unreadable:
        col.unreadable(u["layer"], f"{inner.member}: {u['reason']}")
    outer.blobs.extend(inner.blobs)
    for r in inner.routed:
        r["member"] = f"{outer.member}!{r['member']}"
        outer.routed.append(r)
    outer.stats.update(inner.stats)
    outer.stats["nested_members"] += 1
