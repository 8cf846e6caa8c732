"""`slim-kernel size`: bytes, per-arch split, per-op attribution, baseline diff, reports, budget."""

from __future__ import annotations

import json
import os
import sys
import zipfile

import pytest
from audit_fixtures import GXX, fatbin_of, host_lib, make_wheel, tiny_elf

from slim_kernel.audit.size import parse_size
from slim_kernel.cli import main

TU = "_ZN51_INTERNAL_1a2b3c4d_19_dsv3_router_gemm_cu_5e6f7a8b7counterE"
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ not found")


@pytest.mark.parametrize(
    "text, value",
    [
        ("5MB", 5_000_000),
        ("512KiB", 524_288),
        ("1048576", 1_048_576),
        ("1.5GiB", 1_610_612_736),
        ("10 kb", 10_000),
    ],
)
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["5 parsecs", "", "-1MB", "MB"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError, match="--budget"):
        parse_size(text)


def size_json(capsys, *args) -> tuple[int, dict]:
    rc = main(["size", "--json", "--no-progress", *map(str, args)])
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == 1
    return rc, report


@pytest.fixture
def wheels(tmp_path):
    """An 'AOT' baseline (router op: entry point, schema, two-arch cubins of its TU, plus a
    neutral kernel library) and a 'slim' subject with only the neutral library and Python."""
    router = tiny_elf(["gemm_kernel"] * 1, extra_symbols=[TU])
    other = tiny_elf(["topk_kernel"])
    fat = fatbin_of([(router, 90, 0x100011), (router, 100, 0x1100011), (other, 90, 0x100011)])
    aot = host_lib(
        tmp_path / "aot",
        "aot",
        exported=["dsv3_router_gemm"],
        schemas=["dsv3_router_gemm"],
        fatbin=fat,
        strip=True,
    ).read_bytes()
    neutral = host_lib(
        tmp_path / "neu", "neu", fatbin=fatbin_of([(other, 90, 0x100011)]), strip=True
    ).read_bytes()
    py = {"pkg/__init__.py": b"def dsv3_router_gemm(x, w):\n    return x @ w.T\n"}
    base = make_wheel(
        tmp_path / "aot-1.0.whl", {"pkg/_aot.so": aot, "pkg/_neu.so": neutral, **py}, dist="aot"
    )
    slim = make_wheel(tmp_path / "slim-1.0.whl", {"pkg/_neu.so": neutral, **py}, dist="slim")
    return slim, base, {"router": router, "other": other, "aot": aot}


@needs_gxx
def test_size_attribution_and_arch_split(capsys, wheels):
    slim, base, parts = wheels
    rc, rep = size_json(capsys, base)
    assert rc == 0
    s = rep["subject"]
    assert s["file_bytes"] == os.path.getsize(base)
    with zipfile.ZipFile(base) as zf:
        infos = zf.infolist()
    assert s["unpacked"] == sum(i.file_size for i in infos) and s["compressed"] == sum(
        i.compress_size for i in infos
    )
    entry = lambda cubin: 64 + len(cubin) + (-len(cubin) % 8)  # noqa: E731 - header + padded payload
    router_bytes = 2 * entry(parts["router"])
    op = s["per_op"]["dsv3_router_gemm"]
    assert op["device"] == router_bytes and op["archs"] == ["sm_100a", "sm_90a"]
    assert op["host"] > 0 and op["total"] == op["device"] + op["host"]
    assert op["members"] == {"pkg/_aot.so": op["total"]}
    assert list(s["per_op"]) == ["dsv3_router_gemm"]  # Python mentions are not native bytes
    assert s["per_arch"]["sm_90a"] == {
        "entries": 3,
        "stored": entry(parts["router"]) + 2 * entry(parts["other"]),
        "unpacked": len(parts["router"]) + 2 * len(parts["other"]),
    }
    assert s["per_arch"]["sm_100a"]["entries"] == 1
    assert s["device_bytes"] == sum(v["stored"] for v in s["per_arch"].values())
    assert s["largest"][0]["member"] == "pkg/_aot.so"
    units = {u["unit"]: u for u in s["per_translation_unit"]}
    assert units["dsv3_router_gemm.cu"]["stored"] == router_bytes


