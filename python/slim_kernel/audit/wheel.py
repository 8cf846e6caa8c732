"""Safe, streaming access to a zip archive (the wheel, or a zip inside it).

`WheelArchive` reads the central directory itself, one entry at a time, so the member limit
stops a directory of millions of entries before it is held whole, and nothing is parsed twice.
It refuses, with `AuditInputError` naming the member: not a zip, empty, too many members,
declared sizes over the limits, members whose data overlap each other or the directory,
path traversal / absolute names, symlink members, duplicate names, encrypted members, and a
WHEEL that is not a regular file (a FIFO or a device is refused without blocking). Members are
read as forward-only streams (`MemberStream`: stored, deflate, bzip2, LZMA), never extracted;
output stops at the declared size and the CRC-32 is checked at the end.
"""

from __future__ import annotations

import bz2
import functools
import io
import lzma
import os
import stat
import struct
import zlib
from typing import NamedTuple

from .limits import AuditInputError, HostileArchiveError, Limits, MissingDependencyError

STORED, DEFLATED, BZIP2, LZMA, ZSTD = 0, 8, 12, 14, 93  # 93: what Python 3.14's zipfile writes
METHODS = {STORED: "stored", DEFLATED: "deflate", BZIP2: "bzip2", LZMA: "lzma", ZSTD: "zstd"}
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # local file header (30 bytes)
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # central directory entry (46 bytes)
_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory (22 bytes)
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory (56 bytes)
_CD_READ = 1 << 20


class Member(NamedTuple):  # a tuple: a wheel may have 100,000 of them
    name: str
    compressed: int
    unpacked: int
    offset: int = 0  # local header offset in the archive
    crc: int = 0
    method: int = DEFLATED
    bound: int = -1  # where the next member (or the central directory) starts: data must end before


def check_name(name: str) -> None:
    if "\x00" in name:
        raise HostileArchiveError(f"member name contains a NUL byte: {name!r}")
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise HostileArchiveError(f"absolute member path refused: {name!r}")
    if ".." in norm and ".." in norm.split("/"):
        raise HostileArchiveError(f"path traversal in member name refused: {name!r}")


def check_sizes(name: str, unpacked: int, total: int, lim: Limits) -> int:
    """Refuse a member whose declared size breaks the limits; returns the new running total.
    There is no ratio limit: every byte is read once, within the wheel's time limit."""
    if unpacked > lim.max_member_unpacked:
        raise HostileArchiveError(
            f"member {name!r} declares {unpacked} bytes unpacked, over the limit of "
            f"{lim.max_member_unpacked} (zip bomb?)"
        )
    total += unpacked
    if total > lim.max_total_unpacked:
        raise HostileArchiveError(f"archive unpacks to more than {lim.max_total_unpacked} bytes (zip bomb?)")
    return total


