"""Wheels in the layouts real projects ship, built at test time the way they build (g++,
nvcc 13): retired code that used to slip through, legit wheels that used to be flagged or refused, and
small wheels that used to cost minutes or GiB.

`CASES` maps a name to (builder, needs, exit code, ops found, phrase of the error or of a
mention). A builder takes a work directory and returns the wheel. `needs` names the tools it
compiles with ("g++", "nvcc"); a test skips the case without them.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import tarfile
import zipfile
from pathlib import Path

from . import (
    GXX,
    NVCC,
    Unseekable,
    fatbin_of,
    host_lib,
    kernels_source,
    make_wheel,
    nvcc_fatbin,
    tiny_elf,
    tiny_tar,
)
from .crafted import EHDR, MiB, deflated, elf_header, raw_zip, shdr, stored, wheel_with

# kernels whose names carry no op: only the file name (-lineinfo) says where they come from
NEUTRAL_KERNEL = 'extern "C" __global__ void gemm_kernel(float* o) { o[threadIdx.x] = 1.f; }\n'


def _cubin(work: Path, filename: str, source: str, *flags: str) -> bytes:
    work.mkdir(parents=True, exist_ok=True)
    (work / filename).write_text(source)
    out = work / (filename + ".cubin")
    subprocess.run([NVCC, "-cubin", "-arch=sm_90a", *flags, "-o", str(out), str(work / filename)], check=True)
    return out.read_bytes()


def _lib_with_array(work: Path, name: str, blob: bytes, const: bool) -> bytes:
    """A g++ library holding `blob` as `unsigned char cubin[] = {...}` (TensorRT-LLM style):
    in .rodata when `const`, else in .data."""
    work.mkdir(parents=True, exist_ok=True)
    data = ", ".join(map(str, blob))
    qual = "const " if const else ""
    src = work / f"{name}.cpp"
    src.write_text(
        f'extern "C" __attribute__((visibility("default"))) {qual}unsigned char cubin_data[] = {{{data}}};\n'
        f'extern "C" __attribute__((visibility("default"))) {qual}unsigned char* get() {{ return cubin_data; }}\n'
    )
    out = work / f"lib{name}.so"
    subprocess.run([GXX, "-shared", "-fPIC", "-O1", "-s", "-o", str(out), str(src)], check=True)
    return out.read_bytes()


def _lib_from_source(work: Path, name: str, source: str) -> bytes:
    work.mkdir(parents=True, exist_ok=True)
    (work / f"{name}.cpp").write_text(source)
    out = work / f"lib{name}.so"
    cmd = [GXX, "-shared", "-fPIC", "-O1", "-s", "-o", str(out), str(work / f"{name}.cpp")]
    subprocess.run(cmd, check=True)
    return out.read_bytes()


def _one(d: Path, member: str, data: bytes) -> Path:
    return make_wheel(d / f"{Path(member).name}.whl", {member: data})


# -- retired code present: found -------------------------------------------------------------
def mangled_entry_point(d: Path) -> Path:
    """An exported C++ entry point: found in mangled form (run without c++filt on PATH)."""
    lib = host_lib(d / "mangled", "mangled", exported=["dsv3_router_gemm"], strip=True)
    return _one(d, "pkg/_ops.so", lib.read_bytes())


def raw_cubin_in_rodata(d: Path) -> Path:
    cubin = _cubin(d / "rc", "k.cu", kernels_source("dsv3_router_gemm"))
    return _one(d, "pkg/_rodata.so", _lib_with_array(d / "rc", "rodata", cubin, const=True))


def raw_cubin_in_data(d: Path) -> Path:
    cubin = _cubin(d / "rd", "k.cu", kernels_source("dsv3_fused_a_gemm"))
    return _one(d, "pkg/_data.so", _lib_with_array(d / "rd", "data", cubin, const=False))


def raw_cubin_in_cache_file(d: Path) -> Path:
    cubin = _cubin(d / "cf", "k.cu", kernels_source("dsv3_router_gemm"))
    header = json.dumps({"arch": "sm_90a", "size": len(cubin), "kernel": "k"}).encode() + b"\n"
    return _one(d, "pkg/cache/k.bin", header + cubin)


def _table_first(cubin: bytes) -> bytes:
    """A relocatable cubin laid out as CUPTI's embedded ones are: the section table right after
    the ELF header and the sections after it (nvcc writes the table last)."""
    shoff, = struct.unpack_from("<Q", cubin, 40)
    phnum, _, shnum = struct.unpack_from("<HHH", cubin, 56)
    assert phnum == 0, "a relocatable cubin (nvcc -rdc=true) has no program headers"
    headers = [bytearray(cubin[shoff + i * 64 : shoff + (i + 1) * 64]) for i in range(shnum)]
    body = bytearray(cubin[:64]) + bytes(shnum * 64)
    for h in headers[1:]:
        typ, _, _, off, size, _, _, align = struct.unpack_from("<IQQQQIIQ", h, 4)
        if typ != 8:  # SHT_NOBITS: no bytes in the file
            body += bytes(-len(body) % max(align, 1))
            struct.pack_into("<Q", h, 24, len(body))
            body += cubin[off : off + size]
    body[64 : 64 + shnum * 64] = b"".join(headers)
    struct.pack_into("<Q", body, 40, 64)
    return bytes(body)


def raw_cubin_table_first(d: Path) -> Path:
    cubin = _table_first(_cubin(d / "tf", "k.cu", kernels_source("dsv3_router_gemm"), "-rdc=true"))
    return _one(d, "pkg/_syscalls.so", _lib_with_array(d / "tf", "syscalls", cubin, const=True))


def fatbin_after_text_header(d: Path) -> Path:
    blob = nvcc_fatbin(d / "th", "k.cu", kernels_source("bmm_fp8"), mode="size")
    header = ("# kernel pack, format 2\n" + "x" * 70 + "\n") * 80  # ~6 KB of text, no NUL
    return _one(d, "pkg/kernels.pack", header.encode() + blob)


def op_table_in_data_rel_ro(d: Path) -> Path:
    src = (
        "static void impl() {}\n"
        "struct Entry { char name[32]; void (*fn)(); };\n"
        '__attribute__((visibility("default"))) extern const Entry table[] = {{"dsv3_router_gemm", impl}};\n'
    )
    return _one(d, "pkg/_table.so", _lib_from_source(d / "tbl", "tbl", src))


def lineinfo_file_name(d: Path) -> Path:
    cubin = _cubin(d / "li", "dsv3_router_gemm_float_out.cu", NEUTRAL_KERNEL, "-lineinfo")
    lib = host_lib(d / "li", "li", fatbin=fatbin_of([(cubin, 90, 0x100011)]), strip=True)
    return _one(d, "pkg/_li.so", lib.read_bytes())


def long_symbol(d: Path) -> Path:
    """The op's name past the first 4 KiB of an exported symbol (a 5,000-character namespace)."""
    ns = "n" + "x" * 4999
    src = f'namespace {ns} {{ __attribute__((visibility("default"))) void dsv3_router_gemm(int* p) {{ *p = 1; }} }}\n'
    return _one(d, "pkg/_long.so", _lib_from_source(d / "long", "long", src))


