"""`slim-kernel info` (CPU): the doctor validates every knob and pin (exit 2), shows pins, says what is in force."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


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


def test_a_pin_is_shown_and_validated():
    proc = _info("--json", SLIM_KERNEL_BACKEND_DSV3_ROUTER_GEMM="flashinfer")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["knobs"]["SLIM_KERNEL_BACKEND_DSV3_ROUTER_GEMM"] == "flashinfer"
    assert "SLIM_KERNEL_BACKEND_DSV3_ROUTER_GEMM=flashinfer" in _info(SLIM_KERNEL_BACKEND_DSV3_ROUTER_GEMM="flashinfer").stdout


@pytest.mark.parametrize("env,needle", [
    ({"SLIM_KERNEL_BACKEND_BMM_FP8": "bogus"}, "SLIM_KERNEL_BACKEND_BMM_FP8 must be one of"),
    ({"SLIM_KERNEL_PDL": "maybe"}, "SLIM_KERNEL_PDL must be one of"),
    ({"SLIM_KERNEL_JIT_CONFIG_DSV3_ROUTER_GEMM": "rt=0"}, "SLIM_KERNEL_JIT_CONFIG_DSV3_ROUTER_GEMM"),
    ({"SLIM_KERNEL_LAUNCHER": "gpu"}, "SLIM_KERNEL_LAUNCHER must be one of"),
])
def test_a_bad_knob_is_an_error_with_exit_2(env, needle):
    text = _info(**env)
    assert text.returncode == 2 and needle in text.stdout, text.stdout[-2000:]
    js = _info("--json", **env)
    assert js.returncode == 2 and any(needle in e for e in json.loads(js.stdout)["errors"])


def test_picks_cover_both_launch_contexts_under_auto(monkeypatch):
    # With SLIM_KERNEL_PDL=auto both table contexts are in force (slim_kernel.pdl): info lists each.
    import torch

    import slim_kernel.ops  # noqa: F401
    from slim_kernel import info, knobs, registry, routing

    monkeypatch.setattr(registry, "arch", lambda device: "sm_90")
    monkeypatch.setattr(registry, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(registry, "routing_device", lambda device: routing.Device("NVIDIA H200", 132, "sm_90"))
    old = knobs.pdl_setting()
    try:
        knobs.set_pdl("auto")
        rows = info._picks(torch.device("cuda", 0))
        assert {r["pdl"] for r in rows} == {True, False} and len(rows) % 2 == 0
        knobs.set_pdl(False)
        assert {r["pdl"] for r in info._picks(torch.device("cuda", 0))} == {False}
    finally:
        knobs.set_pdl(old)