class WheelArchive:
    """A validated zip; `WheelArchive(path, limits)` (a context manager), or over an open
    seekable `fileobj` (an archive inside a wheel; `path` then only names it, and the caller
    keeps the file)."""

    def __init__(self, path: str | os.PathLike, limits: Limits | None = None, fileobj=None):
        self.path = os.fspath(path)
        self.limits = limits or Limits()
        self._owned = fileobj is None
        self.file = open_regular(self.path) if fileobj is None else fileobj
        try:
            self.members = self._read_directory()
        except (struct.error, UnicodeDecodeError, OverflowError) as exc:
            self.close()
            raise AuditInputError(f"not a zip archive (a wheel is a zip file): {self.path}: {exc}") from None
        except OSError as exc:
            self.close()
            raise AuditInputError(f"cannot read {self.path}: {exc}") from None
        except BaseException:
            self.close()
            raise

    def _not_zip(self, why: str) -> AuditInputError:
        return AuditInputError(f"not a zip archive (a wheel is a zip file): {self.path}: {why}")

    def _directory_span(self) -> tuple[int, int, int]:
        """(offset of the central directory, its size, bytes before the archive's offset 0)."""
        f = self.file
        size = f.seek(0, os.SEEK_END)
        tail_at = max(0, size - (_EOCD.size + 0xFFFF))
        f.seek(tail_at)
        tail = f.read()
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or len(tail) - at < _EOCD.size:
            raise self._not_zip("no end of central directory record")
        _, disk, _, _, _, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
        end = tail_at + at
        markers = cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF or disk == 0xFFFF
        if at >= 20 and tail[at - 20 : at - 16] == b"PK\x06\x07":
            # zipfile (so pip) follows a zip64 locator right before the record whatever the
            # classic record says, and reads the zip64 record right before the locator
            rec = end - 20 - _EOCD64.size
            zip64 = self._zip64_directory(rec)
            (pointer,) = struct.unpack_from("<Q", tail, at - 12)
            other = self._zip64_directory(pointer) if pointer != rec else zip64
            if other not in (None, zip64) or (not markers and zip64 not in (None, (cd_size, cd_offset))):
                raise HostileArchiveError(
                    f"{self.path}: the zip64 and classic end records name different central directories "
                    "(readers would disagree on the members; refused)"
                )
            if zip64 is None:
                raise self._not_zip("bad zip64 end of central directory")
            (cd_size, cd_offset), end = zip64, rec
        elif markers:
            raise self._not_zip("zip64 locator missing")
        if disk not in (0, 0xFFFF):
            raise AuditInputError(f"multi-disk zip archives are not supported: {self.path}")
        prefix = end - cd_size - cd_offset
        if prefix < 0:
            raise self._not_zip("central directory runs past its end record")
        return cd_offset + prefix, cd_size, prefix

    def _zip64_directory(self, at: int) -> tuple[int, int] | None:
        """(size, offset) of the central directory a zip64 end record at `at` names, or None."""
        if at < 0:
            return None
        self.file.seek(at)
        head = self.file.read(_EOCD64.size)
        if len(head) != _EOCD64.size or head[:4] != b"PK\x06\x06":
            return None
        return tuple(_EOCD64.unpack(head)[8:10])

    def _entries(self):
        """Central directory entries, read a window at a time and counted as they come."""
        cd_at, cd_size, prefix = self._directory_span()
        self.directory_offset = cd_at
        f, lim = self.file, self.limits
        buf, pos, left, count = b"", 0, cd_size, 0
        while True:
            if len(buf) - pos < _CENTRAL.size + 3 * 0xFFFF and left:
                f.seek(cd_at + cd_size - left)
                more = f.read(min(_CD_READ, left))
                if not more:
                    raise self._not_zip("truncated central directory")
                buf, pos, left = buf[pos:] + more, 0, left - len(more)
            if len(buf) - pos < _CENTRAL.size:
                if len(buf) - pos:
                    raise self._not_zip("trailing bytes in the central directory")
                return
            row = _CENTRAL.unpack_from(buf, pos)
            if row[0] != b"PK\x01\x02":
                raise self._not_zip(
                    f"bad central directory entry at {cd_at + cd_size - left - len(buf) + pos}"
                )
            count += 1
            if count > lim.max_members:
                raise HostileArchiveError(f"more than {lim.max_members:,} members: over the limit")
            n, m, k = row[10:13]
            start = pos + _CENTRAL.size
            raw_name, extra = buf[start : start + n], buf[start + n : start + n + m]
            if len(buf) - start < n + m + k:
                raise self._not_zip("truncated central directory entry")
            pos = start + n + m + k
            yield row, raw_name, extra, prefix

    def _read_directory(self) -> list[Member]:
        lim = self.limits
        seen: set[str] = set()
        members: list[Member] = []
        total = 0
        for row, raw_name, extra, prefix in self._entries():
            made_by, flags, method, crc, csize, usize = row[1], row[3], row[4], row[7], row[8], row[9]
            external, offset = row[15], row[16]
            name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
            check_name(name)
            if name in seen:
                raise HostileArchiveError(f"duplicate member name refused: {name!r}")
            seen.add(name)
            if made_by >> 8 == 3 and stat.S_ISLNK(external >> 16):
                raise HostileArchiveError(f"symlink member refused: {name!r}")
            usize, csize, offset = _zip64(extra, usize, csize, offset)
            if name.endswith("/"):
                continue
            if flags & 0x1:
                raise AuditInputError(f"encrypted member cannot be read: {name!r}")
            total = check_sizes(name, usize, total, lim)
            members.append(Member(name, csize, usize, offset + prefix, crc, method))
        if not members:
            raise AuditInputError(f"empty wheel (no file members): {self.path}")
        return self._bounded(members)

    def _bounded(self, members: list[Member]) -> list[Member]:
        """Each member with the offset its data must end before; refuses overlapping members
        (several entries sharing one stream: the 'overlapping files' zip bomb)."""
        order = sorted(range(len(members)), key=lambda i: members[i].offset)
        out = list(members)
        for a, b in zip(order, order[1:] + [None]):
            m = members[a]
            bound = self.directory_offset if b is None else members[b].offset
            if m.offset + _LOCAL.size + m.compressed > bound:
                other = "the central directory" if b is None else repr(members[b].name)
                raise HostileArchiveError(f"members {m.name!r} and {other} overlap (zip bomb?)")
            out[a] = m._replace(bound=bound)
        return out

    def open(self, member: Member) -> MemberStream:
        return member_stream(self.file, member, self.limits)

    def close(self) -> None:
        if self._owned:
            self.file.close()

    def __enter__(self) -> WheelArchive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _zip64(extra: bytes, usize: int, csize: int, offset: int) -> tuple[int, int, int]:
    """Sizes and offset from the zip64 extended-information field where the entry says 0xFFFFFFFF."""
    at = 0
    while at + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, at)
        if tag == 1:
            values = iter(struct.unpack_from(f"<{min(size, 24) // 8}Q", extra, at + 4))
            usize = next(values, usize) if usize == 0xFFFFFFFF else usize
            csize = next(values, csize) if csize == 0xFFFFFFFF else csize
            offset = next(values, offset) if offset == 0xFFFFFFFF else offset
        at += 4 + size
    return usize, csize, offset


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


