"""Forward-only byte sources, the sparse store of retained bytes, and windowed scanning.

`Pull` wraps a member stream with an exact `take(n)`, a look-ahead buffer and an absolute
position, so binary parsers can consume a 1 GB member in one pass with bounded memory.
`SpanStore` keeps the bytes a parser chose to retain (everything in a host library except its
fatbin containers, or one decompressed cubin) so the ELF tables can be read after the pass;
above a memory cap it spills to an unlinked file in a private temporary directory.
`context_windows` cuts contiguous bytes into bounded windows that overlap by a fixed margin,
so a scanner can look around a hit without ever holding the whole input.
Every read checks the wheel's `Budget` (its wall-clock deadline).
"""

from __future__ import annotations

import functools
import io
import os
import shutil
import tempfile
from bisect import bisect_right

from .inflate import ZEROS
from .limits import Budget, MalformedBinaryError
from .wheel import read_member

CHUNK = 8 << 20  # bytes pulled from a member stream at a time
WINDOW = 1 << 20  # bytes handed to a scanner at a time


class Pull:
    """A member stream read forward into one reused buffer (`readinto`: no allocation per
    read, stored bytes are not copied on the way). The buffered bytes are looked at with
    `find`/`peek` (offsets relative to `pos`) and consumed with `take`/`skip`/`pieces`."""

    def __init__(self, f, size: int, what: str, on_progress=None, budget: Budget | None = None):
        self._f = f  # a binary stream with readinto
        self.size = size
        self.what = what
        self.pos = 0  # absolute offset of the first buffered byte
        self._mem = bytearray()  # the buffered bytes are _mem[_lo:_hi]
        self._view = memoryview(self._mem)
        self._lo = self._hi = 0
        self._read = 0  # bytes pulled from f
        self._progress = on_progress
        self.budget = budget or Budget()

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    @property
    def buffered(self) -> int:
        return self._hi - self._lo

    def fill(self, n: int) -> int:
        """Buffer at least `n` bytes unless the source ends first; returns the buffered length."""
        if self._hi - self._lo >= n or self._read >= self.size:
            return self._hi - self._lo
        if len(self._mem) - self._lo < n:
            self._make_room(n)
        while self._hi - self._lo < n and self._read < self.size:
            self.budget.check_time()
            room = min(len(self._mem) - self._hi, self.size - self._read, CHUNK)
            got = read_member(self._f, self._view[self._hi : self._hi + room], self.what)
            if not got:
                raise MalformedBinaryError(f"{self.what}: stream ended at {self._read} of {self.size} bytes")
            self._read += got
            self._hi += got
            if self._progress is not None:
                self._progress(got)
        return self._hi - self._lo

    def _make_room(self, n: int) -> None:
        """Move the buffered bytes to the front of a buffer with room for `n` and a CHUNK more
        (never more than the member holds): one copy of fewer than `n` bytes per refill, and
        at least CHUNK bytes consumed between two of them."""
        have = self._hi - self._lo
        cap = min(n + CHUNK, have + self.size - self._read)
        if not cap <= len(self._mem) <= 2 * cap:  # reuse the buffer unless it is far off
            mem = bytearray(cap)
            mem[:have] = self._view[self._lo : self._hi]
            self._view.release()
            self._mem, self._view = mem, memoryview(mem)
        else:
            self._view[:have] = self._view[self._lo : self._hi]  # memmove
        self._lo, self._hi = 0, have

    def find(self, sub: bytes, start: int = 0, end: int | None = None) -> int:
        """Offset (from `pos`) of the first `sub` in the buffered bytes [start, end), or -1."""
        end = self._hi if end is None else min(self._lo + end, self._hi)
        at = find_rare(self._mem, sub, self._lo + start, end)
        return at - self._lo if at >= 0 else -1

    def peek(self, n: int, at: int = 0) -> bytes:
        """Up to `n` buffered bytes from offset `at` (from `pos`), not consumed."""
        lo = self._lo + at
        return bytes(self._view[lo : min(lo + n, self._hi)])

    def take(self, n: int) -> bytes:
        self._check(n)
        if n > CHUNK:  # a large payload: joined from pieces, never buffered whole
            return b"".join(data for _, data in self.pieces(n))
        if self._hi - self._lo < n:
            self.fill(n)
        out = bytes(self._view[self._lo : self._lo + n])
        self._advance(n)
        return out

    def skip(self, n: int) -> None:
        """Discard `n` bytes without copying them (bounded buffering)."""
        self._check(n)
        while n > 0:
            step = min(n, self.fill(min(n, CHUNK)))
            self._advance(step)
            n -= step

    def _check(self, n: int) -> None:
        if n > self.remaining:
            raise MalformedBinaryError(
                f"{self.what}: truncated (needs {n} bytes at offset {self.pos}, {self.remaining} left)"
            )

    def _advance(self, n: int) -> None:
        self._lo += n
        self.pos += n
        if self._lo == self._hi:
            self._lo = self._hi = 0

    def pieces(self, n: int | None = None):
        """(offset, bytes) of the next `n` bytes (default: all that remain), WINDOW at a time."""
        end = self.size if n is None else self.pos + n
        while self.pos < end:
            at = self.pos
            yield at, self.take(min(WINDOW, end - at))


