"""Crafted hostile wheels, generated at test time: tiny on disk, hostile inside.

Each builder writes one wheel into a directory and returns its path, in well under a second:
large repetitive members are deflated once per repeated block (deflate of periodic input
repeats its output once the 32 KiB window is full) and zips are assembled by hand from the
compressed bytes. `CASES` maps a name to (builder, what the audit must answer: exit codes
allowed and a phrase its error names when it refuses).
"""

from __future__ import annotations

import os
import struct
import tarfile
import zlib
from pathlib import Path

try:
    from isal.isal_zlib import crc32  # 10x zlib's: the members below unpack to GiB
except ImportError:
    from zlib import crc32

MiB, GiB = 1 << 20, 1 << 30
BLOCK = 1 << 20


# -- compressed streams and zips -------------------------------------------------------------
def crc_repeat(data: bytes, count: int, crc: int = 0) -> int:
    for _ in range(count):
        crc = crc32(data, crc)
    return crc


def deflate_parts(parts: list[tuple[bytes, int]]) -> tuple[bytes, int, int]:
    """Raw deflate of the concatenation of `data * count` for each (data, count) part, without
    materializing it: returns (compressed, crc32, size). A repeated block's compressed form is
    reused once two consecutive copies compress identically."""
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    out, crc, size = [], 0, 0
    for data, count in parts:
        prev = None
        for i in range(count):
            piece = comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH)
            out.append(piece)
            if piece == prev:  # steady state: every further copy compresses the same
                out.append(piece * (count - 1 - i))
                break
            prev = piece
        crc = crc_repeat(data, count, crc)
        size += len(data) * count
    out.append(comp.flush())
    return b"".join(out), crc, size


def gzip_parts(parts: list[tuple[bytes, int]]) -> bytes:
    body, crc, size = deflate_parts(parts)
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff" + body + struct.pack("<II", crc, size & 0xFFFFFFFF)


def _local_header(raw: bytes, method: int, crc: int, csize: int, usize: int) -> bytes:
    return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, csize, usize, len(raw), 0) + raw


def _central_entry(raw: bytes, method: int, crc: int, csize: int, usize: int, offset: int) -> bytes:
    return struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc, csize, usize,
                       len(raw), 0, 0, 0, 0, 0, offset) + raw


def _end_of_central(entries: int, cd_size: int, cd_offset: int) -> bytes:
    entries &= 0xFFFF  # the count wraps past 65,535 entries (as writers without zip64 do)
    return struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, entries, entries, cd_size, cd_offset, 0)


def raw_zip(path: Path, members: list[tuple[str, int, int, int, bytes]]) -> Path:
    """A zip from (name, method, crc, unpacked size, compressed data) members."""
    with open(path, "wb") as f:
        central = []
        for name, method, crc, usize, data in members:
            off, raw = f.tell(), name.encode()
            f.write(_local_header(raw, method, crc, len(data), usize) + data)
            central.append(_central_entry(raw, method, crc, len(data), usize, off))
        cd = b"".join(central)
        f.write(cd + _end_of_central(len(central), len(cd), f.tell()))
    return path


def stored(name: str, data: bytes) -> tuple[str, int, int, int, bytes]:
    return name, 0, crc32(data), len(data), data


def deflated(name: str, parts: list[tuple[bytes, int]]) -> tuple[str, int, int, int, bytes]:
    data, crc, size = deflate_parts(parts)
    return name, 8, crc, size, data


def wheel_with(path: Path, members: list[tuple[str, int, int, int, bytes]]) -> Path:
    """A wheel: the crafted members plus dist-info."""
    info = "crafted-0.1.dist-info"
    meta = [
        stored(f"{info}/METADATA", b"Metadata-Version: 2.1\nName: crafted\nVersion: 0.1\n"),
        stored(
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
        ),
        stored(f"{info}/RECORD", b""),
    ]
    return raw_zip(path, members + meta)


# -- ELF pieces ------------------------------------------------------------------------------
EHDR, SHDR = 64, 64


def elf_header(shoff: int, shnum: int, shstrndx: int = 1) -> bytes:
    ident = b"\x7fELF\x02\x01\x01" + b"\0" * 9
    return ident + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, EHDR, 0, 0, SHDR, shnum, shstrndx)


def shdr(name: int, typ: int, off: int, size: int, link: int = 0, entsize: int = 0) -> bytes:
    return struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off, size, link, 0, 1, entsize)