ZEROS = bytes(1 << 20)  # a shared block of zeros (never written: no memory of its own)
_ZERO_VIEW = memoryview(ZEROS)
HOLE_CHECK = 1 << 20  # reads of at least this many stored bytes ask the file system for holes
_SEEK_DATA = getattr(os, "SEEK_DATA", None)


def _hole(f, at: int, n: int) -> int:
    """How many bytes from `at` (at most `n`) of the file `f` lie in a hole (a sparse file:
    zeros no disk block holds, which reading would fill into the page cache); 0 where the file
    system cannot tell. The file's offset is restored (`f` may be buffered)."""
    if _SEEK_DATA is None or n < HOLE_CHECK:
        return 0
    try:
        fd = f.fileno()
        keep = os.lseek(fd, 0, os.SEEK_CUR)
        try:
            data = os.lseek(fd, at, _SEEK_DATA)
        finally:
            os.lseek(fd, keep, os.SEEK_SET)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # ENXIO at the end, no fd
        return 0
    return min(max(data - at, 0), n)


def read_member(f, into: memoryview, name: str) -> int:
    """`f.readinto(into)` with corrupt data (bad CRC, truncated data) turned into `AuditInputError`."""
    try:
        return f.readinto(into)
    except (CorruptMember, zlib.error, EOFError, OSError, ValueError) as exc:
        raise AuditInputError(f"member {name!r} is corrupt: {exc}") from None


class CorruptMember(Exception):
    pass


def member_stream(f, member: Member, limits: Limits | None = None) -> MemberStream:
    """Forward-only stream of a validated member of the archive open as `f` (seekable; the
    stream seeks before each read, so several may share it; closing the stream leaves `f` open)."""
    try:
        f.seek(member.offset)
        head = f.read(_LOCAL.size)
        if len(head) != _LOCAL.size or head[:4] != b"PK\x03\x04":
            raise CorruptMember(f"bad local header for {member.name!r}")
        n, m = _LOCAL.unpack(head)[9:11]
        start = member.offset + _LOCAL.size + n + m
        if member.bound >= 0 and start + member.compressed > member.bound:
            raise HostileArchiveError(f"member {member.name!r} overlaps the next one (zip bomb?)")
        return MemberStream(f, start, member, limits)
    except (CorruptMember, OSError, NotImplementedError) as exc:
        raise AuditInputError(f"cannot read member {member.name!r}: {exc}") from None


