"""LZ4 fatbin payloads too large for one piece (NCCL's and NVSHMEM's reach 130 MB): decoded in bounded
memory by `audit.lz4block`, byte for byte what `lz4.block` gives, and read by the audit like any entry."""

from __future__ import annotations

import io
import os
import tracemalloc

import lz4.block
import pytest
from audit_fixtures import fatbin_entry, fatbin_header, tiny_elf
from hypothesis import given, settings
from hypothesis import strategies as st

from slim_kernel.audit import lz4block
from slim_kernel.audit.limits import Limits, MalformedBinaryError
from slim_kernel.audit.rules import Rules
from slim_kernel.audit.scan import ScanContext, scan_member


def decode(block: bytes, usize: int, window: int = 1 << 20) -> list[bytes]:
    return list(lz4block.decode(io.BytesIO(block), usize, window, "t"))


def corpus(kind: int, size: int, seed: int) -> bytes:
    """Incompressible, one run, two symbols, or a repeated random phrase: literals, long overlapping
    matches, short matches."""
    rnd = __import__("random").Random(seed)
    if kind == 0:
        return rnd.randbytes(size)
    if kind == 1:
        return bytes(size)
    if kind == 2:
        return bytes(rnd.choice(b"ab") for _ in range(size))
    return (rnd.randbytes(rnd.randint(1, 300)) * (size // 2 + 1))[:size]


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 3),
    st.sampled_from([0, 1, 4, 15, 16, 300, 4096, 70_000, 200_000]),
    st.integers(0, 1 << 16),
    st.sampled_from([1, 5, 64, 1 << 20]),
    st.sampled_from([1, 7, 4096, 1 << 20]),
)
def test_decodes_what_lz4_block_encodes(kind, size, seed, read, window):
    """Any input read any number of bytes at a time, handed on in windows of exactly `window` bytes."""
    data = corpus(kind, size, seed)
    saved, lz4block.READ = lz4block.READ, read
    try:
        pieces = decode(lz4.block.compress(data, store_size=False), len(data), window)
    finally:
        lz4block.READ = saved
    assert b"".join(pieces) == data
    assert all(len(p) == window for p in pieces[:-1]) and all(0 < len(p) <= window for p in pieces)


@pytest.mark.parametrize(
    "mangle, phrase",
    [
        (lambda b: b[: len(b) // 2], "ends inside a sequence"),
        (lambda b: b"\x0f" + b"\x00\x00" + b[3:], "reaches 0 bytes back"),  # a match before any output
        (lambda b: b"\x1f" + b"x" + b"\x02\x00" + b[4:], "reaches 2 bytes back"),
    ],
)
def test_corrupt_blocks_are_malformed(mangle, phrase):
    block = lz4.block.compress(corpus(3, 5000, 1), store_size=False)
    with pytest.raises(MalformedBinaryError, match=phrase):
        decode(mangle(block), 5000)


@pytest.mark.parametrize("declared", [4999, 5001, 0])
def test_a_size_other_than_the_header_says_is_malformed(declared):
    with pytest.raises(MalformedBinaryError, match="header says|past the"):
        decode(lz4.block.compress(corpus(3, 5000, 2), store_size=False), declared)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.integers(0, 4000))
def test_any_bytes_decode_or_are_malformed(block, usize):
    """Never an IndexError or another exception: corrupt input is malformed input."""
    try:
        out = b"".join(decode(block, usize, 64))
    except MalformedBinaryError:
        return
    assert len(out) == usize


def test_a_run_of_megabytes_is_decoded_in_bounded_memory():
    """256 MiB of zeros (one LZ4 match of nearly all of it) never holds more than a few windows."""
    size = 256 << 20
    block = lz4.block.compress(bytes(size), store_size=False)
    tracemalloc.start()
    try:
        total = sum(len(p) for p in lz4block.decode(io.BytesIO(block), size, 1 << 20, "t"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == size and peak < len(block) + (8 << 20), peak


def test_the_audit_reads_an_lz4_entry_past_the_one_piece_limit():
    """A retired kernel in an LZ4 cubin larger than `max_lz4_entry` is found, not refused."""
    cubin = tiny_elf(["dsv3_router_gemm_kernel"]) + os.urandom(8192)  # the tail: stored as literals
    block = lz4.block.compress(cubin, store_size=False)
    blob = fatbin_header(64 + len(block) + (-len(block) % 8)) + fatbin_entry(
        2, block + bytes(-len(block) % 8), flags=0x2011, csize=len(block), usize=len(cubin)
    )
    for limit in (len(cubin) - 1, len(cubin)):  # streamed, then in one piece: the same findings
        ctx = ScanContext(Rules(), Limits(max_lz4_entry=limit))
        scan = scan_member(io.BytesIO(blob), "pkg/k.fatbin", len(blob), len(blob), ctx)
        assert {h.op for h in scan.hits} == {"dsv3_router_gemm"}, (limit, scan.unreadable)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 400), st.binary(min_size=1, max_size=8)), max_size=6))
def test_a_corrupt_streamed_entry_is_unreadable_or_refused_never_a_crash(patches):
    from slim_kernel.audit.limits import AuditInputError

    cubin = tiny_elf(["dsv3_router_gemm_kernel"])
    block = lz4.block.compress(cubin, store_size=False)
    blob = bytearray(fatbin_header(64 + len(block) + (-len(block) % 8)) + fatbin_entry(
        2, block + bytes(-len(block) % 8), flags=0x2011, csize=len(block), usize=len(cubin)
    ))
    for off, data in patches:
        blob[80 + off : 80 + off + len(data)] = data  # past the headers: the LZ4 block itself
    ctx = ScanContext(Rules(), Limits(max_lz4_entry=16))
    try:
        scan_member(io.BytesIO(bytes(blob)), "pkg/k.fatbin", len(blob), len(blob), ctx)
    except AuditInputError:
        pass
