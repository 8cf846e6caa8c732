"""Reading one zip member forward: stored, deflate (ISA-L when installed), bzip2, LZMA and zstd
(method 93), into the caller's buffer, output bounded by the declared size and the CRC-32
checked at the end; decoder memory capped (`Limits.max_zstd_window`, `Limits.max_lzma_dict`).
Where a stored member lies over a hole of a sparse wheel file, zeros are returned unread.
"""

from __future__ import annotations

import bz2
import functools
import io
import lzma
import os
import struct
import zlib
from typing import NamedTuple

from .limits import HostileArchiveError, Limits, MissingDependencyError

STORED, DEFLATED, BZIP2, LZMA, ZSTD = 0, 8, 12, 14, 93  # 93: what Python 3.14's zipfile writes
METHODS = {STORED: "stored", DEFLATED: "deflate", BZIP2: "bzip2", LZMA: "lzma", ZSTD: "zstd"}


class Member(NamedTuple):  # a tuple: a wheel may have 100,000 of them
    name: str
    compressed: int
    unpacked: int
    offset: int = 0  # local header offset in the archive
    crc: int = 0
    method: int = DEFLATED
    bound: int = -1  # where the next member (or the central directory) starts: data must end before


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


class CorruptMember(Exception):
    pass


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
