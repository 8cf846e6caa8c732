"""Each class of wheel layout (retired code where real projects put it, legit wheels, hostile
ones), built here with g++/nvcc where it needs them, audited in a subprocess under RLIMIT_AS: exit code, the ops found (or none), the phrase
of the refusal or mention, CPU time and peak RSS. CPU time, not wall time, is asserted (CI is
a loaded 2-core machine); wall and CPU times measured by benchmark/bench_audit.py --crafted are
in benchmark/results/audit/crafted.md."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from audit_fixtures.bounded import audit_cmd, run_bounded
from audit_fixtures.layouts import CASES

import slim_kernel

CPU_S = 10.0  # the target is 5 s of wall time on an idle 2-core machine
PEAK = 256 << 20
ENV = dict(os.environ, PYTHONPATH=str(Path(slim_kernel.__file__).resolve().parents[1]))
TOOLS = {"g++": shutil.which("g++"), "nvcc": __import__("audit_fixtures").NVCC}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("layouts")


def audit(wheel: Path, env=ENV):
    run = run_bounded(audit_cmd(wheel, "--time-limit", "120"), timeout=180, address_space=1 << 30, env=env)
    print(f"{wheel.name}: exit {run.rc}, {run.wall:.2f} s wall, {run.cpu:.2f} s CPU, {run.peak_mib:.0f} MiB")
    assert run.rc != "timeout", run.stderr
    return run, json.loads(run.stdout)["wheels"][0]


@pytest.mark.parametrize("name", list(CASES))
def test_layout_case(name, work):
    build, needs, code, ops, phrase = CASES[name]
    missing = [t for t in needs if not TOOLS[t]]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} to build the wheel")
    (work / name).mkdir(parents=True, exist_ok=True)
    run, res = audit(build(work / name))
    assert run.rc == code, res
    assert res["ops_found"] == ops, res
    assert run.cpu <= CPU_S and run.peak <= PEAK, (run.cpu, run.peak_mib)
    if phrase and code == 2:
        assert phrase in res["error"], res["error"]
    elif phrase:
        assert any(phrase in m["evidence"] for m in res["mentions"]), res["mentions"]


def test_no_external_demangler_needed(work):
    """Without c++filt on PATH (nor any binutils), mangled entry points are still found."""
    if not TOOLS["g++"]:
        pytest.skip("needs g++")
    wheel = CASES["mangled_entry_point"][0](work / "nopath")
    run, res = audit(wheel, env=dict(ENV, PATH=os.path.dirname(os.path.realpath(os.sys.executable))))
    assert run.rc == 1 and res["ops_found"] == ["dsv3_router_gemm"]
    assert {f["layer"] for f in res["findings"]} == {"elf-dynsym"}


def test_cubin_with_its_section_table_first_is_read(work):
    """A raw relocatable cubin whose section table precedes its sections (as CUPTI embeds them) is
    read whole: its kernel is found as device code, and nothing is left unreadable."""
    if not (TOOLS["g++"] and TOOLS["nvcc"]):
        pytest.skip("needs g++ and nvcc")
    run, res = audit(CASES["raw_cubin_table_first"][0](work / "table_first"))
    assert run.rc == 1 and res["ops_found"] == ["dsv3_router_gemm"], res
    assert "embedded-cubin" in {f["layer"] for f in res["findings"]}, res["findings"]
    assert res["unreadable"] == [], res["unreadable"]
