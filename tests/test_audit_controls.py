"""Negative controls: binaries built here with g++/nvcc carrying retired-op traces, one layer at
a time, must be flagged through that layer; `dsv4_*`-only code and Python/JIT/METADATA
mentions must pass."""

from __future__ import annotations

import io
import json

import pytest
from audit_fixtures import (
    GXX,
    NEUTRAL_CU,
    NVCC,
    Unseekable,
    host_lib,
    kernels_source,
    make_wheel,
    nvcc_fatbin,
)

from slim_kernel.cli import main

needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ not found")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def audit(capsys, *args: str) -> tuple[int, dict | list]:
    """Exit code and the per-wheel results: one object for one wheel, else the list."""
    rc = main(["audit", "--json", "--no-progress", *map(str, args)])
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1, doc
    wheels = doc["wheels"]
    return rc, wheels[0] if len(wheels) == 1 else wheels


def layers_of(result: dict, op: str | None = None) -> set[str]:
    return {f["layer"] for f in result["findings"] if op is None or f["op"] == op}


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    return tmp_path_factory.mktemp("controls")


@needs_gxx
def test_exported_entry_point_only(build, capsys):
    lib = host_lib(build / "exp", "exp", exported=["dsv3_router_gemm"], strip=True)
    rc, res = audit(capsys, make_wheel(build / "exp.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 1 and res["ops_found"] == ["dsv3_router_gemm"]
    assert layers_of(res) == {"elf-dynsym"}
    (f,) = res["findings"]
    assert f["member"] == "pkg/_ops.so"
    assert f["evidence"].startswith("dsv3_router_gemm(at::Tensor&, at::Tensor const&, at::Tensor const&)")


@needs_gxx
def test_schema_string_only(build, capsys):
    lib = host_lib(build / "sch", "sch", schemas=["dsv3_router_gemm"], strip=True)
    rc, res = audit(capsys, make_wheel(build / "sch.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 1 and res["ops_found"] == ["dsv3_router_gemm"]
    assert layers_of(res) == {"rodata-schema"}
    assert (
        res["findings"][0]["evidence"] == "dsv3_router_gemm(Tensor! output, Tensor mat_a, Tensor mat_b) -> ()"
    )


@needs_gxx
def test_binding_name_string_only(build, capsys):
    lib = host_lib(build / "str", "str", strings=["dsv3_fused_a_gemm"], strip=True)
    rc, res = audit(capsys, make_wheel(build / "str.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 1 and layers_of(res) == {"rodata-string"} and res["ops_found"] == ["dsv3_fused_a_gemm"]


@needs_gxx
def test_static_symbol_only_when_not_stripped(build, capsys):
    lib = host_lib(build / "sym", "sym", static=["bmm_fp8"])
    rc, res = audit(capsys, make_wheel(build / "sym.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 1 and layers_of(res) == {"elf-symtab"} and res["ops_found"] == ["bmm_fp8"]
    stripped = host_lib(build / "sym_s", "sym_s", static=["bmm_fp8"], strip=True)
    rc, res = audit(capsys, make_wheel(build / "sym_s.whl", {"pkg/_ops.so": stripped.read_bytes()}))
    assert rc == 0 and res["clean"]


@needs_gxx
def test_bmm_fp8_without_device_kernel_found_by_host_layers(build, capsys):
    """Like the real AOT op (cuBLASLt, no kernel): entry point + schema, no fatbin at all."""
    lib = host_lib(build / "bmm", "bmm", exported=["bmm_fp8"], schemas=["bmm_fp8"], strip=True)
    rc, res = audit(capsys, make_wheel(build / "bmm.whl", {"pkg/common_ops.abi3.so": lib.read_bytes()}))
    assert rc == 1 and res["ops_found"] == ["bmm_fp8"]
    assert layers_of(res) == {"elf-dynsym", "rodata-schema"}
    assert "0 fatbin containers" in res["layers"]["fatbin-kernel"]["scanned"]


@needs_gxx
@needs_nvcc
@pytest.mark.parametrize(
    "mode, compression",
    [("size", "4 zstd"), ("speed", "0 zstd"), (None, "2 plain"), ("no-compress", "4 plain")],
)
def test_embedded_fatbin_each_compress_mode(build, capsys, mode, compression):
    """nvcc 13: size -> zstd everywhere; speed -> LZ4 (PTX; small cubins stay plain);
    default -> plain cubins, zstd PTX; -no-compress -> all plain."""
    blob = nvcc_fatbin(
        build / f"fb_{mode}",
        "kernels.cu",
        kernels_source("dsv3_router_gemm"),
        mode=mode,
        arches=("sm_90a", "sm_100a"),
        code="both",
    )
    lib = host_lib(build / f"fb_{mode}", "fb", fatbin=blob, strip=True)
    rc, res = audit(capsys, make_wheel(build / f"fb_{mode}.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 1 and res["ops_found"] == ["dsv3_router_gemm"]
    assert layers_of(res) == {"fatbin-kernel", "ptx-entry"}
    kernels = {f["evidence"] for f in res["findings"] if f["layer"] == "fatbin-kernel"}
    assert "kernel dsv3_router_gemm_kernel" in kernels
    assert any(e.startswith("kernel void dsv3_router_gemm_tile<4>(float*)") for e in kernels)
    assert {a for f in res["findings"] for a in f["archs"]} == {
        "sm_90a",
        "sm_100a",
        "compute_90a",
        "compute_100a",
    }
    scanned = res["layers"]["fatbin-kernel"]["scanned"]
    assert "4 entries" in scanned and compression in scanned
    if mode == "speed":
        assert "0 LZ4" not in scanned


@needs_gxx
@needs_nvcc
def test_translation_unit_name_only(build, capsys):
    blob = nvcc_fatbin(build / "tu", "dsv3_fused_a_gemm.cu", NEUTRAL_CU, mode="size")
    lib = host_lib(build / "tu", "tu", fatbin=blob, strip=True)
    rc, res = audit(capsys, make_wheel(build / "tu.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 1 and res["ops_found"] == ["dsv3_fused_a_gemm"]
    assert "fatbin-tu" in layers_of(res)
    assert any(f["evidence"] == "translation unit dsv3_fused_a_gemm.cu" for f in res["findings"])
    # every kernel of a retired TU is attributed to the op, whatever its own name
    assert any("gemm_kernel(int*)" in f["evidence"] for f in res["findings"] if f["layer"] == "fatbin-kernel")


@needs_gxx
@needs_nvcc
def test_ptx_entries(build, capsys):
    blob = nvcc_fatbin(build / "ptx", "k.cu", kernels_source("bmm_fp8"), mode="size", code="ptx")
    lib = host_lib(build / "ptx", "ptx", fatbin=blob, strip=True)
    rc, res = audit(capsys, make_wheel(build / "ptx.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 1 and layers_of(res) == {"ptx-entry"} and res["ops_found"] == ["bmm_fp8"]
    assert any(f["evidence"] == "entry bmm_fp8_kernel" for f in res["findings"])


@needs_nvcc
def test_shipped_device_files(build, capsys):
    src = kernels_source("dsv3_fused_a_gemm")
    blob = nvcc_fatbin(build / "ship", "k.cu", src, mode="size")
    rc, res = audit(capsys, make_wheel(build / "shipf.whl", {"pkg/kernels/k.fatbin": blob}))
    assert rc == 1 and layers_of(res) == {"shipped-fatbin"}
    cubin = build / "ship" / "k.cubin"
    import subprocess

    subprocess.run(
        [NVCC, "-cubin", "-arch=sm_90a", "-o", str(cubin), str(build / "ship" / "k.cu")], check=True
    )
    ptx = build / "ship" / "k.ptx"
    subprocess.run([NVCC, "-ptx", "-arch=sm_90a", "-o", str(ptx), str(build / "ship" / "k.cu")], check=True)
    rc, res = audit(
        capsys,
        make_wheel(build / "shipc.whl", {"pkg/k.cubin": cubin.read_bytes(), "pkg/k.ptx": ptx.read_bytes()}),
    )
    assert rc == 1 and layers_of(res) == {"shipped-cubin", "shipped-ptx"}
    assert res["ops_found"] == ["dsv3_fused_a_gemm"]


@needs_gxx
@needs_nvcc
def test_dsv4_only_library_passes(build, capsys):
    blob = nvcc_fatbin(
        build / "v4", "dsv4_router_gemm.cu", kernels_source("dsv4_router_gemm") + NEUTRAL_CU, mode="size"
    )
    lib = host_lib(
        build / "v4",
        "v4",
        exported=["dsv4_router_gemm"],
        static=["dsv4_fused_a_gemm"],
        schemas=["dsv4_router_gemm"],
        strings=["dsv4_fused_a_gemm"],
        fatbin=blob,
    )
    rc, res = audit(capsys, make_wheel(build / "v4.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 0 and res["clean"] and res["findings"] == []
    # the same library with the default rules replaced by dsv4_* is flagged in every layer
    rc, res = audit(
        capsys, make_wheel(build / "v4.whl", {"pkg/_ops.so": lib.read_bytes()}), "--retired", "dsv4_*"
    )
    assert rc == 1
    assert {
        "elf-dynsym",
        "elf-symtab",
        "rodata-schema",
        "rodata-string",
        "fatbin-kernel",
        "fatbin-tu",
    } <= layers_of(res)
    assert "dsv4_router_gemm" in res["ops_found"]


def test_python_jit_sources_and_metadata_are_routed_not_findings(tmp_path, capsys):
    members = {
        "pkg/__init__.py": b"from .ops import dsv3_router_gemm, bmm_fp8\n",
        "pkg/ops.py": b"def dsv3_fused_a_gemm(a, b):\n    return flashinfer.bmm_fp8(a, b)\n",
        "pkg/jit/kernels/router.cuh": b"__global__ void dsv3_router_gemm_kernel() {}\n",
    }
    wheel = make_wheel(
        tmp_path / "py.whl", members, metadata_extra="Example: sgl_kernel.dsv3_router_gemm(x, w)"
    )
    rc, res = audit(capsys, wheel)
    assert rc == 0 and res["clean"] and res["findings"] == []
    routed = {(r["member"], r["kind"], r["op"]) for r in res["routed"]}
    assert ("pkg/__init__.py", "python", "dsv3_router_gemm") in routed
    assert ("pkg/ops.py", "python", "bmm_fp8") in routed
    assert ("pkg/jit/kernels/router.cuh", "jit-source", "dsv3_router_gemm") in routed
    assert ("demo-0.1.dist-info/METADATA", "metadata", "dsv3_router_gemm") in routed
    assert main(["audit", "--no-progress", str(wheel)]) == 0
    # files, not mentions: 2 Python files (4 mentions), 1 JIT source, 1 METADATA
    assert (
        "op names mentioned in 4 files (1 in jit-source, 1 in metadata, 2 in python; 6 mentions)"
        in capsys.readouterr().out
    )


@needs_gxx
def test_several_wheels_give_a_list_and_worst_exit_code(build, capsys, tmp_path):
    clean = make_wheel(tmp_path / "clean.whl", {"pkg/a.py": b"x = 1\n"})
    dirty = make_wheel(
        tmp_path / "dirty.whl",
        {"pkg/_ops.so": host_lib(build / "m", "m", exported=["bmm_fp8"], strip=True).read_bytes()},
    )
    rc, res = audit(capsys, clean, dirty)
    assert rc == 1 and [r["clean"] for r in res] == [True, False]
    rc, res = audit(capsys, clean, dirty, tmp_path / "missing.whl")
    assert rc == 2 and "not found" in res[2]["error"]


@needs_gxx
def test_static_archive_objects(build, capsys):
    """Objects inside a shipped .a are scanned like libraries (their .symtab and .rodata)."""
    import shutil
    import subprocess

    if shutil.which("ar") is None:
        pytest.skip("ar not found")
    src = build / "ar" / "obj.cpp"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text('void dsv3_fused_a_gemm(int* p) { *p = 1; }\nconst char* tag = "bmm_fp8";\n')
    obj = build / "ar" / "a_long_object_file_name_beyond_sixteen.o"
    subprocess.run([GXX, "-c", "-fPIC", "-o", str(obj), str(src)], check=True)
    lib = build / "ar" / "libops.a"
    subprocess.run(["ar", "rcs", str(lib), str(obj)], check=True)
    rc, res = audit(capsys, make_wheel(build / "ar.whl", {"lib/libops.a": lib.read_bytes()}))
    assert rc == 1 and res["ops_found"] == ["bmm_fp8", "dsv3_fused_a_gemm"]
    assert {(f["op"], f["layer"]) for f in res["findings"]} == {
        ("dsv3_fused_a_gemm", "elf-symtab"),
        ("bmm_fp8", "rodata-string"),
    }


def test_fatbin_hidden_in_a_binary_data_file(capsys, tmp_path):
    """Device code inside an arbitrary binary member is still found (as shipped fatbin)."""
    from audit_fixtures import fatbin_of, tiny_elf

    blob = (
        b"\x00DATA" * 1000
        + fatbin_of([(tiny_elf(["dsv3_router_gemm_kernel"]), 90, 0x100011)])
        + b"\x00" * 100
    )
    rc, res = audit(capsys, make_wheel(tmp_path / "hidden.whl", {"pkg/data/weights.bin": blob}))
    assert rc == 1 and {(f["op"], f["layer"]) for f in res["findings"]} == {
        ("dsv3_router_gemm", "shipped-fatbin")
    }
    assert "1 other binary files" in res["layers"]["shipped-fatbin"]["scanned"]


@needs_gxx
def test_code_hidden_in_nested_archives(build, capsys, tmp_path):
    """A vendored wheel/zip or a tarball inside the wheel is opened and scanned too."""
    import io
    import tarfile

    lib = host_lib(build / "nest", "nest", exported=["dsv3_router_gemm"], strip=True).read_bytes()
    inner = make_wheel(
        tmp_path / "inner-1.0-py3-none-any.whl", {"inner/_ops.so": lib, "inner/a.py": b"bmm_fp8\n"}
    )
    rc, res = audit(capsys, make_wheel(tmp_path / "outer.whl", {"pkg/vendor/inner.whl": inner.read_bytes()}))
    assert rc == 1 and res["ops_found"] == ["dsv3_router_gemm"]
    (f,) = res["findings"]
    assert f["member"] == "pkg/vendor/inner.whl" and f["layer"] == "elf-dynsym"
    assert f["evidence"].startswith("inner/_ops.so: dsv3_router_gemm(at::Tensor&")
    assert [r["member"] for r in res["routed"]] == ["pkg/vendor/inner.whl!inner/a.py"]

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("libs/_ops.so")
        info.size = len(lib)
        tf.addfile(info, io.BytesIO(lib))
    rc, res = audit(capsys, make_wheel(tmp_path / "tar.whl", {"pkg/data/libs.tar.gz": buf.getvalue()}))
    assert rc == 1 and res["ops_found"] == ["dsv3_router_gemm"]
    assert res["findings"][0]["evidence"].startswith("libs/_ops.so: ")


def test_nested_archive_limits(capsys, tmp_path):
    level = make_wheel(tmp_path / "l0.whl", {"pkg/a.py": b"x = 1\n"}).read_bytes()
    for i in range(1, 5):
        level = make_wheel(tmp_path / f"l{i}.whl", {f"pkg/l{i - 1}.zip": level}).read_bytes()
    (tmp_path / "deep.whl").write_bytes(level)
    rc, res = audit(capsys, tmp_path / "deep.whl")
    assert rc == 2 and "nested more than 3 deep" in res["error"]
    import zipfile

    lying = tmp_path / "lying.zip"
    with zipfile.ZipFile(lying, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("zeros.bin", b"\0" * (1 << 20))
    raw = bytearray(lying.read_bytes())
    cd = raw.rfind(b"PK\x01\x02")
    raw[cd + 24 : cd + 28] = (0xFFFFFFF0).to_bytes(4, "little")  # declares 4 GiB unpacked
    rc, res = audit(capsys, make_wheel(tmp_path / "nb.whl", {"pkg/bomb.zip": bytes(raw)}))
    # a nested member past the ratio floor that declares more than 200:1: refused before it is read
    assert rc == 2 and "pkg/bomb.zip (nested zip)" in res["error"] and "expands more than" in res["error"], res


def test_nested_zips_in_memory_and_spilled(capsys, tmp_path, monkeypatch):
    """Nested zips (TorchScript .pt/.ptl and jars: members with data descriptors) are opened by
    their central directory, from memory or, when larger, from the private spill file: the
    same answer either way (larger ones are not refused)."""
    import zipfile

    from slim_kernel.audit import nested

    out = Unseekable()
    with zipfile.ZipFile(out, "w") as zf:
        zf.writestr("m/data.pkl", b"\x80\x02" + b"\0" * 64)
        zf.writestr(
            zipfile.ZipInfo("m/code/model.py"), b"y = torch.ops.sgl_kernel.bmm_fp8(x)\n", zipfile.ZIP_DEFLATED
        )
    ptl = out.buf.getvalue()
    with zipfile.ZipFile(io.BytesIO(ptl)) as zf:
        assert all(i.flag_bits & 0x8 for i in zf.infolist())  # really data descriptors
    wheel = make_wheel(tmp_path / "ts.whl", {"pkg/model.ptl": ptl})
    rc, res = audit(capsys, wheel)
    assert rc == 0 and [(r["member"], r["op"]) for r in res["routed"]] == [
        ("pkg/model.ptl!m/code/model.py", "bmm_fp8")
    ]
    plain = make_wheel(tmp_path / "inner.whl", {"inner/a.py": b"bmm_fp8\n", "inner/b.bin": b"\0" * 5000})
    outer = make_wheel(tmp_path / "outer.whl", {"pkg/inner.whl": plain.read_bytes()})

    def without_time(result):
        rc, res = result
        return rc, {k: v for k, v in res.items() if k != "seconds"}

    in_memory = without_time(audit(capsys, outer))
    monkeypatch.setattr(nested, "ZIP_IN_MEMORY", 0)
    assert without_time(audit(capsys, outer)) == in_memory
    assert in_memory[1]["routed"][0]["member"] == "pkg/inner.whl!inner/a.py"
    rc, res = audit(capsys, wheel)
    assert rc == 0 and [r["member"] for r in res["routed"]] == ["pkg/model.ptl!m/code/model.py"]
