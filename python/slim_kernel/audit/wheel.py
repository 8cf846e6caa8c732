"""Safe, streaming access to a wheel (zip) archive.

`WheelArchive` validates the central directory before any member is read: not a zip, empty,
too many members, zip bombs (absolute and ratio limits on declared sizes; zipfile itself stops
at the declared size and fails the CRC if the data expands further), overlapping members,
path traversal / absolute names, symlink members and duplicate names are refused with
`AuditInputError` naming the member; so is a WHEEL that is not a regular file (a FIFO or a
device is refused without blocking). Members are read as forward-only streams
(`MemberStream`), never extracted.
"""

from __future__ import annotations

import io
import os
import stat
import struct
import zipfile
import zlib
from dataclasses import dataclass

from .limits import AuditInputError, HostileArchiveError, Limits

_ZIP_LOCAL_HEADER = 30


@dataclass(frozen=True)
class Member:
    name: str
    compressed: int
    unpacked: int
    offset: int = 0  # local header offset in the archive
    crc: int = 0
    method: int = zipfile.ZIP_DEFLATED


def check_name(name: str) -> None:
    if "\x00" in name:
        raise HostileArchiveError(f"member name contains a NUL byte: {name!r}")
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise HostileArchiveError(f"absolute member path refused: {name!r}")
    if any(part == ".." for part in norm.split("/")):
        raise HostileArchiveError(f"path traversal in member name refused: {name!r}")


def _is_symlink(info: zipfile.ZipInfo) -> bool:
    # Unix mode lives in the high 16 bits of external_attr when created on a Unix host.
    mode = info.external_attr >> 16
    return info.create_system == 3 and stat.S_ISLNK(mode)


class WheelArchive:
    """A validated wheel; open with `WheelArchive(path, limits)` (a context manager)."""

    def __init__(self, path: str | os.PathLike, limits: Limits | None = None, data: bytes | None = None):
        """`data`: the archive's bytes (an archive inside a wheel), `path` then only names it."""
        self.path = os.fspath(path)
        self.limits = limits or Limits()
        f = open_regular(self.path) if data is None else io.BytesIO(data)
        try:
            self._zip = zipfile.ZipFile(f)
        except (
            zipfile.BadZipFile,
            ValueError,
            struct.error,
            EOFError,
            OverflowError,
            NotImplementedError,
        ) as exc:
            f.close()
            raise AuditInputError(f"not a zip archive (a wheel is a zip file): {self.path}: {exc}") from None
        except OSError as exc:
            f.close()
            raise AuditInputError(f"cannot read wheel {self.path}: {exc}") from None
        self._file = f
        try:
            self.members = self._validate(self._zip.infolist())
        except BaseException:
            self.close()
            raise

    def _validate(self, infos: list[zipfile.ZipInfo]) -> list[Member]:
        lim = self.limits
        if len(infos) > lim.max_members:
            raise HostileArchiveError(f"{len(infos)} members exceed the limit of {lim.max_members}")
        seen: set[str] = set()
        members: list[Member] = []
        total = 0
        for info in infos:
            name = info.filename
            check_name(name)
            if name in seen:
                raise HostileArchiveError(f"duplicate member name refused: {name!r}")
            seen.add(name)
            if _is_symlink(info):
                raise HostileArchiveError(f"symlink member refused: {name!r}")
            if info.is_dir():
                continue
            if info.flag_bits & 0x1:
                raise AuditInputError(f"encrypted member cannot be read: {name!r}")
            total = check_sizes(name, info.compress_size, info.file_size, total, lim)
            members.append(
                Member(
                    name, info.compress_size, info.file_size, info.header_offset, info.CRC, info.compress_type
                )
            )
        if not members:
            raise AuditInputError(f"empty wheel (no file members): {self.path}")
        self._check_overlap(infos)
        return members

    @staticmethod
    def _check_overlap(infos: list[zipfile.ZipInfo]) -> None:
        """Refuse members whose compressed data overlap (the 'overlapping files' zip bomb)."""
        spans = sorted(((i.header_offset, i) for i in infos if not i.is_dir()), key=lambda t: t[0])
        for (start, info), (next_start, nxt) in zip(spans, spans[1:]):
            end = start + _ZIP_LOCAL_HEADER + len(info.filename.encode()) + info.compress_size
            if end > next_start:
                raise HostileArchiveError(
                    f"members {info.filename!r} and {nxt.filename!r} overlap (zip bomb?)"
                )

    def close(self) -> None:
        self._zip.close()
        self._file.close()

    def __enter__(self) -> WheelArchive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_sizes(name: str, compressed: int, unpacked: int, total: int, lim: Limits) -> int:
    """Refuse a member whose declared sizes break the limits; returns the new running total."""
    if unpacked > lim.max_member_unpacked:
        raise HostileArchiveError(
            f"member {name!r} declares {unpacked} bytes unpacked, over the limit of "
            f"{lim.max_member_unpacked} (zip bomb?)"
        )
    if unpacked > lim.ratio_floor:
        ratio = unpacked / max(compressed, 1)
        if ratio > lim.max_ratio:
            raise HostileArchiveError(
                f"member {name!r} compression ratio {ratio:.0f}:1 exceeds {lim.max_ratio:.0f}:1 (zip bomb?)"
            )
    total += unpacked
    if total > lim.max_total_unpacked:
        raise HostileArchiveError(f"archive unpacks to more than {lim.max_total_unpacked} bytes (zip bomb?)")
    return total


