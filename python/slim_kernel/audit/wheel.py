"""Safe, streaming access to a zip archive (the wheel, or a zip inside it).

`WheelArchive` reads the central directory itself, one entry at a time, so the member limit
stops a directory of millions of entries before it is held whole, and nothing is parsed twice.
It refuses, with `AuditInputError` naming the member: not a zip, empty, too many members,
declared sizes over the limits, members whose data overlap each other or the directory,
path traversal / absolute names, symlink members, duplicate names, encrypted members, and a
WHEEL that is not a regular file (a FIFO or a device is refused without blocking). Members are
read as forward-only streams (`inflate.MemberStream`: stored, deflate, bzip2, LZMA, zstd), never extracted;
output stops at the declared size and the CRC-32 is checked at the end.
"""

from __future__ import annotations

import os
import stat
import struct
import zlib

from .inflate import CorruptMember, Member, MemberStream
from .limits import AuditInputError, HostileArchiveError, Limits

_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # local file header (30 bytes)
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")  # central directory entry (46 bytes)
_EOCD = struct.Struct("<4sHHHHIIH")  # end of central directory (22 bytes)
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")  # zip64 end of central directory (56 bytes)
_CD_READ = 1 << 20


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


def read_member(f, into: memoryview, name: str) -> int:
    """`f.readinto(into)` with corrupt data (bad CRC, truncated data) turned into `AuditInputError`."""
    try:
        return f.readinto(into)
    except (CorruptMember, zlib.error, EOFError, OSError, ValueError) as exc:
        raise AuditInputError(f"member {name!r} is corrupt: {exc}") from None


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