def rodata_lib(count: int, filler: bytes, size: int) -> bytes:
    """A host library of about `size` bytes whose `count` section headers all call the whole file
    `.rodata` (the section table included), the rest of the bytes being `filler`."""
    names = b"\0.rodata\0.shstrtab\0"
    shoff = size - (count + 2) * SHDR
    body = names + filler * ((shoff - EHDR - len(names)) // len(filler))
    body += b"\0" * (shoff - EHDR - len(body))
    table = shdr(0, 0, 0, 0) + shdr(9, 3, EHDR, len(names)) + shdr(1, 1, 0, size) * count
    return elf_header(shoff, count + 2) + body + table


def names_lib(count: int, distinct: bool) -> bytes:
    """`count` section headers named by one 64 KiB string (or by each of its suffixes)."""
    names = b"\0" + b"A" * (64 * 1024 - 1) + b"\0"
    shoff = EHDR + len(names)
    heads = b"".join(shdr(1 + (i if distinct else 0), 1, 0, 0) for i in range(count))
    return elf_header(shoff, count + 2) + names + shdr(0, 0, 0, 0) + shdr(0, 3, EHDR, len(names)) + heads


def dynstr_parts(total: int) -> list[tuple[bytes, int]]:
    """A library whose `.dynstr` is `total` bytes of "dsv3_\\0" (64 symbols name its strings),
    plus 2 MiB of random bytes so the member stays under the zip ratio limit."""
    unit = b"dsv3_\0" * (BLOCK // 6)
    count = total // len(unit)
    names = b"\0.shstrtab\0.dynstr\0.dynsym\0.rand\0"
    rand = os.urandom(2 * MiB)
    dynstr_off = EHDR + len(names) + len(rand)
    dynstr_size = 1 + count * len(unit)
    syms = b"\0" * 24 + b"".join(
        struct.pack("<IBBHQQ", 1 + 6 * i, 0x12, 0, 1, 0x1000 + i, 16) for i in range(64)
    )
    dynsym_off = dynstr_off + dynstr_size
    shoff = dynsym_off + len(syms)
    table = (
        shdr(0, 0, 0, 0)
        + shdr(1, 3, EHDR, len(names))
        + shdr(11, 3, dynstr_off, dynstr_size)
        + shdr(19, 11, dynsym_off, len(syms), link=2, entsize=24)
        + shdr(27, 1, EHDR + len(names), len(rand))
    )
    return [(elf_header(shoff, 5) + names + rand + b"\0", 1), (unit, count), (syms + table, 1)]


# -- archives and fatbins --------------------------------------------------------------------
def tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = size, 0
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def tar_of_zeros_parts(name: str, size: int) -> list[tuple[bytes, int]]:
    assert size % BLOCK == 0
    return [(tar_header(name, size), 1), (bytes(BLOCK), size // BLOCK), (b"\0" * 1024, 1)]


def zstd_ptx_fatbin(entries: int, csize: int) -> bytes:
    """`entries` PTX entries declaring `csize` compressed -> 1000 x `csize` bytes (the ratio
    cap): each a zstd frame of zeros padded to `csize` with a skippable frame (so a reader that
    trusts the declared sizes decompresses it all, without error)."""
    import zstandard

    usize = 1000 * csize
    comp = zstandard.ZstdCompressor(level=1).compressobj()
    zero = bytes(16 * MiB)
    full, rest = divmod(usize, len(zero))
    frame = b"".join(comp.compress(zero) for _ in range(full)) + comp.compress(zero[:rest]) + comp.flush()
    skip = csize - len(frame) - 8
    assert skip >= 0
    payload = frame + struct.pack("<II", 0x184D2A50, skip) + b"\0" * skip
    head = struct.pack("<HHIQIIHHIIIQQQ", 1, 0x101, 64, csize, csize, 0, 8, 1, 90, 0, 0, 0x8011, 0, usize)
    body = (head + payload) * entries
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def inner_stored_zip_parts(zeros: int, members: int) -> list[tuple[bytes, int]]:
    """A zip of `members` stored members of `zeros` zero bytes each, plus 9 MiB of random data
    (so the outer deflated copy stays under the ratio limit)."""
    zcrc = crc_repeat(bytes(BLOCK), zeros // BLOCK)
    rand = os.urandom(9 * MiB)
    parts, central, off = [], [], 0
    for i, (data, count, crc) in enumerate(
        [(bytes(BLOCK), zeros // BLOCK, zcrc)] * members + [(rand, 1, None)]
    ):
        name = f"data/m{i}.bin".encode()
        size = len(data) * count
        crc = crc32(rand) if crc is None else crc
        head = _local_header(name, 0, crc, size, size)
        central.append(_central_entry(name, 0, crc, size, size, off))
        parts += [(head, 1), (data, count)]
        off += len(head) + size
    cd = b"".join(central)
    return parts + [(cd + _end_of_central(len(central), len(cd), off), 1)]


# -- the cases -------------------------------------------------------------------------------
def rodata_60k(d: Path) -> Path:
    return wheel_with(
        d / "rodata60k.whl", [deflated("pkg/_ops.so", [(rodata_lib(60_000, b"\0", 4 * MiB - 4096), 1)])]
    )


def rodata_42_bmm(d: Path) -> Path:
    return wheel_with(
        d / "rodata42.whl", [deflated("pkg/_ops.so", [(rodata_lib(42, b"bmm_fp8\0", 1600 * 1024), 1)])]
    )


def rodata_2000_bmm(d: Path) -> Path:
    return wheel_with(
        d / "rodata2000.whl", [deflated("pkg/_ops.so", [(rodata_lib(2000, b"bmm_fp8\0", 1600 * 1024), 1)])]
    )


def names_63k(d: Path) -> Path:
    return wheel_with(d / "names63k.whl", [deflated("pkg/_ops.so", [(names_lib(63_000, False), 1)])])


def names_63k_suffixes(d: Path) -> Path:
    return wheel_with(d / "names63ks.whl", [deflated("pkg/_ops.so", [(names_lib(63_000, True), 1)])])


def dynstr_256m(d: Path) -> Path:
    return wheel_with(d / "dynstr.whl", [deflated("pkg/_ops.so", dynstr_parts(256 * MiB))])


def targz_4g(d: Path) -> Path:
    gz = gzip_parts(tar_of_zeros_parts("zeros.bin", 4000 * MiB))
    return wheel_with(d / "targz.whl", [deflated("pkg/data/blob.tar.gz", [(gz, 1)])])


def targz_nested_8g(d: Path) -> Path:
    inner = gzip_parts(tar_of_zeros_parts("zeros.bin", 1 * GiB))
    pad = b"\0" * (-len(inner) % 512)
    tar = [(tar_header(f"inner{i}.tar.gz", len(inner)) + inner + pad, 1) for i in range(8)]
    gz = gzip_parts(tar + [(b"\0" * 1024, 1)])
    return wheel_with(d / "targz8.whl", [deflated("pkg/data/blobs.tar.gz", [(gz, 1)])])


def zstd_at_cap(d: Path) -> Path:
    return wheel_with(
        d / "zstd.whl", [deflated("pkg/kernels/k.fatbin", [(zstd_ptx_fatbin(3, 640 * 1024), 1)])]
    )


def empty_fatbins(d: Path) -> Path:
    empty = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 0) * (BLOCK // 16)
    member = deflated("x", [(empty, 4)])
    return wheel_with(d / "emptyfat.whl", [(f"pkg/blobs/b{i}.bin", *member[1:]) for i in range(256)])


def ar_members(d: Path) -> Path:
    head = b"x.o/".ljust(16) + b"0".ljust(12) + b"0".ljust(6) * 2 + b"644".ljust(8) + b"2".ljust(10) + b"`\n"
    unit = head + b"\0\0"  # a 2-byte ar member
    member = deflated("x", [(b"!<arch>\n", 1), (unit * (BLOCK // len(unit)), 4)])
    return wheel_with(d / "armembers.whl", [(f"pkg/lib/lib{i}.a", *member[1:]) for i in range(256)])


def tar_members(d: Path) -> Path:
    block = tar_header("e", 0) * (BLOCK // 512)
    member = deflated("x", [(block, 3), (block[:-1024] + b"\0" * 1024, 1)])  # 4 MiB: the ratio floor
    return wheel_with(d / "tarmembers.whl", [(f"pkg/data/t{i}.tar", *member[1:]) for i in range(256)])


def nested_stored_zip(d: Path) -> Path:
    return wheel_with(
        d / "nestedzip.whl", [deflated("pkg/vendor/inner.zip", inner_stored_zip_parts(100 * MiB, 5))]
    )


# name: (builder, exit codes the audit may answer, phrase its error must name when it answers 2)
CASES = {
    "rodata_60k": (rodata_60k, {0}, None),
    "rodata_42_bmm": (rodata_42_bmm, {1}, None),
    "rodata_2000_bmm": (rodata_2000_bmm, {1}, None),
    "names_63k": (names_63k, {0}, None),
    "names_63k_suffixes": (names_63k_suffixes, {2}, "section names total more than"),
    "dynstr_256m": (dynstr_256m, {2}, "hold retired op names"),
    "targz_4g": (targz_4g, {2}, "expands more than 200:1"),
    "targz_nested_8g": (targz_nested_8g, {2}, "expands more than 200:1"),
    "zstd_at_cap": (zstd_at_cap, {2}, "expands more than 1000:1"),
    "empty_fatbins": (empty_fatbins, {2}, "items to examine"),
    "nested_stored_zip": (nested_stored_zip, {0}, None),
    # the same trick as empty_fatbins with other headers: 4 MiB members of tiny ar and tar members
    "ar_members": (ar_members, {2}, "items to examine"),
    "tar_members": (tar_members, {2}, "items to examine"),
}
