"""Small wheels, each built from a few bytes at test time, for the classes of input where the
audit must give a verdict that agrees with pip and the loader, in bounded time and memory.

`CASES` maps a name to (builder, exit code, ops found, check): a builder takes a work
directory and returns the wheel; `check(result)` asserts what else the JSON must say.
"""

from __future__ import annotations

import lzma
import struct
import zipfile
import zlib
from pathlib import Path

from . import make_wheel, tiny_elf, tiny_tar

HOST = 62  # EM_X86_64


def _zip_bytes(members: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> bytes:
    import io

    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out.getvalue()


def _ar(objects: dict[str, bytes]) -> bytes:
    out = bytearray(b"!<arch>\n")
    for name, data in objects.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{644:<8}{len(data):<10}`\n".encode() + data
        if len(data) % 2:
            out += b"\n"
    return bytes(out)


def _unreadable(*members: str):
    def check(res: dict) -> None:
        assert sorted({u["member"] for u in res["unreadable"]}) == sorted(members), res["unreadable"]

    return check


def _error(phrase: str):
    def check(res: dict) -> None:
        assert phrase in res["error"], res["error"]

    return check


def _routed(ops: list[str]):
    def check(res: dict) -> None:
        assert sorted({r["op"] for r in res["routed"]}) == ops, res["routed"]

    return check


def _layers(*layers: str):
    def check(res: dict) -> None:
        assert sorted({f["layer"] for f in res["findings"]}) == sorted(layers), res["findings"]

    return check


def _nothing(res: dict) -> None:
    assert not res.get("unreadable"), res["unreadable"]


# -- a verdict on every wheel ------------------------------------------------------------------
def truncated_library_and_a_finding(d: Path) -> Path:
    """One library cut in half (unreadable, listed) and one exporting bmm_fp8: judged, found."""
    lib = tiny_elf(["gemm"], machine=HOST)
    members = {"pkg/_cut.so": lib[: len(lib) // 2], "pkg/_ops.so": tiny_elf(["bmm_fp8"], machine=HOST)}
    return make_wheel(d / "cut.whl", members)


def unreadable_nested_zip(d: Path) -> Path:
    """A TorchScript-like archive whose central directory is not one: unreadable, the rest clean."""
    return make_wheel(d / "ptl.whl", {"pkg/model.ptl": b"PK\x03\x04" + b"\x07" * 200, "pkg/a.py": b"x = 1\n"})


def static_archive_with_a_bad_object(d: Path) -> Path:
    """An ar whose first object is a truncated ELF: the next object is still read (found)."""
    bad = tiny_elf(["gemm"], machine=HOST)[:100]
    good = tiny_elf(["dsv3_router_gemm"], machine=HOST)
    return make_wheel(d / "ar.whl", {"pkg/libx_static.a": _ar({"bad.o": bad, "good.o": good})})


# -- what pip reads, the audit reads -----------------------------------------------------------
def _with_zip64_records(raw: bytes, cd_size: int, cd_offset: int) -> bytes:
    """`raw` (a zip) with a zip64 end record and locator before its end record, naming the
    central directory (`cd_size`, `cd_offset`)."""
    eocd = raw.rfind(b"PK\x05\x06")
    rec = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, 1, 1, cd_size, cd_offset)
    loc = struct.pack("<4sIQI", b"PK\x06\x07", 0, eocd, 1)
    return raw[:eocd] + rec + loc + raw[eocd:]


def _classic_directory(raw: bytes) -> tuple[int, int]:
    return struct.unpack_from("<II", raw, raw.rfind(b"PK\x05\x06") + 12)


def zip64_agrees(d: Path) -> Path:
    raw = make_wheel(d / "base.whl", {"pkg/_ops.so": tiny_elf(["bmm_fp8"], machine=HOST)}).read_bytes()
    (d / "z64.whl").write_bytes(_with_zip64_records(raw, *_classic_directory(raw)))
    return d / "z64.whl"


def zip64_disagrees(d: Path) -> Path:
    """The zip64 record names another directory than the classic one (zipfile follows zip64)."""
    raw = make_wheel(d / "base.whl", {"pkg/a.py": b"x = 1\n"}).read_bytes()
    size, offset = _classic_directory(raw)
    (d / "z64bad.whl").write_bytes(_with_zip64_records(raw, size, offset - 1))
    return d / "z64bad.whl"


def _hand_zip(name: bytes, method: int, payload: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(data)
    local = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 63, 0, method, 0, 0, crc, len(payload), len(data), len(name), 0
    )
    cd = struct.pack(
        "<4sHHHHHHIIIHHHHHII",
        b"PK\x01\x02",
        63,
        63,
        0,
        method,
        0,
        0,
        crc,
        len(payload),
        len(data),
        len(name),
        0,
        0,
        0,
        0,
        0,
        0,
    )
    end = struct.pack(
        "<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(cd) + len(name), len(local) + len(name) + len(payload), 0
    )
    return local + name + payload + cd + name + end


def zstd_member(d: Path) -> Path:
    """A library stored as a zstd member (method 93, as Python 3.14's zipfile writes): read."""
    import zstandard

    lib = tiny_elf(["dsv3_fused_a_gemm"], machine=HOST)
    (d / "zstd.whl").write_bytes(_hand_zip(b"pkg/_ops.so", 93, zstandard.ZstdCompressor().compress(lib), lib))
    return d / "zstd.whl"


def lzma_dictionary_1g(d: Path) -> Path:
    """An LZMA member declaring a 1 GiB dictionary (what its decoder would allocate): refused."""
    data = b"x = 1\n" * 100
    props = struct.pack("<BI", 0x5D, 1 << 30)
    body = lzma.compress(data, lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA1, "dict_size": 1 << 20}])
    payload = struct.pack("<BBH", 9, 4, 5) + props + body
    (d / "lzma.whl").write_bytes(_hand_zip(b"pkg/a.py", 14, payload, data))
    return d / "lzma.whl"


# -- the loader's view of a library ------------------------------------------------------------
def _renamed(lib: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and lib.count(old) == 1
    return lib.replace(old, new)


def renamed_symbol_table(d: Path) -> Path:
    """.symtab renamed: found by its type."""
    lib = _renamed(tiny_elf(["bmm_fp8"], machine=HOST), b".symtab\0", b".zzzzzz\0")
    return make_wheel(d / "renamed.whl", {"pkg/_ops.so": lib})


def _no_section_headers(symbol: str, defined: bool, data: bytes = b"") -> bytes:
    """A 64-bit shared library with program headers only (no section headers), one loadable
    segment and a dynamic segment whose DT_SYMTAB/DT_STRTAB/DT_HASH hold one symbol, defined
    (exported) or not (imported), then `data`."""
    dynsym_at, dynstr = 176, b"\0" + symbol.encode() + b"\0libfoo.so\0"
    dynstr_at = dynsym_at + 48
    hash_at = (dynstr_at + len(dynstr) + 7) & ~7
    dynamic_at = hash_at + 24
    dynamic = b"".join(
        struct.pack("<qQ", tag, val)
        for tag, val in (
            (4, hash_at),
            (5, dynstr_at),
            (6, dynsym_at),
            (10, len(dynstr)),
            (11, 24),
            (1, len(symbol) + 2),
            (0, 0),
        )
    )
    end = dynamic_at + len(dynamic) + len(data)
    header = (
        b"\x7fELF\x02\x01\x01"
        + bytes(9)
        + struct.pack("<HHIQQQIHHHHHH", 3, HOST, 1, 0, 64, 0, 0, 64, 56, 2, 64, 0, 0)
    )
    phdrs = struct.pack("<IIQQQQQQ", 1, 4, 0, 0, 0, end, end, 0x1000) + struct.pack(
        "<IIQQQQQQ", 2, 4, dynamic_at, dynamic_at, dynamic_at, len(dynamic), len(dynamic), 8
    )
    syms = bytes(24) + struct.pack("<IBBHQQ", 1, 0x12, 0, 7 if defined else 0, 0x100 if defined else 0, 16)
    out = bytearray(header + phdrs + syms + dynstr)
    out += bytes(hash_at - len(out)) + struct.pack("<IIIII", 1, 2, 1, 0, 0) + bytes(4)
    return bytes(out + dynamic + data)


def imports_without_section_headers(d: Path) -> Path:
    """A library with no section headers importing bmm_fp8 (undefined): not a finding."""
    return make_wheel(d / "imports.whl", {"pkg/_user.so": _no_section_headers("bmm_fp8", defined=False)})


def exports_without_section_headers(d: Path) -> Path:
    """The same library exporting bmm_fp8: found through the dynamic segment, as dlsym finds it."""
    return make_wheel(d / "exports.whl", {"pkg/_ops.so": _no_section_headers("bmm_fp8", defined=True)})


PTX_TEXT = (
    b"\n.version 8.0\n.target sm_90a\n.address_size 64\n\n"
    b".visible .entry _Z16dsv3_router_gemmPf(\n\t.param .u64 p\n)\n{\n\tret;\n}\n"
    b".visible .func  (.param .b32 func_retval0) _Z22dsv3_fused_a_gemm_mathf(\n\t.param .b32 p\n)\n{\n\tret;\n}\n"
    b".extern .func  (.param .b32 func_retval0) _Z7bmm_fp8f\n(\n\t.param .b32 p\n);\n\0"
)


def ptx_text_in_library_data(d: Path) -> Path:
    """PTX text (no nvcc comments) kept in a library's data for cuModuleLoadData: read as PTX (a
    kernel and a defined device function found; an `.extern` declaration is only a mention)."""
    lib = _no_section_headers("init", defined=True, data=PTX_TEXT)
    return make_wheel(d / "ptxtext.whl", {"pkg/_ops.so": lib})


def ptx_device_functions(d: Path) -> Path:
    """A shipped PTX whose only retired code is a defined device function (found, as a cubin's FUNC
    symbol is), beside a declared `.extern` one of another op (a reference, not code: not found)."""
    ptx = (
        b".version 8.0\n.target sm_90a\n.address_size 64\n\n"
        b".extern .func  (.param .b32 func_retval0) _Z16dsv3_router_gemmf\n(\n\t.param .b32 p\n);\n"
        b".visible .func  (.param .b32 func_retval0) _Z22dsv3_fused_a_gemm_mathf(\n\t.param .b32 p\n)\n{\n\tret;\n}\n"
        b".visible .entry gemm_kernel(\n\t.param .u64 p\n)\n{\n\tret;\n}\n"
    )
    return make_wheel(d / "ptxfunc.whl", {"pkg/k.ptx": ptx})


def macho_library(d: Path) -> Path:
    """A Mach-O library (no reader for it): its strings are read like data."""
    macho = (
        struct.pack("<IiiIIII", 0xFEEDFACF, 0x01000007, 3, 6, 0, 0, 0) + bytes(8) + b"\0_dsv3_router_gemm\0"
    )
    return make_wheel(d / "macho.whl", {"pkg/_ops.dylib": macho})


# -- bounded -----------------------------------------------------------------------------------
def digit_run_symbol(d: Path) -> Path:
    """A 200,000-digit run in a mangled name (a backtracking search is quadratic on it), then a
    real source name: linear, found."""
    name = "_Z" + "9" * 200_000 + ".7bmm_fp8v"
    return make_wheel(d / "digits.whl", {"pkg/_ops.so": tiny_elf([name], machine=HOST)})


def nested_zeros_over_ratio(d: Path) -> Path:
    """A zip inside the wheel holding 64 MiB of zeros (1000:1): nesting multiplies what each
    level may declare, so past the 4 MiB floor a nested member may not expand over 200:1."""
    inner = _zip_bytes({"zeros.bin": bytes(64 << 20)})
    return make_wheel(d / "nested.whl", {"pkg/inner.zip": inner})


def cubin_magics(d: Path) -> Path:
    """1,000,000 cubin ELF headers that are no cubin (no section table), in a data file: each
    costs a header check, counted as an item (refused past 250,000)."""
    magic = b"\x7fELF\x02\x01" + bytes(12) + b"\xbe\x00"
    return make_wheel(d / "magics.whl", {"pkg/data.bin": b"DATA\0" + magic * 1_000_000})


def ptx_entries(d: Path) -> Path:
    """A shipped .ptx of 3,000,000 one-line entries: every match counted (refused)."""
    return make_wheel(d / "entries.whl", {"pkg/k.ptx": b".target sm_90\n" + b".entry a\n" * 3_000_000})


def _tar_header(name: bytes, size: int, kind: bytes) -> bytes:
    head = bytearray(512)
    head[: len(name)] = name
    head[100:108] = b"0000644\0"
    head[124:136] = b"%011o\0" % size
    head[156:157] = kind
    head[257:263] = b"ustar\0"
    head[263:265] = b"00"
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\0 " % sum(head)
    return bytes(head)


def tar_long_name(d: Path) -> Path:
    """A tar (deflated in the wheel to a few hundred KB) whose GNU long-name record declares
    256 MiB: tarfile would read it whole; its size is checked first (refused)."""
    size = 256 << 20
    tar = _tar_header(b"././@LongLink", size, b"L") + b"a" * size + _tar_header(b"x", 0, b"0") + bytes(1024)
    return make_wheel(d / "longname.whl", {"pkg/data.tar": tar})


def tar_xz_large_dictionary(d: Path) -> Path:
    """A .tar.xz whose block header declares a 1.5 GiB LZMA2 dictionary: decoder memory capped."""
    tar = tiny_tar("a.txt", b"x=1\n")
    xz = bytearray(lzma.compress(tar, lzma.FORMAT_XZ, filters=[{"id": lzma.FILTER_LZMA2}]))
    end = 12 + (xz[12] + 1) * 4  # the block header after the 12-byte stream header, CRC-32 last
    assert xz[14:16] == b"\x21\x01"  # one LZMA2 filter, one property byte: the dictionary size
    xz[16] = 37  # 3 << 29 bytes
    xz[end - 4 : end] = struct.pack("<I", zlib.crc32(bytes(xz[12 : end - 4])))
    return make_wheel(d / "xz.whl", {"pkg/libs.tar.xz": bytes(xz)})


# -- small truths ------------------------------------------------------------------------------
def routed_whole_names(d: Path) -> Path:
    """A line naming an op more than 160 bytes after another, and a bare prefix: whole names."""
    line = "bmm_fp8 " + "y" * 150 + " dsv3_fused_a_gemm\nprefix = 'dsv3_'\n"
    return make_wheel(d / "routed.whl", {"pkg/ops.py": line.encode()})


def tuning_tables(d: Path) -> Path:
    """26 tuning tables of 10,000 lines naming the op (260,000 lines, over the item budget of
    hostile work): routed on their own cap, never refused."""
    table = "".join(f'"dsv3_router_gemm_{i}": {{"block": 128}},\n' for i in range(10_000)).encode()
    return make_wheel(d / "tables.whl", {f"pkg/configs/t{i}.json": table for i in range(26)})


CASES = {
    "truncated_library_and_a_finding": (
        truncated_library_and_a_finding,
        1,
        ["bmm_fp8"],
        _unreadable("pkg/_cut.so"),
    ),
    "unreadable_nested_zip": (unreadable_nested_zip, 0, [], _unreadable("pkg/model.ptl")),
    "static_archive_with_a_bad_object": (
        static_archive_with_a_bad_object,
        1,
        ["dsv3_router_gemm"],
        _unreadable("pkg/libx_static.a"),
    ),
    "zip64_agrees": (zip64_agrees, 1, ["bmm_fp8"], _nothing),
    "zip64_disagrees": (zip64_disagrees, 2, [], _error("different central directories")),
    "zstd_member": (zstd_member, 1, ["dsv3_fused_a_gemm"], _nothing),
    "lzma_dictionary_1g": (lzma_dictionary_1g, 2, [], _error("LZMA dictionary")),
    "renamed_symbol_table": (renamed_symbol_table, 1, ["bmm_fp8"], _nothing),
    "imports_without_section_headers": (imports_without_section_headers, 0, [], _nothing),
    "exports_without_section_headers": (
        exports_without_section_headers,
        1,
        ["bmm_fp8"],
        _layers("elf-dynsym"),
    ),
    "ptx_text_in_library_data": (
        ptx_text_in_library_data, 1, ["dsv3_fused_a_gemm", "dsv3_router_gemm"], _layers("ptx-entry")
    ),
    "ptx_device_functions": (ptx_device_functions, 1, ["dsv3_fused_a_gemm"], _layers("shipped-ptx")),
    "macho_library": (macho_library, 1, ["dsv3_router_gemm"], _layers("rodata-string")),
    "digit_run_symbol": (digit_run_symbol, 1, ["bmm_fp8"], _nothing),
    "nested_zeros_over_ratio": (nested_zeros_over_ratio, 2, [], _error("expands more than 200:1")),
    "cubin_magics": (cubin_magics, 2, [], _error("items to examine")),
    "ptx_entries": (ptx_entries, 2, [], _error("steps of work")),
    "tar_long_name": (tar_long_name, 2, [], _error("tar extended header")),
    "tar_xz_large_dictionary": (tar_xz_large_dictionary, 2, [], _error("decoder memory")),
    "routed_whole_names": (routed_whole_names, 0, [], _routed(["bmm_fp8", "dsv3_fused_a_gemm"])),
    "tuning_tables": (tuning_tables, 0, [], _routed(["dsv3_router_gemm"])),
}