def is_zero(data) -> bool:
    """Whether every byte of `data` is zero (compared with a shared zero block: no allocation)."""
    with memoryview(data) as view:
        return all(ZEROS.startswith(view[at : at + len(ZEROS)]) for at in range(0, len(view), len(ZEROS)))


def find_rare(buf, sub: bytes, start: int, end: int) -> int:
    """`buf.find(sub, start, end)`, answered at once (memchr, ~50x faster than a 4-byte find)
    where the window lacks the first byte of `sub` that text and zero runs lack (a control or
    non-ASCII byte: the device magics have one)."""
    gate = _gate(sub)
    if gate >= 0 and buf.find(gate, start, end) < 0:
        return -1
    return buf.find(sub, start, end)


@functools.cache
def _gate(sub: bytes) -> int:
    return next((b for b in sub if b > 0x7E or 0 < b < 0x20), -1)


class SubReader(io.RawIOBase):
    """File-like view of the next `size` bytes of a `Pull` (ar and zip members, fatbin payloads)."""

    def __init__(self, parent: Pull, size: int):
        self._parent = parent
        self._left = size
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self._left if n is None or n < 0 else min(n, self._left)
        data = self._parent.take(n) if n else b""
        self._left -= len(data)
        self.consumed += len(data)
        return data

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        self._parent.skip(self._left)
        self._left = 0


class PrivateSpill:
    """An unlinked file for bytes that do not fit in memory, created in a private temporary
    directory that is removed at once (POSIX: the open file needs no name), so nothing is left
    on disk whatever way the process ends (an error, a signal, SIGKILL); where the file keeps
    its name (Windows) the directory goes on close. Every byte written counts against the
    wheel's spill budget."""

    def __init__(self, what: str, budget: Budget):
        self._what, self._budget = what, budget
        self._dir = tempfile.mkdtemp(prefix="slim-kernel-audit-")
        try:
            self.file = tempfile.TemporaryFile(dir=self._dir)
        finally:
            try:
                os.rmdir(self._dir)  # empty: TemporaryFile is unlinked on POSIX
            except OSError:
                pass

    def write(self, data) -> int:
        self._budget.spill(len(data), self._what)
        self.file.seek(0, os.SEEK_END)
        at = self.file.tell()
        self.file.write(data)
        return at

    def close(self) -> None:
        self.file.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def copy_to_file(src: Pull, memory_cap: int):
    """(seekable file holding the rest of `src`, what to close): in memory up to `memory_cap`
    bytes, else a `PrivateSpill`."""
    if src.remaining <= memory_cap:
        f = io.BytesIO(src.take(src.remaining))
        return f, f
    spill = PrivateSpill(src.what, src.budget)
    for _, data in src.pieces():
        spill.write(data)
    return spill.file, spill