def dollar_kernel_name(d: Path) -> Path:
    """A non-inlined device function's `$kernel$_Z...` name (not starting with _Z)."""
    cubin = tiny_elf(["$kernel$_Z16dsv3_router_gemmPf"])
    lib = host_lib(d / "dk", "dk", fatbin=fatbin_of([(cubin, 90, 0x100011)]), strip=True)
    return _one(d, "pkg/_dk.so", lib.read_bytes())


# -- legit: passes -------------------------------------------------------------------------
def error_message(d: Path) -> Path:
    lib = host_lib(d / "err", "err", strings=["bmm_fp8: expected A to be a 3-D tensor"], strip=True)
    return _one(d, "pkg/_err.so", lib.read_bytes())


def jit_source_string(d: Path) -> Path:
    src = "#include <cuda.h> __global__ void dsv3_router_gemm_kernel(float* o) { o[threadIdx.x] = 0.f; }"
    lib = host_lib(d / "jit", "jit", strings=[src], strip=True)
    return _one(d, "pkg/_jit.so", lib.read_bytes())


def qualified_call(d: Path) -> Path:
    lib = host_lib(d / "q", "q", strings=["flashinfer::bmm_fp8"], strip=True)
    return _one(d, "pkg/_q.so", lib.read_bytes())


def nested_jar_with_descriptors(d: Path) -> Path:
    """A 20 MiB jar written to a stream (every member's sizes follow its data)."""
    out = Unseekable()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("META-INF/MANIFEST.MF", b"Manifest-Version: 1.0\n")
        for i in range(5):
            zf.writestr(f"res/blob{i}.bin", os.urandom(4 * MiB))
    return _one(d, "pkg/lib/vendor.jar", out.buf.getvalue())


def zero_filled_file(d: Path) -> Path:
    return wheel_with(d / "zeros.whl", [deflated("pkg/data/zeros.bin", [(bytes(MiB), 16)])])


def pyc_with_fatbin_magic(d: Path) -> Path:
    code = compile("MAGIC = b'\\x50\\xed\\x55\\xba\\x01\\x00\\x10\\x00' + b'\\xff' * 40\n", "m.py", "exec")
    import importlib.util
    import marshal

    pyc = importlib.util.MAGIC_NUMBER + b"\0" * 12 + marshal.dumps(code)
    return _one(d, "pkg/__pycache__/m.cpython-311.pyc", pyc)


