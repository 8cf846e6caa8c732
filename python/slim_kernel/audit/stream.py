"""Forward-only byte sources and the sparse store of retained bytes.

`Pull` wraps a member stream (or bytes) with an exact `take(n)`, a look-ahead buffer and an
absolute position, so binary parsers can consume a 1 GB member in one pass with bounded memory.
`SpanStore` keeps the bytes a parser chose to retain (everything in a host library except its
fatbin containers) so the ELF tables can be read after the pass; above a memory cap it spills
to an unlinked file in a private temporary directory.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from bisect import bisect_right

from .limits import MalformedBinaryError
from .wheel import read_member

CHUNK = 8 << 20


class Pull:
    def __init__(self, f, size: int, what: str, on_progress=None):
        self._f = f
        self.size = size
        self.what = what
        self.pos = 0  # absolute offset of buf[0]
        self.buf = bytearray()
        self._read = 0  # bytes pulled from f
        self._progress = on_progress

    @classmethod
    def of_bytes(cls, data: bytes, what: str) -> Pull:
        return cls(io.BytesIO(data), len(data), what)

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def fill(self, n: int) -> int:
        """Buffer at least `n` bytes unless the source ends first; returns the buffered length."""
        while len(self.buf) < n and self._read < self.size:
            want = min(max(n - len(self.buf), CHUNK), self.size - self._read)
            data = read_member(self._f, want, self.what)
            if not data:
                raise MalformedBinaryError(f"{self.what}: stream ended at {self._read} of {self.size} bytes")
            self._read += len(data)
            self.buf += data
            if self._progress is not None:
                self._progress(len(data))
        return len(self.buf)

    def take(self, n: int) -> bytes:
        if n > self.remaining:
            raise MalformedBinaryError(
                f"{self.what}: truncated (needs {n} bytes at offset {self.pos}, {self.remaining} left)"
            )
        if len(self.buf) < n:
            self.fill(n)
        out = bytes(self.buf[:n])
        del self.buf[:n]
        self.pos += n
        return out

    def skip(self, n: int) -> None:
        """Discard `n` bytes without keeping them (bounded buffering)."""
        while n > 0:
            step = min(n, CHUNK)
            self.take(step)
            n -= step


class SubReader(io.RawIOBase):
    """File-like view of the next `size` bytes of a `Pull` (for ar members)."""

    def __init__(self, parent: Pull, size: int):
        self._parent = parent
        self._left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._parent.take(n) if n else b""
        self._left -= len(data)
        return data


class SpanStore:
    """Sparse copy of a member: retained spans by absolute offset, slice-readable like bytes."""

    def __init__(self, size: int, memory_cap: int, what: str):
        self._size = size
        self._cap = memory_cap
        self._what = what
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, bytes | None, int]] = []  # start, length, data, spill offset
        self._in_memory = 0
        self._spill = None
        self._spill_dir = None

    def __len__(self) -> int:
        return self._size

    def add(self, start: int, data: bytes) -> None:
        if not data:
            return
        if self._in_memory + len(data) <= self._cap:
            self._spans.append((start, len(data), data, -1))
            self._in_memory += len(data)
        else:
            if self._spill is None:
                self._spill_dir = tempfile.mkdtemp(prefix="slim-kernel-audit-")
                self._spill = tempfile.TemporaryFile(dir=self._spill_dir)
            off = self._spill.seek(0, os.SEEK_END)
            self._spill.write(data)
            self._spans.append((start, len(data), None, off))
        self._starts.append(start)

    def _piece(self, i: int, lo: int, hi: int) -> bytes:
        start, length, data, spill_off = self._spans[i]
        if data is not None:
            return data[lo - start : hi - start]
        self._spill.seek(spill_off + lo - start)
        return self._spill.read(hi - lo)

    def pieces(self, off: int, n: int):
        """(absolute offset, bytes) of the retained parts of [off, off+n)."""
        end = off + n
        i = max(bisect_right(self._starts, off) - 1, 0)
        while i < len(self._spans) and self._spans[i][0] < end:
            start, length = self._spans[i][:2]
            lo, hi = max(off, start), min(end, start + length)
            if lo < hi:
                yield lo, self._piece(i, lo, hi)
            i += 1

    def __getitem__(self, key: slice) -> bytes:
        off, end = key.start or 0, min(key.stop, self._size)
        out, at = [], off
        for lo, data in self.pieces(off, end - off):
            if lo != at:
                break
            out.append(data)
            at += len(data)
        if at < end:
            raise MalformedBinaryError(f"{self._what}: bytes {at}..{end} fall inside a fatbin container")
        return b"".join(out)

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill = None
        self._spans.clear()
        self._starts.clear()

    def __enter__(self) -> SpanStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
