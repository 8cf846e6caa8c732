"""Safe, streaming access to a wheel (zip) archive.

`WheelArchive` validates the central directory before any member is read: not a zip, empty,
too many members, zip bombs (absolute and ratio limits on declared sizes; zipfile itself stops
at the declared size and fails the CRC if the data expands further), overlapping members,
path traversal / absolute names, symlink members and duplicate names are refused with
`AuditInputError` naming the member. Members are read as forward-only streams
(`zipfile.ZipExtFile`), never extracted.
"""

from __future__ import annotations

import os
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import PurePosixPath

from .limits import AuditInputError, HostileArchiveError, Limits

_ZIP_LOCAL_HEADER = 30


@dataclass(frozen=True)
class Member:
    name: str
    compressed: int
    unpacked: int

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix.lower()

    @property
    def basename(self) -> str:
        return PurePosixPath(self.name).name


def _check_name(name: str) -> None:
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

    def __init__(self, path: str | os.PathLike, limits: Limits | None = None):
        self.path = os.fspath(path)
        self.limits = limits or Limits()
        if not os.path.exists(self.path):
            raise AuditInputError(f"wheel not found: {self.path}")
        if os.path.isdir(self.path):
            raise AuditInputError(f"wheel path is a directory, expected a .whl file: {self.path}")
        try:
            self._zip = zipfile.ZipFile(self.path)
        except zipfile.BadZipFile as exc:
            raise AuditInputError(f"not a zip archive (a wheel is a zip file): {self.path}: {exc}") from None
        except OSError as exc:
            raise AuditInputError(f"cannot read wheel {self.path}: {exc}") from None
        try:
            self.members = self._validate(self._zip.infolist())
        except BaseException:
            self._zip.close()
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
            _check_name(name)
            if name in seen:
                raise HostileArchiveError(f"duplicate member name refused: {name!r}")
            seen.add(name)
            if _is_symlink(info):
                raise HostileArchiveError(f"symlink member refused: {name!r}")
            if info.is_dir():
                continue
            if info.flag_bits & 0x1:
                raise AuditInputError(f"encrypted member cannot be read: {name!r}")
            if info.file_size > lim.max_member_unpacked:
                raise HostileArchiveError(
                    f"member {name!r} declares {info.file_size} bytes unpacked, over the limit of "
                    f"{lim.max_member_unpacked} (zip bomb?)"
                )
            if info.file_size > lim.ratio_floor:
                ratio = info.file_size / max(info.compress_size, 1)
                if ratio > lim.max_ratio:
                    raise HostileArchiveError(
                        f"member {name!r} compression ratio {ratio:.0f}:1 exceeds {lim.max_ratio:.0f}:1 (zip bomb?)"
                    )
            total += info.file_size
            if total > lim.max_total_unpacked:
                raise HostileArchiveError(
                    f"archive unpacks to more than {lim.max_total_unpacked} bytes (zip bomb?)"
                )
            members.append(Member(name, info.compress_size, info.file_size))
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

    def open(self, name: str):
        """Forward-only stream of a member's bytes; errors become `AuditInputError`."""
        try:
            return self._zip.open(name)
        except (zipfile.BadZipFile, NotImplementedError, OSError, RuntimeError) as exc:
            raise AuditInputError(f"cannot read member {name!r}: {exc}") from None

    def read_head(self, name: str, n: int) -> bytes:
        with self.open(name) as f:
            return read_member(f, n, name)

    @property
    def compressed_total(self) -> int:
        return os.path.getsize(self.path)

    def close(self) -> None:
        self._zip.close()

    def __enter__(self) -> WheelArchive:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_member(f, n: int, name: str) -> bytes:
    """`f.read(n)` with zip errors (bad CRC, truncated data) turned into `AuditInputError`."""
    try:
        return f.read(n)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
        raise AuditInputError(f"member {name!r} is corrupt: {exc}") from None