def fatbin_zst(d: Path) -> Path:
    import zstandard

    blob = fatbin_of([(tiny_elf(["dsv3_router_gemm_kernel"]), 90, 0x100011)])
    return _one(d, "pkg/kernels/k.fatbin.zst", zstandard.ZstdCompressor().compress(blob))


def tar_lz4(d: Path) -> Path:
    import lz4.frame

    return _one(d, "pkg/data/files.tar.lz4", lz4.frame.compress(tiny_tar("a.txt", b"hello\n")))


# -- resource use: bounded -------------------------------------------------------------------
def members_100k(d: Path) -> Path:
    return raw_zip(d / "m100k.whl", [stored(f"pkg/d/{i}.txt", b"x") for i in range(100_000)])


def directory_entries(count: int):
    def build(d: Path) -> Path:
        path = d / f"cd{count}.whl"
        local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0x21, 0, 0, 0, 7, 0) + b"0" * 7
        entry = struct.pack(
            "<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0x21, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0
        )
        cd = b"".join(entry + b"%07d" % i for i in range(count))  # distinct names, all at offset 0
        eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, len(cd), len(local), 0)
        path.write_bytes(local + cd + eocd)
        return path

    return build


def sparse_tar(logical: int):
    def build(d: Path) -> Path:
        head = bytearray(tarfile.TarInfo("holes.bin").tobuf(format=tarfile.GNU_FORMAT))
        head[156:157] = b"S"  # GNU sparse: one 512-byte segment, the rest holes
        head[124:136] = b"%011o\0" % 512
        head[386:410] = b"%011o\0" % 0 + b"%011o\0" % 512
        head[483:495] = b"%011o\0" % logical
        head[148:156] = b" " * 8
        head[148:156] = b"%06o\0 " % sum(head)
        tar = bytes(head) + b"x" * 512 + b"\0" * 1024
        return _one(d, f"pkg/data/sparse{logical >> 30}g.tar", tar)

    return build


def bzip2_members(count: int):
    def build(d: Path) -> Path:
        path = d / f"bz{count}.whl"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_BZIP2) as zf:
            for i in range(count):
                zf.writestr(f"pkg/m{i}.txt", b"x = 1\n")
        return path

    return build