_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def open_regular(path: str):
    """`open(path, "rb")`, refusing anything but a regular file. The open is non-blocking, so a
    FIFO without a writer cannot hang it; the type is checked on the opened descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise AuditInputError(f"wheel not found: {path}") from None
    except OSError as exc:
        raise AuditInputError(f"cannot read wheel {path}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise AuditInputError(f"wheel path is a directory, expected a .whl file: {path}")
        kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
        raise AuditInputError(f"wheel path is {kind}, expected a regular .whl file: {path}")
    return os.fdopen(fd, "rb")  # O_NONBLOCK has no effect on regular files


def read_member(f, n: int, name: str) -> bytes:
    """`f.read(n)` with zip errors (bad CRC, truncated data) turned into `AuditInputError`."""
    try:
        return f.read(n)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
        raise AuditInputError(f"member {name!r} is corrupt: {exc}") from None


def open_member(path: str | io.BytesIO, member: Member):
    """Forward-only stream of a validated member of the archive at `path` (or in the buffer),
    read straight from it by offset (workers never re-parse the central directory). Stored and
    deflated members (all wheels in practice) use `MemberStream`; other methods fall back to
    zipfile."""
    f = open_regular(path) if isinstance(path, str) else path
    try:
        if member.method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            zf = zipfile.ZipFile(f)
            return _ClosingStream(zf.open(member.name), zf, f)
        f.seek(member.offset)
        head = f.read(_ZIP_LOCAL_HEADER)
        if len(head) != _ZIP_LOCAL_HEADER or head[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile(f"bad local header for {member.name!r}")
        n, m = struct.unpack_from("<HH", head, 26)
        start = member.offset + _ZIP_LOCAL_HEADER + n + m
        if start + member.compressed > f.seek(0, os.SEEK_END):
            raise zipfile.BadZipFile(f"member {member.name!r} runs past the end of the archive")
        f.seek(start)
        return MemberStream(f, member)
    except (zipfile.BadZipFile, NotImplementedError, OSError, RuntimeError, KeyError) as exc:
        f.close()
        raise AuditInputError(f"cannot read member {member.name!r}: {exc}") from None
    except BaseException:
        f.close()
        raise


class _ClosingStream(io.RawIOBase):
    def __init__(self, stream, *owners):
        self._stream, self._owners = stream, owners

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return self._stream.read(n)

    def close(self) -> None:
        self._stream.close()
        for owner in self._owners:
            owner.close()
        super().close()


def _fast_inflater():
    """`isal.isal_zlib` when installed (optional speed-up), else None."""
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    return isal_zlib


class MemberStream(io.RawIOBase):
    """A stored or raw-deflate member's data, read forward from `f` (positioned at its first
    compressed byte; closed with the stream).

    Deflate uses `isal.isal_zlib` (about twice as fast as zlib) when installed, else `zlib`.
    Output is bounded by the declared size (data that expands further is refused), and the
    CRC-32 is checked at the end, as zipfile does."""

    IN_CHUNK = 1 << 20

    def __init__(self, f, member: Member):
        self._name = member.name
        stored = member.method == zipfile.ZIP_STORED
        if stored and member.compressed != member.unpacked:
            raise zipfile.BadZipFile(f"stored member {member.name!r} has different packed and unpacked sizes")
        self._f = f
        lib = None if stored else (_fast_inflater() or zlib)
        self._lib = lib or zlib
        self._d = lib.decompressobj(-15) if lib is not None else None
        self._in_left = member.compressed
        self._out_left = member.unpacked
        self._crc_expected = member.crc
        self._crc = 0
        self._tail = b""

    def readable(self) -> bool:
        return True

    def _corrupt(self, why: str):
        return zipfile.BadZipFile(f"member {self._name!r}: {why}")

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._out_left
        n = min(n, self._out_left)
        if self._d is None:  # stored
            data = self._f.read(n)
            if len(data) != n:
                raise self._corrupt("archive truncated")
            return self._account(data)
        parts, got = [], 0
        while got < n:
            if not self._tail:
                if not self._in_left:
                    raise self._corrupt("compressed data ends before the declared size")
                self._tail = self._f.read(min(self.IN_CHUNK, self._in_left))
                if not self._tail:
                    raise self._corrupt("archive truncated")
                self._in_left -= len(self._tail)
            try:
                out = self._d.decompress(self._tail, n - got)
            except self._lib.error as exc:
                raise self._corrupt(f"invalid deflate data ({exc})") from None
            self._tail = self._d.unconsumed_tail
            if self._d.eof and not out and got < n:
                raise self._corrupt("deflate stream ends before the declared size")
            parts.append(out)
            got += len(out)
        return self._account(b"".join(parts))

    def _account(self, data: bytes) -> bytes:
        self._crc = self._lib.crc32(data, self._crc)
        self._out_left -= len(data)
        if self._out_left == 0:
            self._finish()
        return data

    def _finish(self) -> None:
        rest = b"" if self._d is None else self._tail + self._f.read(min(self._in_left, 1 << 16))
        try:
            more = bool(rest) and not self._d.eof and self._d.decompress(rest, 1)
        except self._lib.error:
            more = False  # trailing garbage after the declared size: the CRC decides
        if more:
            raise self._corrupt("data expands past its declared size")
        if self._crc != self._crc_expected:
            raise self._corrupt("bad CRC-32")

    def close(self) -> None:
        self._f.close()
        super().close()
