"""AOT size baseline (CPU): a one-arch SLIM_KERNEL_AOT_BASELINE=ON build is the audit's real-world
negative control, and `slim-kernel size` measures the shipped wheel against it.

Builds, once per module and in fresh build dirs, the baseline wheel for sm_90a from the subset
manifest `nox -s size` builds by default (csrc/aot_baseline/manifest.py --subset: one instance per
op, kernel family and output dtype) and the shipped wheel, then checks: the +aot version and the
extension module; the audit exits 1 and flags every retired op through the layers an AOT op library
leaves (exported entry point, TORCH_LIBRARY schema in .rodata, one fatbin kernel per manifest
instance); the shipped wheel is clean; `size --baseline` reports a positive reduction. CMake's own
manifest (every instance, when none is passed) is checked at configure time. Marked slow (~1 minute
on 2 cores: nvcc and the nanobind module); nox -s test runs it. Needs nvcc, skipped without.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest
from _wheels import REPO, one_wheel, pip_wheel

from slim_kernel.jit.compiler import find_nvcc
from slim_kernel.names import OPS

MANIFEST_PY = REPO / "csrc" / "aot_baseline" / "manifest.py"
RETIRED = OPS
NVCC = find_nvcc()

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found: the AOT baseline cannot be built")

_ENV_DROP = ("SLIM_KERNEL_AOT_BASELINE", "SLIM_KERNEL_AOT_ARCHS", "SLIM_KERNEL_AOT_MANIFEST", "SLIM_KERNEL_NATIVE")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env.setdefault("CUDACXX", NVCC)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("aot")
    manifest = tmp / "manifest.json"
    subprocess.run([sys.executable, str(MANIFEST_PY), "-o", str(manifest), "--subset"], check=True,
                   capture_output=True)
    proc = pip_wheel(tmp / "baseline", tmp / "build-baseline",
                     _env(SLIM_KERNEL_AOT_BASELINE="ON", SLIM_KERNEL_AOT_ARCHS="90a",
                          SLIM_KERNEL_AOT_MANIFEST=str(manifest)))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    proc = pip_wheel(tmp / "shipped", tmp / "build-shipped", _env())
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return {"baseline": one_wheel(tmp / "baseline"), "shipped": one_wheel(tmp / "shipped"),
            "manifest": json.loads(manifest.read_text())}


def _manifest(tmp_path: Path, *flags: str) -> dict:
    out = tmp_path / f"manifest{''.join(flags)}.json"
    subprocess.run([sys.executable, str(MANIFEST_PY), "-o", str(out), *flags], check=True, capture_output=True)
    return json.loads(out.read_text())


def test_subset_manifest_has_one_instance_of_every_kernel_body(tmp_path):
    full, subset = _manifest(tmp_path), _manifest(tmp_path, "--subset")

    def groups(m: dict) -> list:
        return [(i["op"], dict(i["defines"])["SK_FAMILY"], dict(i["defines"]).get("SK_OUT_BF16")) for i in m["instances"]]

    assert sorted(groups(subset)) == sorted(set(groups(full)))  # each (op, family, out dtype) once
    assert {i["key"] for i in subset["instances"]} <= {i["key"] for i in full["instances"]}
    assert full["selection"]["set"] == "full" and subset["selection"]["set"] == "subset"
    assert full["selection"]["instances"] == subset["selection"]["catalogue"] == len(full["instances"])
    assert subset["selection"]["instances"] == len(subset["instances"]) == sum(subset["selection"]["per_op"].values())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slim_kernel", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_baseline_wheel_is_marked_and_carries_the_module(wheels):
    baseline, shipped = wheels["baseline"], wheels["shipped"]
    assert "+aot" in baseline.name and "+aot" not in shipped.name
    names = zipfile.ZipFile(baseline).namelist()
    assert [n for n in names if n.startswith("slim_kernel/_aot_baseline") and n.endswith(".so")], names
    assert not [n for n in zipfile.ZipFile(shipped).namelist() if "_aot_baseline" in n]


@pytest.mark.slow
def test_audit_flags_every_op_in_the_baseline(wheels):
    proc = _cli("audit", "--json", "--no-progress", str(wheels["baseline"]))
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    (report,) = json.loads(proc.stdout)["wheels"]
    assert not report["clean"] and set(RETIRED) <= set(report["ops_found"])
    layers, kernels = defaultdict(set), defaultdict(set)
    for f in report["findings"]:
        layers[f["op"]].add(f["layer"])
        if f["layer"] == "fatbin-kernel":
            kernels[f["op"]].add(f["evidence"])
    for op in RETIRED:  # the entry point named like the op, exported, and the op's schema string
        assert {"elf-dynsym", "rodata-schema"} <= layers[op], (op, layers[op])
    expected = defaultdict(set)  # every instance the JIT can launch, under its unique symbol (CMakeLists.txt)
    for inst in wheels["manifest"]["instances"]:
        digest = hashlib.sha256(f"{inst['source']}|{inst['entry']}|{inst['key']}".encode()).hexdigest()[:12]
        expected[inst["op"]].add(f"{inst['entry']}__{digest}")
    assert set(expected) == {"dsv3_router_gemm", "dsv3_fused_a_gemm"}, expected
    for op, symbols in expected.items():
        found = {e.split()[-1] for e in kernels[op]}
        assert found == symbols, (op, sorted(found), sorted(symbols))


@pytest.mark.slow
def test_shipped_wheel_is_clean(wheels):
    proc = _cli("audit", "--json", "--no-progress", str(wheels["shipped"]))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(proc.stdout)["wheels"][0]["clean"]


@pytest.mark.slow
def test_size_reports_a_reduction_vs_the_baseline(wheels, tmp_path):
    md = tmp_path / "size.md"
    proc = _cli("size", str(wheels["shipped"]), "--baseline", str(wheels["baseline"]), "--json", "--no-progress",
                "--markdown", str(md), "--budget", "1MiB")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    cmp = report["comparison"]
    assert cmp["file_bytes"]["bytes"] > 0 and cmp["native_bytes"]["bytes"] > 0, cmp
    for op in RETIRED:
        assert report["baseline"]["per_op"][op]["total"] > 0, report["baseline"]["per_op"]
        assert cmp["per_op"][op]["percent"] == 100.0, cmp["per_op"]
    assert set(report["baseline"]["per_arch"]) == {"sm_90a"}, report["baseline"]["per_arch"]
    assert report["budget"]["ok"]
    assert wheels["baseline"].name in md.read_text()


# ---- configure-time errors (cmake only, no compile) --------------------------------------------

def _configure(tmp_path: Path, *defs: str) -> subprocess.CompletedProcess:
    cmd = ["cmake", "-S", str(REPO), "-B", str(tmp_path / "build"), f"-DPython_EXECUTABLE={sys.executable}",
           "-DSLIM_KERNEL_NATIVE=OFF", "-DSLIM_KERNEL_AOT_BASELINE=ON", *defs]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")
def test_bad_arch_is_a_clear_error(tmp_path):
    proc = _configure(tmp_path, "-DSLIM_KERNEL_AOT_ARCHS=90a;hopper")
    assert proc.returncode != 0
    assert "SLIM_KERNEL_AOT_ARCHS entry 'hopper'" in _flat(proc.stderr), proc.stderr[-2000:]


def _flat(text: str) -> str:
    """CMake wraps messages at a width that depends on the paths in them: compare words, not lines."""
    return " ".join(text.split())


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")
def test_manifest_with_another_signature_is_a_clear_error(tmp_path):
    manifest = tmp_path / "m.json"
    subprocess.run([sys.executable, str(MANIFEST_PY), "-o", str(manifest)], check=True, capture_output=True)
    data = json.loads(manifest.read_text())
    data["instances"][0]["signature"] = "pppiii"
    manifest.write_text(json.dumps(data))
    proc = _configure(tmp_path, f"-DSLIM_KERNEL_AOT_MANIFEST={manifest}", "-DSLIM_KERNEL_AOT_ARCHS=90a")
    assert proc.returncode != 0
    assert "signature 'pppiii'" in _flat(proc.stderr) and "module.cpp" in proc.stderr, proc.stderr[-2000:]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not found")
def test_cmake_lists_every_instance_without_a_manifest(tmp_path):
    """No SLIM_KERNEL_AOT_MANIFEST: CMake runs manifest.py with the build's Python, every instance."""
    proc = _configure(tmp_path, "-DSLIM_KERNEL_AOT_ARCHS=90a")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    count = _manifest(tmp_path)["selection"]["catalogue"]
    assert f"{count} instances x archs 90a" in _flat(proc.stdout), proc.stdout[-2000:]
