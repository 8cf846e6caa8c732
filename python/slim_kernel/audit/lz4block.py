"""LZ4 block decoding in bounded memory, for fatbin payloads too large to decompress in one piece.

`lz4.block` only decompresses a whole block into one buffer. NVIDIA's own libraries ship LZ4
fatbin entries of 50-130 MB (NCCL, NVSHMEM, cuSPARSELt), so a block past `Limits.max_lz4_entry` is
decoded here instead: the compressed bytes are read 1 MiB at a time, and the output is kept to the
64 KiB an LZ4 match can reach back plus one window handed on. Format (the LZ4 block spec): a
sequence is a token (high nibble: literal count, low nibble: match length - 4; 15 means more
length bytes follow, each added, until one below 255), the literals, a 2-byte little-endian
offset, then the match extension bytes; the last sequence is literals only. Pure Python: about
30 MB of output a second, so only blocks that do not fit the one-piece limit come here.
"""

from __future__ import annotations

from .limits import MalformedBinaryError

BACK = 1 << 16  # an LZ4 match reaches at most 65,535 bytes back
READ = 1 << 20  # compressed bytes read at a time


def decode(raw, usize: int, window: int, what: str, check_time=lambda: None):
    """Yield the `usize` bytes of the LZ4 block read from `raw` (a file-like object holding exactly
    the compressed block) in pieces of `window` bytes (the last shorter). MalformedBinaryError when
    the block is corrupt, truncated, or decodes to another size than `usize`."""
    buf, ip, n = b"", 0, 0  # local variables, few tests: this loop runs once a sequence (8 M in 130 MB)
    out, done = bytearray(), 0  # `out` holds what is not yet handed on, and the match window
    while True:
        if n - ip < 32:
            buf, ip, n = _more(raw, buf, ip, what, at_end_ok=True)
            if ip >= n:
                break
        token = buf[ip]
        ip += 1
        lit = token >> 4
        if lit:
            if lit == 15:
                buf, ip, n, lit = _extend(raw, buf, ip, n, lit, what)
            if ip + lit <= n:
                out += buf[ip : ip + lit]
                ip += lit
            else:
                buf, ip, n, done = yield from _literals(raw, buf, ip, n, lit, out, done, usize, window, what,
                                                        check_time)
        if ip >= n:
            buf, ip, n = _more(raw, buf, ip, what, at_end_ok=True)
            if ip >= n:
                break  # the last sequence: literals only
        if n - ip < 2:
            buf, ip, n = _more(raw, buf, ip, what)
        off = buf[ip] | buf[ip + 1] << 8
        ip += 2
        match = token & 15
        if match == 15:
            buf, ip, n, match = _extend(raw, buf, ip, n, match, what)
        match += 4
        if not 0 < off <= len(out):
            raise MalformedBinaryError(f"{what}: corrupt LZ4 payload: a match reaches {off} bytes back")
        if off >= match and match <= window:
            start = len(out) - off
            out += out[start : start + match]
        else:
            done = yield from _match(out, off, match, done, usize, window, what, check_time)
        if len(out) >= window + BACK:
            done = yield from _hand_on(out, done, usize, window, what, check_time)
    while out:
        done = yield from _hand_on(out, done, usize, window, what, check_time, keep=0)
    if done != usize:
        raise MalformedBinaryError(f"{what}: decompressed to {done} bytes, header says {usize}")


def _extend(raw, buf: bytes, ip: int, n: int, count: int, what: str) -> tuple[bytes, int, int, int]:
    """A length nibble of 15 plus the bytes that follow it, up to one below 255."""
    byte = 255
    while byte == 255:
        if ip >= n:
            buf, ip, n = _more(raw, buf, ip, what)
        byte = buf[ip]
        ip += 1
        count += byte
    return buf, ip, n, count


def _literals(raw, buf, ip, n, lit, out, done, usize, window, what, check_time):
    """Literals running past the buffered input, read on and handed on a window at a time."""
    while lit:
        if ip >= n:
            buf, ip, n = _more(raw, buf, ip, what)
        take = min(lit, n - ip)
        out += buf[ip : ip + take]
        ip += take
        lit -= take
        if len(out) >= window + BACK:
            done = yield from _hand_on(out, done, usize, window, what, check_time)
    return buf, ip, n, done


def _match(out, off, match, done, usize, window, what, check_time):
    """A match longer than a window or overlapping itself (a run: each byte repeats the one `off`
    back), copied a window at a time."""
    while match:
        step = min(match, window)
        start = len(out) - off
        out += out[start : start + step] if off >= step else (out[start:] * (step // off + 1))[:step]
        match -= step
        if len(out) >= window + BACK:
            done = yield from _hand_on(out, done, usize, window, what, check_time)
    return done


def _more(raw, buf: bytes, ip: int, what: str, at_end_ok: bool = False) -> tuple[bytes, int, int]:
    """The unread input with the next `READ` bytes appended: (buffer, 0, its length). The input may
    end only between sequences (`at_end_ok`)."""
    data = raw.read(READ)
    if not data and not at_end_ok:
        raise MalformedBinaryError(f"{what}: corrupt LZ4 payload: it ends inside a sequence")
    buf = buf[ip:] + data
    return buf, 0, len(buf)


def _hand_on(out: bytearray, done: int, usize: int, window: int, what: str, check_time, keep: int = BACK):
    """Yield `out`'s bytes but the last `keep` in pieces of `window`, removing them; the bytes done."""
    while len(out) - keep >= window or (not keep and out):
        piece = bytes(out[:window])
        del out[:window]
        done += len(piece)
        if done + len(out) > usize:
            raise MalformedBinaryError(f"{what}: LZ4 payload decompresses past the {usize} bytes its header says")
        check_time()
        yield piece
    return done
