"""Our kernels compile for the Blackwell targets (``sm_100a``: B200/B300, ``sm_120a``: RTX PRO 6000 / RTX 50xx)
within the limits their sources declare (no spills), with each NVRTC of pyproject.toml [tool.slim-kernel]
nvrtc-versions (the floor and the newest release: what a CUDA build of torch brings; nvcc, opt-in at run time,
is checked for sm_90a in tests/test_jit_compile.py), so ``slim-kernel tune`` has them to measure there. CPU,
slow-marked. One instance per configuration, at its largest M (the most registers and shared memory): every
configuration's body is compiled for each target without the whole matrix's cost (tests/test_jit_compile.py
covers every instance for sm_90a)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jit_fixtures.nvrtc_wheels import NEWEST, requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra brings tomli
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
ARCHS = ("sm_100a", "sm_120a")
VERSIONS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["slim-kernel"]["nvrtc-versions"]
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _report(toolchain: str, base: Path) -> dict:
    """What compiling the instances for ARCHS with ``toolchain`` (``nvrtc-X.Y``: that nvidia-cuda-nvrtc wheel,
    installed into its own directory) reported, or {"unusable": why}."""
    name, _, version = toolchain.partition("-")
    env = dict(os.environ, SLIM_KERNEL_CACHE_DIR=str(base / "cache"))
    env.pop("SLIM_KERNEL_JIT", None)
    wanted = requirement(version)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(base / "site"),
                          wanted], capture_output=True, text=True, timeout=900)
    if pip.returncode:
        return {"unusable": f"cannot install {wanted}: {pip.stderr[-1500:]}"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(base / "site"), env.get("PYTHONPATH")]))
    out = base / "report.json"
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "jit_fixtures" / "compile_archs.py"), name, str(out),
                           ",".join(ARCHS)], env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("toolchain", [f"nvrtc-{v}" for v in VERSIONS])
def test_every_configuration_compiles_for_blackwell_without_spills(toolchain, tmp_path):
    report = _report(toolchain, tmp_path)
    if "unusable" in report:
        if CI:
            pytest.fail(report["unusable"])
        pytest.skip(report["unusable"])
    name, _, version = toolchain.partition("-")
    expected = name if version in ("", NEWEST) else f"{name} {version}"  # "newest": whatever release pip resolved
    assert report["compiler"].startswith(expected + " "), report["compiler"]
    print(f"{report['compiler']}: {sum(map(len, report['archs'].values()))} instances in {report['seconds']} s")
    for arch in ARCHS:
        results = report["archs"][arch]
        assert results, arch
        for label, result in results.items():
            assert "error" not in result, f"{label} for {arch}: {result.get('error')}"
            assert result["header_arch"] == arch
            assert result["usage"] and result["usage"]["registers"] > 0, f"{label} for {arch}: no ptxas report"
            assert result["problems"] == [], f"{label} for {arch} with {report['compiler']}: {result['usage']}"