def verify_member(f, member: Member, budget) -> None:
    """Read a member of the archive open as `f` to its end, so its size and CRC-32 are checked
    (`AuditInputError` if they fail), in bounded memory."""
    stream = member_stream(f, member, budget.limits)
    buf = memoryview(bytearray(min(member.unpacked, 8 << 20) or 1))
    while read_member(stream, buf, member.name):
        budget.check_time()


@functools.cache
def _fast_inflater():
    """`isal.isal_zlib` when installed (optional speed-up), else None (looked up once)."""
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    return isal_zlib


class _Decoder:
    """One decompression API over zlib/isal (input left in `unconsumed_tail`) and bz2/lzma
    (input kept inside): `step(data, n)` -> (at most n bytes out, input not yet taken)."""

    def __init__(self, method: int, name: str, lib, limits: Limits):
        self.name, self.limits = name, limits
        self.keeps_input = method in (BZIP2, LZMA, ZSTD)
        if method == DEFLATED:  # lib: zlib or isal_zlib
            self.errors = (lib.error,)
            self._d = lib.decompressobj(-15)
        elif method == BZIP2:
            self._d, self.errors = bz2.BZ2Decompressor(), (OSError, ValueError, EOFError)
        elif method == LZMA:
            self._d, self.errors = None, (lzma.LZMAError, ValueError, EOFError)
        elif method == ZSTD:
            self._d, self.errors = None, (ValueError, EOFError, OSError)
        else:
            raise NotImplementedError(f"compression method {method} of {name!r} is not supported")

    def start_lzma(self, head: bytes) -> bytes:
        """A zip LZMA member starts with version (2), properties size (2) and LZMA1 properties."""
        (psize,) = struct.unpack_from("<H", head, 2)
        props = head[4 : 4 + psize]
        if psize != 5 or len(props) != 5 or props[0] >= 9 * 5 * 5:
            raise CorruptMember("bad LZMA properties")
        d, dict_size = props[0], int.from_bytes(props[1:5], "little")
        if dict_size > self.limits.max_lzma_dict:
            raise HostileArchiveError(
                f"member {self.name!r}: LZMA dictionary of {dict_size:,} bytes, over the limit of "
                f"{self.limits.max_lzma_dict:,} (real wheels use at most 64 MiB)"
            )
        filt = {"id": lzma.FILTER_LZMA1, "lc": d % 9, "lp": d // 9 % 5, "pb": d // 45, "dict_size": dict_size}
        self._d = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[filt])
        return head[4 + psize :]

    def start_zstd(self, raw) -> None:
        """zstd reads its input itself (`raw.read(n)`: the member's compressed bytes), with its
        window capped (`Limits.max_zstd_window`)."""
        try:
            import zstandard
        except ImportError as exc:
            raise MissingDependencyError(
                f"{self.name!r} is a zstd member: reading it needs the 'zstandard' package, a "
                "dependency of slim-kernel that is not installed: pip install zstandard"
            ) from exc
        dctx = zstandard.ZstdDecompressor(max_window_size=self.limits.max_zstd_window)
        self._d = _ZstdStep(dctx.stream_reader(raw, read_size=1 << 20, closefd=False), zstandard.ZstdError)
        self.errors += (zstandard.ZstdError,)

    @property
    def eof(self) -> bool:
        return self._d.eof

    def wants_input(self) -> bool:
        return self._d.needs_input if self.keeps_input else True

    def step(self, data: bytes, n: int) -> tuple[bytes, bytes]:
        try:
            out = self._d.decompress(data, n)
        except self.errors as exc:
            raise CorruptMember(f"invalid compressed data ({exc})") from None
        return (out, b"") if self.keeps_input else (out, self._d.unconsumed_tail)


class _ZstdStep:
    """A zstd stream reader behind the bz2/lzma decompressor API (`decompress(_, n)`, `eof`,
    `needs_input`): it pulls its own input."""

    needs_input = False

    def __init__(self, reader, error):
        self._reader, self._error, self.eof = reader, error, False

    def decompress(self, _data: bytes, n: int) -> bytes:
        out = self._reader.read(n)
        self.eof = not out
        return out


class _Compressed:
    """The compressed bytes of a `MemberStream`, read by a decoder that pulls its input."""

    def __init__(self, stream: MemberStream):
        self._stream = stream

    def read(self, n: int = -1) -> bytes:
        left = self._stream._in_left
        return self._stream._raw(left if n is None or n < 0 else min(n, left))


