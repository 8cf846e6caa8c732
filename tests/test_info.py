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


@pytest.mark.parametrize("installed,note", [("0.7.5", True), ("0.7.4", False), ("0.7.2", False), ("0.7.3", True),
                                            (None, False)])
def test_info_names_a_flashinfer_outside_the_measured_versions(in_process, monkeypatch, installed, note):
    from slim_kernel import info, routing

    monkeypatch.setattr(info, "_version", lambda dist: installed if dist == "flashinfer-python" else None)
    code, out = in_process("--json")
    notes = json.loads(out)["notes"]
    assert code == 0 and bool(notes) is note
    if note:
        measured = ", ".join(routing.table("sm_90").versions_of("flashinfer"))
        assert notes == [f"flashinfer {installed} is not one of the measured versions ({measured}): routing uses "
                         "the nearest measured version's numbers (the bmm_fp8 fast path checks itself)"]
        assert f"  note: flashinfer {installed} is not one of the measured versions" in in_process()[1]


def test_the_short_form_says_what_runs_and_each_reason_once(in_process):
    code, short = in_process()
    assert code == 0
    _, verbose = in_process("--verbose")
    report = json.loads(in_process("--json")[1])
    cpu = "\n".join(short.split("\ncpu: what each op runs by default\n", 1)[1].splitlines()[:3])
    assert [line.split(":")[0].strip() for line in cpu.splitlines()] == list(report["devices"][0]["ops"])
    assert all(line.split(": ", 1)[1].startswith("torch") or "jit" in line for line in cpu.splitlines())
    driver = report["jit"].get("driver")
    if driver not in (None, "ok"):  # no GPU driver here: said once in the short form, per backend in --verbose
        assert short.count(driver) == 1 and verbose.count(driver) >= 3, short
    assert "fp32 reference, any shape" in verbose and "fp32 reference, any shape" not in short
    assert "--verbose" in short and len(short.splitlines()) < len(verbose.splitlines())


def _fake_entries(root, arch: str, compiler: str, n: int) -> None:
    """``n`` cache entries for ``arch`` whose headers say ``compiler`` built them (their keys match no lookup)."""
    directory = cache.cubin_dir(arch, root)
    directory.mkdir(parents=True)
    for i in range(n):
        header = {"format": cache.FORMAT, "key": f"{i:064x}", "arch": arch, "compiler": compiler, "cubin_size": 4}
        (directory / f"fake_{i}-{i:032x}{cache.SUFFIX}").write_bytes(cache.pack_entry(header, b"\0" * 4))


@pytest.mark.needs_compiler("nvrtc")
@pytest.mark.parametrize("built_by", ["nvcc 13.0.88 (Build cuda_13.0.r13.0/compiler.fake)", "this process's"])
def test_a_cache_built_by_another_compiler_is_explained(in_process, tmp_path, monkeypatch, built_by):
    from slim_kernel.jit import compiler

    monkeypatch.setenv(compiler.ENV_COMPILER, "nvrtc")
    this = compiler.get_compiler("nvrtc").fingerprint()
    other = built_by != "this process's"
    _fake_entries(tmp_path / "cache", "sm_90a", built_by if other else this, 5)
    code, out = in_process("--json", "--model", "deepseek-v3")
    (row,) = json.loads(out)["jit_cache_coverage"]["per_arch"]
    assert code == 0 and row["arch"] == "sm_90a" and row["cached"] == 0 and row["missing"]
    if not other:  # entries of this compiler that are merely not the routed ones: no compiler story
        assert "mismatch" not in row
        return
    assert row["cache_compilers"] == {built_by: 5} and row["this_compiler"] == this
    for needle in (f"5 by {built_by}", f"compiles with {this}", "slim-kernel precompile", "SLIM_KERNEL_JIT_COMPILER=nvcc"):
        assert needle in row["mismatch"], row["mismatch"]
    text = in_process("--model", "deepseek-v3")[1]
    assert f"    why: {row['mismatch']}" in text