@needs_gxx
def test_baseline_reduction_and_member_diff(capsys, wheels, tmp_path):
    slim, base, parts = wheels
    md, png, js = tmp_path / "r.md", tmp_path / "r.png", tmp_path / "r.json"
    args = [slim, "--baseline", base, "--markdown", md, "--json-file", js]
    if _has_matplotlib():
        args += ["--png", png]
    rc, rep = size_json(capsys, *args)
    assert rc == 0 and json.loads(js.read_text()) == rep
    cmp = rep["comparison"]
    assert cmp["file_bytes"]["bytes"] == os.path.getsize(base) - os.path.getsize(slim)
    assert cmp["file_bytes"]["percent"] == pytest.approx(
        100 * cmp["file_bytes"]["bytes"] / os.path.getsize(base), abs=0.01
    )
    assert (
        cmp["per_op"]["dsv3_router_gemm"]["bytes"] == rep["baseline"]["per_op"]["dsv3_router_gemm"]["total"]
    )
    assert cmp["per_op"]["dsv3_router_gemm"]["percent"] == 100.0
    diff = {c["member"]: c for c in cmp["member_diff"]}
    assert diff["pkg/_aot.so"]["status"] == "removed" and diff["pkg/_aot.so"]["delta"] == -len(parts["aot"])
    assert "pkg/_neu.so" not in diff
    units = {c["unit"]: c for c in cmp["unit_diff"]}
    assert units["dsv3_router_gemm.cu"]["status"] == "removed" and cmp["units_removed"] == 1
    assert units["dsv3_router_gemm.cu"]["delta"] == -rep["baseline"]["per_op"]["dsv3_router_gemm"]["device"]
    text = md.read_text()
    assert "## Translation-unit (device code) diff vs baseline" in text
    assert (
        "## Reduction vs baseline" in text
        and "`dsv3_router_gemm`" in text
        and "| `pkg/_aot.so` | removed |" in text
    )
    if _has_matplotlib():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_budget_exit_codes(tmp_path, capsys):
    wheel = make_wheel(tmp_path / "b.whl", {"pkg/data.bin": os.urandom(20_000)})
    assert main(["size", str(wheel), "--budget", "1KB", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "EXCEEDED" in captured.out and "over the budget" in captured.err
    assert main(["size", str(wheel), "--budget", "10MiB", "--no-progress"]) == 0
    assert "budget 10.0 MiB: ok" in capsys.readouterr().out
    assert main(["size", str(wheel), "--budget", "lots"]) == 2
    assert "--budget" in capsys.readouterr().err


def test_size_reads_compressible_data_and_refuses_the_unreadable(tmp_path, capsys):
    # a highly compressible member is data, not a bomb: the streaming read's time and byte budget bound it
    zeros = tmp_path / "zeros.whl"
    with zipfile.ZipFile(zeros, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/zeros.bin", b"\0" * (64 << 20))
    assert main(["size", str(zeros), "--no-progress"]) == 0
    capsys.readouterr()
    ok = make_wheel(tmp_path / "ok.whl", {"pkg/a.py": b"x = 1\n"})
    assert main(["size", str(ok), "--baseline", str(tmp_path / "missing.whl"), "--no-progress"]) == 2
    assert "not found" in capsys.readouterr().err


@needs_gxx
@pytest.mark.skipif(__import__("audit_fixtures").NVCC is None, reason="nvcc not found")
def test_compressed_entries_stored_vs_unpacked(capsys, tmp_path):
    from audit_fixtures import NEUTRAL_CU, kernels_source, nvcc_fatbin

    blob = nvcc_fatbin(
        tmp_path / "z",
        "dsv3_router_gemm.cu",
        kernels_source("x") + NEUTRAL_CU,
        mode="size",
        arches=("sm_90a", "sm_100a"),
        code="both",
    )
    lib = host_lib(tmp_path / "z", "z", fatbin=blob, strip=True).read_bytes()
    rc, rep = size_json(capsys, make_wheel(tmp_path / "z.whl", {"pkg/_z.so": lib}))
    per_arch = rep["subject"]["per_arch"]
    assert set(per_arch) == {"sm_90a", "sm_100a", "compute_90a", "compute_100a"}
    for arch, v in per_arch.items():
        assert v["entries"] == 1 and 0 < v["stored"] < v["unpacked"], arch  # zstd payloads
    assert rep["subject"]["device_bytes"] == sum(v["stored"] for v in per_arch.values()) <= len(blob)
    op = rep["subject"]["per_op"]["dsv3_router_gemm"]  # attributed through the TU name alone
    assert op["device"] == rep["subject"]["device_bytes"] and op["host"] == 0


def test_png_without_matplotlib_is_one_line_and_exit_3(tmp_path, capsys, monkeypatch):
    wheel = make_wheel(tmp_path / "p.whl", {"pkg/a.py": b"x = 1\n"})
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    png = tmp_path / "s.png"
    assert main(["size", str(wheel), "--png", str(png), "--no-progress"]) == 3
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "matplotlib" in err[0] and "slim-kernel[audit]" in err[0], err
    assert "Traceback" not in captured.err and not png.exists()
