"""Audit CLI contract, rules, the parallel path, the bounded-memory spill path, and that the
audit/size commands never import torch."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from audit_fixtures import GXX, fatbin_of, host_lib, make_wheel, tiny_elf

import slim_kernel
from slim_kernel.audit import runner
from slim_kernel.audit.limits import Limits
from slim_kernel.audit.rules import Rules, parse_retired
from slim_kernel.audit.scan import ScanContext, scan_member
from slim_kernel.cli import main

# the slim_kernel under test (source tree or installed wheel), for subprocesses
PACKAGE_ROOT = str(Path(slim_kernel.__file__).resolve().parents[1])
TU = "_ZN51_INTERNAL_1a2b3c4d_19_dsv3_router_gemm_cu_5e6f7a8b7counterE"


# -- rules ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, ops",
    [
        ("dsv3_router_gemm(at::Tensor&, at::Tensor const&, at::Tensor const&)", ["dsv3_router_gemm"]),
        ("flashinfer::bmm_fp8::CuBlasLtMatrixLayout::setAttribute<int>", ["bmm_fp8"]),
        (
            "_INTERNAL_418098ff_29_dsv3_router_gemm_float_out_cu_daf3352a_4790::thrust::seq",
            ["dsv3_router_gemm"],
        ),
        ("dsv3_fused_a_gemm.cu", ["dsv3_fused_a_gemm"]),
        ("dsv4_router_gemm(Tensor! output, Tensor mat_a, Tensor mat_b) -> ()", []),
        ("xbmm_fp8 bmm_fp8x mybmm_fp8", []),
        ("_Z16dsv3_router_gemmRN2at6TensorE", ["dsv3_router_gemm"]),  # mangled: no demangler needed
        ("$kernel$_Z16dsv3_router_gemmv", ["dsv3_router_gemm"]),  # a non-inlined device function
        ("_Z4tileIL_Z12bmm_fp8_thingEEvv", ["bmm_fp8"]),  # inside a template argument
        ("_Z19my_dsv3_router_gemmv _Z16dsv4_router_gemmv _Z8xbmm_fp8v", ["dsv3_router_gemm"]),
        ("_Z3fooI12dsv3_foo_barEvv", ["dsv3_foo_bar"]),
        ("dsv3_topk_kernel<4>", ["dsv3_topk_kernel"]),  # any other dsv3_* op
        ("my_dsv3_router_gemm_v2 dsv3_topk", ["dsv3_router_gemm", "dsv3_topk"]),
    ],
)
def test_rule_matching(text, ops):
    assert Rules().match(text) == ops


def test_schema_and_retired_parsing():
    rules = Rules()
    assert (
        rules.schema_op("dsv3_router_gemm(Tensor! output, Tensor mat_a, Tensor mat_b) -> ()")
        == "dsv3_router_gemm"
    )
    assert rules.schema_op("sgl_kernel::bmm_fp8.out(Tensor A) -> Tensor") == "bmm_fp8"
    assert rules.schema_op("dsv3_foo(Tensor x) -> ()") == "dsv3_foo"
    assert rules.schema_op("bmm_fp8(at::Tensor, at::Tensor)::<lambda()>") is None
    assert parse_retired(None) == ("bmm_fp8", "dsv3_router_gemm", "dsv3_fused_a_gemm", "dsv3_*")
    assert parse_retired(["a_op,b_*", "c"]) == ("a_op", "b_*", "c")
    with pytest.raises(ValueError, match="--retired"):
        parse_retired(["*"])
    custom = Rules(parse_retired(["dsv4_*"]))
    assert custom.match("dsv4_router_gemm dsv3_router_gemm") == ["dsv4_router_gemm"]


# -- contract -------------------------------------------------------------------------------
def _synthetic_wheel(path: Path, build: Path) -> Path:
    cubin = tiny_elf(["gemm_kernel"], extra_symbols=[TU])
    lib = host_lib(
        build,
        "ops",
        exported=["dsv3_router_gemm"],
        schemas=["dsv3_router_gemm"],
        fatbin=fatbin_of([(cubin, 90, 0x100011), (cubin, 100, 0x1100011)]),
        strip=True,
    )
    return make_wheel(
        path, {"pkg/_ops.so": lib.read_bytes(), "pkg/__init__.py": b"from ._ops import bmm_fp8\n"}
    )


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_json_contract_and_human_report(tmp_path, capsys):
    wheel = _synthetic_wheel(tmp_path / "w.whl", tmp_path / "b")
    assert main(["audit", "--json", "--no-progress", str(wheel)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"schema", "wheels"} and doc["schema"] == 1 and len(doc["wheels"]) == 1
    (res,) = doc["wheels"]
    assert {"wheel", "clean", "ops_found", "findings", "seconds"} <= set(res)
    assert res["wheel"] == str(wheel) and res["clean"] is False and isinstance(res["seconds"], float)
    assert res["ops_found"] == ["dsv3_router_gemm"]
    for f in res["findings"]:
        assert {"op", "member", "layer", "evidence"} <= set(f) and f["member"] == "pkg/_ops.so"
    assert {f["layer"] for f in res["findings"]} == {
        "elf-dynsym",
        "rodata-schema",
        "fatbin-tu",
        "fatbin-kernel",
    }
    tu = [f for f in res["findings"] if f["layer"] == "fatbin-tu"]
    assert tu[0]["evidence"] == "translation unit dsv3_router_gemm.cu" and tu[0]["archs"] == [
        "sm_100a",
        "sm_90a",
    ]
    assert res["routed"] == [
        {
            "op": "bmm_fp8",
            "member": "pkg/__init__.py",
            "kind": "python",
            "count": 1,
            "evidence": ["from ._ops import bmm_fp8"],
        }
    ]
    assert main(["audit", "--no-progress", str(wheel)]) == 1
    text = capsys.readouterr().out
    assert "RETIRED AOT CODE FOUND: dsv3_router_gemm" in text
    assert "rodata-schema" in text and "2 cubins" in text and "info (routed, not AOT code)" in text


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_pool_path_matches_in_process(tmp_path, monkeypatch):
    wheels = tmp_path / "w.whl"
    _synthetic_wheel(wheels, tmp_path / "b")
    ctx = ScanContext(Rules(), Limits())
    serial = runner.scan_wheel(str(wheels), ctx, jobs=1, progress=False)
    monkeypatch.setattr(runner, "POOL_THRESHOLD", 0)
    monkeypatch.setattr(runner, "BIG_MEMBER", 1)  # every member its own task
    pooled = runner.scan_wheel(str(wheels), ctx, jobs=2, progress=False)
    key = lambda s: [(s.member, h.op, h.layer, h.evidence, h.arch) for h in s.hits]  # noqa: E731
    assert [key(s) for s in pooled.scans] == [key(s) for s in serial.scans] and serial.scans[0].hits


@pytest.mark.skipif(GXX is None, reason="g++ not found")
def test_retained_bytes_spill_to_private_file(tmp_path):
    """Above the memory cap, retained ELF bytes go to a temp file: same result either way."""
    lib = host_lib(
        tmp_path,
        "big",
        exported=["bmm_fp8"],
        schemas=["bmm_fp8"],
        fatbin=fatbin_of([(tiny_elf(["bmm_fp8_kernel"]), 90, 0x11)]),
        strip=True,
    ).read_bytes()

    def hits(limits):
        scan = scan_member(io.BytesIO(lib), "x.so", len(lib), len(lib), ScanContext(Rules(), limits))
        return sorted((h.layer, h.evidence) for h in scan.hits)

    import tempfile

    private = tmp_path / "tmp"
    private.mkdir()
    made = []
    real_mkdtemp = tempfile.mkdtemp
    old, tempfile.tempdir = tempfile.tempdir, str(private)
    tempfile.mkdtemp = lambda *a, **k: made.append(real_mkdtemp(*a, **k)) or made[-1]
    try:
        spilled = hits(Limits(retained_in_memory=1024))
    finally:
        tempfile.tempdir, tempfile.mkdtemp = old, real_mkdtemp
    assert len(made) == 1 and made[0].startswith(str(private))  # it did spill, privately
    assert list(private.iterdir()) == []  # and the spill file and its directory are gone
    assert spilled == hits(Limits()) != []


def test_progress_bar_on_stderr(tmp_path, capsys):
    wheel = make_wheel(tmp_path / "p.whl", {"pkg/a.py": b"x = 1\n" * 1000})
    assert main(["audit", "--progress", str(wheel)]) == 0
    assert "audit p.whl" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--time-limit", "0"], ["--time-limit", "nan"]])
def test_bad_jobs_and_time_limit_arguments(capsys, args):
    assert main(["audit", *args, "x.whl"]) == 2
    assert args[0] in capsys.readouterr().err


@pytest.mark.parametrize("command", [["audit"], ["size", "--budget", "1MB"]])
def test_cli_does_not_import_torch(tmp_path, command):
    wheel = make_wheel(tmp_path / "t.whl", {"pkg/a.py": b"x = 1\n"})
    code = (
        "import sys; from slim_kernel.cli import main; "
        f"rc = main({command[:1] + [str(wheel)] + command[1:] + ['--no-progress']!r}); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "slim_kernel", *command[:1], str(wheel)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert ("CLEAN" if command == ["audit"] else "t.whl:") in proc.stdout


def test_demangler_is_a_library_and_refuses_costly_names(monkeypatch):
    from slim_kernel.audit import demangle

    if demangle._library() is None:
        pytest.skip("cpp-demangle not installed")
    assert demangle.demangle("_Z7bmm_fp8v") == "bmm_fp8()"
    assert demangle.demangle("_Z16dsv3_router_gemmi") == "dsv3_router_gemm(int)"
    assert demangle.demangle("$kernel$_Z3foov") == "$kernel$foo()"
    assert demangle.demangle("plain_name") == "plain_name" and demangle.demangle("_Z3foo\x85bar") == "_Z3foo\x85bar"
    assert demangle.demangle("_Z" + "a" * 10_000) == "_Z" + "a" * 10_000
    # output that doubles with each back-reference is not produced (a demangler bomb)
    bomb = "_Z1fI1PIiiE" + "".join(f"S_IS{i}_S{i}_E" for i in range(8)) * 3 + "Ev"
    assert demangle.demangle(bomb) == bomb
    monkeypatch.setattr(demangle, "_library", lambda: None)
    assert demangle.demangle("_Z7bmm_fp8v") == "_Z7bmm_fp8v" and demangle.name().startswith("none")


# -- the cubin SM rule shared with the JIT cache -----------------------------------------------
@pytest.mark.parametrize(
    "abi, flags, arch",
    [  # e_flags as found in sgl-kernel 0.3.21's cubins (CUDA 12.x) and nvcc 13.0 output
        (7, 0x5A055A, "sm_90"),
        (7, 0x5A0D5A, "sm_90a"),
        (7, 0x500550, "sm_80"),
        (8, 0x600640A, "sm_100a"),
        (8, 0x600780A, "sm_120a"),
        (8, 0x6006402, "sm_100"),
        (8, 0x6005A04, "sm_90"),
    ],
)
def test_one_cubin_sm_rule_for_audit_and_jit(tmp_path, capsys, abi, flags, arch):
    from slim_kernel.jit.resources import cubin_sm

    cubin = bytearray(tiny_elf(["bmm_fp8_kernel"], flags=flags))
    cubin[7], cubin[8] = (0x41, 8) if abi == 8 else (0x33, 7)
    assert cubin_sm(bytes(cubin)) == int(arch.split("_")[1].rstrip("a"))
    assert (
        main(
            ["audit", "--json", "--no-progress", str(make_wheel(tmp_path / "c.whl", {"pkg/k.cubin": cubin}))]
        )
        == 1
    )
    (res,) = json.loads(capsys.readouterr().out)["wheels"]
    assert {a for f in res["findings"] for a in f["archs"]} == {arch}  # the shipped .cubin's own arch


# -- a missing decompressor is a clear exit 3, not a traceback --------------------------------
@pytest.mark.parametrize("module, flags", [("lz4", 0x2011), ("zstandard", 0x8011)])
def test_missing_decompressor_names_the_package(tmp_path, capsys, monkeypatch, module, flags):
    from audit_fixtures import fatbin_entry, fatbin_header

    blob = fatbin_header(64 + 16) + fatbin_entry(2, b"\xff" * 16, flags=flags, csize=16, usize=64)
    wheel = make_wheel(tmp_path / "z.whl", {"pkg/k.fatbin": blob})
    for name in (module, f"{module}.block"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    assert main(["audit", "--no-progress", "--jobs", "1", str(wheel)]) == 3
    out = capsys.readouterr().out
    assert f"needs the '{module}' package" in out and "Traceback" not in out
    assert main(["size", "--no-progress", "--jobs", "1", str(wheel)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"'{module}'" in err