class MemberStream(io.RawIOBase):
    """A member's data read forward from `f` (stored, deflate, bzip2 or LZMA). Deflate and the
    CRC-32 use `isal.isal_zlib` (inflate about twice, CRC-32 about 20 times as fast as zlib)
    when installed. Output is bounded by the
    declared size (data that expands further is refused) and the CRC-32 is checked at the end."""

    IN_CHUNK = 1 << 20

    def __init__(self, f, start: int, member: Member, limits: Limits | None = None):
        self._name = member.name
        self._f, self._at = f, start
        stored = member.method == STORED
        if stored and member.compressed != member.unpacked:
            raise CorruptMember(f"stored member {member.name!r} has different packed and unpacked sizes")
        lib = _fast_inflater() or zlib
        self._d = None if stored else _Decoder(member.method, member.name, lib, limits or Limits())
        self._crc32 = lib.crc32
        self._in_left, self._out_left = member.compressed, member.unpacked
        self._crc_expected, self._crc = member.crc, 0
        self._tail = b""
        if member.method == LZMA:
            self._tail = self._d.start_lzma(self._raw(min(64, self._in_left)))
        elif member.method == ZSTD:
            self._d.start_zstd(_Compressed(self))

    def readable(self) -> bool:
        return True

    def _raw(self, n: int) -> bytes:
        self._f.seek(self._at)
        data = self._f.read(n)
        if len(data) != n:
            raise CorruptMember(f"member {self._name!r}: archive truncated")
        self._at += n
        self._in_left -= n
        return data

    def _corrupt(self, why: str) -> CorruptMember:
        return CorruptMember(f"member {self._name!r}: {why}")

    def readinto(self, b) -> int:
        """Stored data goes straight from the archive into `b` (where the archive file has a
        hole, a sparse file, zeros are written without reading it); decompressed data is
        copied in piece by piece, never joined first."""
        n = min(len(b), self._out_left)
        hole = _hole(self._f, self._at, n) if self._d is None else 0
        n = hole or n
        with memoryview(b) as view, view[:n] as into:
            if self._d is not None:
                got = 0
                while got < n:
                    out = self._inflate(n - got)
                    into[got : got + len(out)] = out
                    got += len(out)
            elif hole:
                for at in range(0, n, len(ZEROS)):
                    into[at : at + len(ZEROS)] = _ZERO_VIEW[: n - at]
                self._at, self._in_left = self._at + n, self._in_left - n
            else:
                self._f.seek(self._at)
                if self._f.readinto(into) != n:
                    raise self._corrupt("archive truncated")
                self._at, self._in_left = self._at + n, self._in_left - n
            self._account(into)
        return n

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._out_left
        n = min(n, self._out_left)
        if self._d is None:
            return self._account(self._raw(n))
        parts, got = [], 0
        while got < n:
            parts.append(self._inflate(n - got))
            got += len(parts[-1])
        return self._account(b"".join(parts))

    def _inflate(self, n: int) -> bytes:
        """One decompression step: 1 to `n` bytes of output."""
        while True:
            if not self._tail and self._d.wants_input() and self._in_left:
                self._tail = self._raw(min(self.IN_CHUNK, self._in_left))
            # with no input left the decompressor may still hold output (a long match)
            out, self._tail = self._d.step(self._tail, n)
            if out:
                return out
            if self._d.eof:
                raise self._corrupt("compressed stream ends before the declared size")
            if not self._tail and not self._in_left:
                raise self._corrupt("compressed data ends before the declared size")

    def _account(self, data):
        self._crc = self._crc32(data, self._crc)
        self._out_left -= len(data)
        if self._out_left == 0:
            self._finish()
        return data

    def _finish(self) -> None:
        if self._d is not None and not self._d.eof:
            rest = self._tail or (self._raw(min(self._in_left, 1 << 16)) if self._in_left else b"")
            try:
                more = self._d.step(rest, 1)[0]
            except CorruptMember:
                more = b""  # trailing garbage after the declared size: the CRC decides
            if more:
                raise self._corrupt("data expands past its declared size")
        if self._crc != self._crc_expected:
            raise self._corrupt("bad CRC-32")