def undefined_dynsym(d: Path) -> Path:
    """4M undefined dynamic symbols (the per-table limit) all named by one string holding `bmm_fp8`."""
    rows = 4_000_000 - 1
    names = b"\0.shstrtab\0.dynstr\0.dynsym\0"
    dynstr = b"\0bmm_fp8\0"
    row = struct.pack("<IBBHQQ", 1, 0x12, 0, 0, 0, 0)
    off_str = EHDR + len(names)
    off_sym = off_str + len(dynstr)
    shoff = off_sym + 24 + rows * 24
    table = (
        shdr(0, 0, 0, 0)
        + shdr(1, 3, EHDR, len(names))
        + shdr(11, 3, off_str, len(dynstr))
        + shdr(19, 11, off_sym, 24 + rows * 24, link=2, entsize=24)
    )
    block = row * (MiB // 24)
    full, rest = divmod(rows, MiB // 24)
    parts = [(elf_header(shoff, 4) + names + dynstr + b"\0" * 24, 1), (block, full), (row * rest + table, 1)]
    return wheel_with(d / "undef.whl", [deflated("pkg/_ops.so", parts)])


def zstd_cubins_duplicate_symbols(d: Path) -> Path:
    """8 zstd cubins, each with 2M defined symbols named by one string."""
    import zstandard

    rows = 2_000_000
    cubin = bytearray(tiny_elf(["dsv3_router_gemm_kernel"]))
    elf = bytes(cubin)
    sym = struct.pack("<IBBHQQ", 1, 0x12, 0, 4, 0, 16)
    big = elf + sym * rows  # symbols appended; .symtab points at them below
    shoff = struct.unpack_from("<Q", elf, 0x28)[0]
    shnum = struct.unpack_from("<H", elf, 0x3C)[0]
    heads = bytearray(elf[shoff : shoff + shnum * 64])
    struct.pack_into("<QQ", heads, 3 * 64 + 24, len(elf), rows * 24)  # section 3 is .symtab
    big += bytes(heads)
    big = bytearray(big)
    struct.pack_into("<Q", big, 0x28, len(elf) + rows * 24)
    payload = zstandard.ZstdCompressor(level=19).compress(bytes(big))
    body = b"".join(
        struct.pack(
            "<HHIQIIHHIIIQQQ",
            2,
            0x101,
            64,
            len(payload) + (-len(payload) % 8),
            len(payload),
            0,
            8,
            1,
            90,
            0,
            0,
            0x108011,
            0,
            len(big),
        )
        + payload
        + b"\0" * (-len(payload) % 8)
        for _ in range(8)
    )
    blob = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    return _one(d, "pkg/kernels/k.fatbin", blob)


def sparse_stored_elf(d: Path) -> Path:
    """A 2 GiB stored ELF member, zeros after its header, written as a sparse file."""
    from .crafted import _central_entry, _end_of_central, _local_header, crc_repeat

    size = 2 << 30
    head = elf_header(0, 0) + b"\0" * (MiB - EHDR)
    crc = crc_repeat(bytes(MiB), (size - MiB) // MiB, crc_repeat(head, 1))
    path = d / "sparse.whl"
    name = b"pkg/_ops.so"
    local = _local_header(name, 0, crc, size, size)
    with open(path, "wb") as f:
        f.write(local + head)
        f.seek(len(local) + size)
        cd = _central_entry(name, 0, crc, size, size, 0)
        f.write(cd + _end_of_central(1, len(cd), len(local) + size))
    return path


def overlapping_members(d: Path) -> Path:
    """12 central entries pointing at one local header (members sharing one stream)."""
    from .crafted import _central_entry, _end_of_central, _local_header, crc32

    data = b"x = 1\n" * 1000
    crc = crc32(data)
    local = _local_header(b"pkg/a.py", 0, crc, len(data), len(data)) + data
    cd = b"".join(
        _central_entry(f"pkg/{c}.py".encode(), 0, crc, len(data), len(data), 0) for c in "abcdefghijkl"
    )
    path = d / "overlap12.whl"
    path.write_bytes(local + cd + _end_of_central(12, len(cd), len(local)))
    return path


G, N = ("g++",), ("g++", "nvcc")
# name: (builder, tools, exit code, ops found, phrase in the error (exit 2) or in a mention)
CASES = {
    "mangled_entry_point": (mangled_entry_point, G, 1, ["dsv3_router_gemm"], None),
    "raw_cubin_in_rodata": (raw_cubin_in_rodata, N, 1, ["dsv3_router_gemm"], None),
    "raw_cubin_in_data": (raw_cubin_in_data, N, 1, ["dsv3_fused_a_gemm"], None),
    "raw_cubin_in_cache_file": (raw_cubin_in_cache_file, ("nvcc",), 1, ["dsv3_router_gemm"], None),
    "raw_cubin_table_first": (raw_cubin_table_first, N, 1, ["dsv3_router_gemm"], None),
    "fatbin_after_text_header": (fatbin_after_text_header, ("nvcc",), 1, ["bmm_fp8"], None),
    "op_table_in_data_rel_ro": (op_table_in_data_rel_ro, G, 1, ["dsv3_router_gemm"], None),
    "lineinfo_file_name": (lineinfo_file_name, N, 1, ["dsv3_router_gemm"], None),
    "long_symbol": (long_symbol, G, 1, ["dsv3_router_gemm"], None),
    "dollar_kernel_name": (dollar_kernel_name, G, 1, ["dsv3_router_gemm"], None),
    "error_message": (error_message, G, 0, [], "bmm_fp8: expected"),
    "jit_source_string": (jit_source_string, G, 0, [], "__global__ void dsv3_router_gemm_kernel"),
    "qualified_call": (qualified_call, G, 0, [], "flashinfer::bmm_fp8"),
    "nested_jar_with_descriptors": (nested_jar_with_descriptors, (), 0, [], None),
    "zero_filled_file": (zero_filled_file, (), 0, [], None),
    "pyc_with_fatbin_magic": (pyc_with_fatbin_magic, (), 0, [], "fatbin magic at offset"),
    "fatbin_zst": (fatbin_zst, (), 1, ["dsv3_router_gemm"], None),
    "tar_lz4": (tar_lz4, (), 0, [], None),
    "members_100k": (members_100k, (), 0, [], None),
    "directory_1m": (directory_entries(1_000_000), (), 2, [], "members: over the limit"),
    "sparse_tar_64g": (sparse_tar(64 << 30), (), 2, [], "is sparse"),
    "sparse_tar_4g": (sparse_tar(4 << 30), (), 2, [], "is sparse"),
    "bzip2_2k": (bzip2_members(2000), (), 0, [], None),
    "undefined_dynsym_4m": (undefined_dynsym, (), 0, [], None),
    "zstd_cubins_2m_symbols": (zstd_cubins_duplicate_symbols, (), 2, [], "decompression bomb"),
    "sparse_stored_elf_2g": (sparse_stored_elf, (), 0, [], None),
    "overlapping_12": (overlapping_members, (), 2, [], "overlap"),
}
# built for the benchmark only (each takes several seconds to build)
BENCH_ONLY = {
    "directory_3m": (directory_entries(3_000_000), (), 2, [], "members: over the limit"),
    "bzip2_8k": (bzip2_members(8000), (), 0, [], None),
}