class SpanStore:
    """Sparse copy of a member: retained spans by absolute offset, slice-readable like bytes."""

    def __init__(self, size: int, memory_cap: int, what: str, budget: Budget | None = None):
        self._size = size
        self._cap = memory_cap
        self._what = what
        self._budget = budget or Budget()
        self._starts: list[int] = []
        self._spans: list[tuple[int, int, bytes | None, int]] = []  # start, length, data, spill offset
        self._in_memory = 0
        self._spill: PrivateSpill | None = None

    def __len__(self) -> int:
        return self._size

    def add(self, start: int, data: bytes) -> None:
        if not data:
            return
        if is_zero(data):  # zeros (padding, holes) are remembered, not kept
            self._spans.append((start, len(data), None, -1))
        elif self._in_memory + len(data) <= self._cap:
            self._spans.append((start, len(data), data, -1))
            self._in_memory += len(data)
        else:
            if self._spill is None:
                self._spill = PrivateSpill(self._what, self._budget)
            self._spans.append((start, len(data), None, self._spill.write(data)))
        self._starts.append(start)

    def _piece(self, i: int, lo: int, hi: int) -> bytes:
        start, length, data, spill_off = self._spans[i]
        if data is not None:
            return data[lo - start : hi - start]
        if spill_off < 0:
            return bytes(hi - lo)
        self._spill.file.seek(spill_off + lo - start)
        return self._spill.file.read(hi - lo)

    def _overlapping(self, off: int, end: int):
        """(index, span) of the spans that overlap [off, end)."""
        i = max(bisect_right(self._starts, off) - 1, 0)
        while i < len(self._spans) and self._spans[i][0] < end:
            if self._spans[i][0] + self._spans[i][1] > off:
                yield i, self._spans[i]
            i += 1

    def retained(self, off: int, n: int) -> int:
        """Bytes of [off, off+n) retained (runs of zeros included)."""
        end = off + n
        return sum(min(end, s + k) - max(off, s) for _, (s, k, _, _) in self._overlapping(off, end))

    def pieces(self, off: int, n: int, zeros: bool = True):
        """(absolute offset, bytes) of the retained parts of [off, off+n), at most WINDOW each;
        without the runs of zeros with `zeros=False` (for searches of text, which zeros end)."""
        end = off + n
        for i, (start, length, data, spill_off) in self._overlapping(off, end):
            if not zeros and data is None and spill_off < 0:
                continue
            lo, hi = max(off, start), min(end, start + length)
            while lo < hi:
                self._budget.check_time()
                step = min(hi, lo + WINDOW)
                yield lo, self._piece(i, lo, step)
                lo = step

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
            self._spill = None
        self._spans.clear()
        self._starts.clear()

    def __enter__(self) -> SpanStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def context_windows(pieces, overlap: int):
    """Group (offset, bytes) pieces into windows for scanners that look around a position.

    Yields (base, data, lo, hi): `data` holds contiguous bytes starting at absolute offset
    `base`; the scanner handles what starts in data[lo:hi] and may look up to `overlap` bytes
    before lo and after hi (less where contiguous data begins or ends). Every offset of the
    pieces lies in exactly one [lo, hi). Windows hold at most one piece plus 2 x `overlap`.
    """
    buf, base, lo = b"", 0, 0
    for off, data in pieces:
        if buf and off != base + len(buf):  # a gap: finish the contiguous run first
            if lo < len(buf):
                yield base, buf, lo, len(buf)
            buf = b""
        if not buf:
            buf, base, lo = data, off, 0
        else:
            buf += data
        hi = len(buf) - overlap
        if hi > lo:
            yield base, buf, lo, hi
            cut = max(hi - overlap, 0)
            buf, base, lo = buf[cut:], base + cut, hi - cut
    if lo < len(buf):
        yield base, buf, lo, len(buf)


def window_matches(pattern, windows):
    """`pattern` matches starting in each window's [lo, hi) (for patterns shorter than the
    windows' overlap; `match.string` is the window's data)."""
    for _, data, lo, hi in windows:
        for m in pattern.finditer(data, lo):
            if m.start() >= hi:
                break
            yield m
