"""`slim-kernel info` (CPU): the doctor validates every knob and pin (exit 2), shows pins, says what is in force."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from slim_kernel import cli, knobs
from slim_kernel.jit import cache, routed


def _info(*args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLIM_KERNEL_BACKEND_")} | env
    return subprocess.run([sys.executable, "-m", "slim_kernel", "info", *args], capture_output=True, text=True,
                          env=full, timeout=300)


def test_info_json_has_a_schema_and_the_sections():
    proc = _info("--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["schema"] == 1 and report["errors"] == []
    for key in ("slim_kernel", "torch", "flashinfer", "bmm_fp8_fast_path", "knobs", "jit", "routing_tables", "devices"):
        assert key in report
    assert report["knobs"]["pdl"] == "auto"
    assert report["bmm_fp8_fast_path"]["bmm_fp8_fast_path"] in ("on", "off", "untested")


@pytest.fixture
def in_process(monkeypatch, capsys, tmp_path):
    """`slim-kernel info ARGS` in this process with ENV set (knobs re-read): (exit code, stdout)."""
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path / "cache"))

    def run(*args: str, **env: str) -> tuple[int, str]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        knobs.load_env()
        routed._RULES.clear()
        capsys.readouterr()
        code = cli.main(["info", *args])
        return code, capsys.readouterr().out

    yield run
    monkeypatch.undo()
    knobs.load_env()
    routed._RULES.clear()


def test_a_pin_is_shown_and_validated(in_process):
    code, out = in_process("--json", SLIM_KERNEL_BACKEND_DSV3_ROUTER_GEMM="flashinfer")
    assert code == 0 and json.loads(out)["knobs"]["SLIM_KERNEL_BACKEND_DSV3_ROUTER_GEMM"] == "flashinfer"
    assert "SLIM_KERNEL_BACKEND_DSV3_ROUTER_GEMM=flashinfer" in in_process(SLIM_KERNEL_BACKEND_DSV3_ROUTER_GEMM="flashinfer")[1]


@pytest.mark.parametrize("env,needle,shown", [
    ({"SLIM_KERNEL_BACKEND_BMM_FP8": "bogus"}, "SLIM_KERNEL_BACKEND_BMM_FP8 must be one of", None),
    ({"SLIM_KERNEL_PDL": "maybe"}, "SLIM_KERNEL_PDL must be one of", "pdl=invalid ('maybe')"),
    ({"SLIM_KERNEL_JIT": "never"}, "SLIM_KERNEL_JIT must be one of compile, cache-only", "SLIM_KERNEL_JIT=invalid ('never')"),
    ({"SLIM_KERNEL_JIT_CONFIG_DSV3_ROUTER_GEMM": "rt=0"}, "SLIM_KERNEL_JIT_CONFIG_DSV3_ROUTER_GEMM", None),
    ({"SLIM_KERNEL_LAUNCHER": "gpu"}, "SLIM_KERNEL_LAUNCHER must be one of", "SLIM_KERNEL_LAUNCHER=invalid ('gpu')"),
])
def test_a_bad_knob_is_an_error_with_exit_2(in_process, env, needle, shown):
    """The error, exit 2, and the knob shown with its bad value (never as the default it falls back to)."""
    code, text = in_process(**env)
    assert code == 2 and needle in text, text[-2000:]
    if shown:
        assert shown in next(line for line in text.splitlines() if line.strip().startswith("knobs:"))
    code, js = in_process("--json", **env)
    assert code == 2 and any(needle in e for e in json.loads(js)["errors"])


def test_the_cli_hides_torchs_numpy_warning(in_process):
    """A CPU torch without numpy warns "Failed to initialize NumPy" on import: not in the commands' output."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert in_process()[0] == 0
        warnings.warn("Failed to initialize NumPy: No module named 'numpy'", UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]


def test_routed_cache_coverage_is_reported(in_process):
    code, out = in_process("--json", "--model", "deepseek-v3")
    assert code == 0
    cov = json.loads(out)["jit_cache_coverage"]
    assert cov["shapes"] == "given" and cov["archs"] == []  # no GPU here and nothing cached yet
    assert "no GPU visible and no arch in the cache to check" in in_process("--model", "deepseek-v3")[1]
    assert in_process("--router", "256,7165")[0] == 2


def test_picks_cover_both_launch_contexts_under_auto(monkeypatch):
    # With SLIM_KERNEL_PDL=auto both table contexts are in force (slim_kernel.pdl): info lists each.
    import torch

    import slim_kernel.ops  # noqa: F401
    from slim_kernel import devices, info, knobs, registry, routing

    monkeypatch.setattr(registry, "arch", lambda device: "sm_90")
    monkeypatch.setattr(registry, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(devices, "routing_device", lambda device: routing.Device("NVIDIA H200", 132, "sm_90"))
    old = knobs.pdl_setting()
    try:
        knobs.set_pdl("auto")
        rows = info._picks(torch.device("cuda", 0))
        assert {r["pdl"] for r in rows} == {True, False} and len(rows) % 2 == 0
        knobs.set_pdl(False)
        assert {r["pdl"] for r in info._picks(torch.device("cuda", 0))} == {False}
    finally:
        knobs.set_pdl(old)


@pytest.mark.parametrize("installed,note", [("0.7.5", True), ("0.7.4", False), (None, False)])
def test_info_names_a_flashinfer_outside_the_measured_versions(in_process, monkeypatch, installed, note):
    from slim_kernel import info, routing

    monkeypatch.setattr(info, "_version", lambda dist: installed if dist == "flashinfer-python" else None)
    code, out = in_process("--json")
    notes = json.loads(out)["notes"]
    assert code == 0 and bool(notes) is note
    if note:
        measured = ", ".join(routing.table("sm_90").versions_of("flashinfer"))
        assert notes == [f"flashinfer 0.7.5 is not one of the measured versions ({measured}): routing uses "
                         "the nearest measured version's numbers (the bmm_fp8 fast path checks itself)"]
        assert "  note: flashinfer 0.7.5 is not one of the measured versions" in in_process()[1]
