"""A verdict on every wheel, agreeing with pip and the loader, in bounded CPU time and memory:
each crafted case (tests/audit_fixtures/verdicts.py) is audited in a subprocess and its exit
code, ops found, the rest of its JSON, CPU time (not wall: CI is a loaded machine) and peak
RSS are asserted. Also: an internal error exits 4 with the JSON, and no temporary directory
outlives the audit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from audit_fixtures.bounded import audit_cmd, run_bounded
from audit_fixtures.verdicts import CASES

import slim_kernel
from slim_kernel.audit import cli as audit_cli
from slim_kernel.audit.limits import Budget
from slim_kernel.audit.stream import PrivateSpill
from slim_kernel.cli import main

CPU_S = 5.0
PEAK = 256 << 20
ENV = dict(os.environ, PYTHONPATH=str(Path(slim_kernel.__file__).resolve().parents[1]))


@pytest.mark.parametrize("name", list(CASES))
def test_crafted_verdict(name, tmp_path):
    build, code, ops, check = CASES[name]
    wheel = build(tmp_path)
    env = dict(ENV, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    run = run_bounded(
        audit_cmd(wheel),
        timeout=float(os.environ.get("AUDIT_CASE_TIMEOUT", 120)),
        address_space=1 << 30,
        env=env,
    )
    print(f"{name}: exit {run.rc}, {run.cpu:.2f} s CPU, {run.peak_mib:.0f} MiB")
    res = json.loads(run.stdout)["wheels"][0]
    assert run.rc == code, (res, run.stderr[-2000:])
    assert res["ops_found"] == ops, res
    check(res)
    assert run.cpu <= CPU_S and run.peak <= PEAK, (run.cpu, run.peak_mib)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_internal_error_exits_4_with_the_json(tmp_path, capsys, monkeypatch):
    """A bug of the audit (here a MemoryError) is never read as 1 ("found"): 4, and the JSON
    names the wheel and the error; the other wheels are still audited."""
    good = tmp_path / "good.whl"
    with zipfile.ZipFile(good, "w") as zf:
        zf.writestr("pkg/a.py", "x = 1\n")
    real = audit_cli.scan_wheel

    def scan(path, *args, **kwargs):
        if "bad" in str(path):
            raise MemoryError("simulated")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(audit_cli, "scan_wheel", scan)
    assert main(["audit", "--json", "--no-progress", str(tmp_path / "bad.whl"), str(good)]) == 4
    out = capsys.readouterr()
    bad, ok = json.loads(out.out)["wheels"]
    assert bad["exit_code"] == 4 and "MemoryError: simulated" in bad["error"]
    assert ok["exit_code"] == 0 and ok["clean"]
    assert "internal error" in out.err


@pytest.mark.parametrize("command", ["audit", "size"])
def test_crash_outside_a_wheel_is_not_exit_1(command, monkeypatch, capsys):
    """1 means "found" (audit) or "over budget" (size): a crash is 4."""
    from slim_kernel.audit import size_cli

    def boom(args):
        raise RuntimeError("simulated")

    monkeypatch.setattr(audit_cli if command == "audit" else size_cli, "run", boom)
    assert main([command, "x.whl"]) == 4
    assert "RuntimeError: simulated" in capsys.readouterr().err


def test_help_lists_every_exit_code(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for code in (
        "0 no retired",
        "1 retired",
        "2 a wheel cannot",
        "3 a needed package",
        "4 an internal error",
    ):
        assert code in text, text


def test_spill_leaves_no_directory_while_open(tmp_path, monkeypatch):
    """The spill file's directory is gone as soon as the file is open: nothing outlives the
    process, however it ends (SIGKILL included)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    spill = PrivateSpill("test", Budget())
    try:
        spill.write(b"x" * 1000)
        assert list(tmp_path.iterdir()) == []
        spill.file.seek(0)
        assert spill.file.read(3) == b"xxx"
    finally:
        spill.close()


@pytest.mark.parametrize("how", ["refused", "killed"])
def test_no_temp_directory_survives(tmp_path, how):
    """A wheel whose nested zip spills to disk (over the 16 MiB held in memory): refused after
    the spill (exit 2: a duplicate name inside) or killed with SIGKILL mid-scan, its TMPDIR is
    empty afterwards."""
    import io
    import warnings

    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_STORED) as zf, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in ("big.bin", "big.bin"):
            zf.writestr(name, os.urandom(10 << 20))
    wheel = tmp_path / "spill.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/inner.zip", inner.getvalue())
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        audit_cmd(wheel), env=dict(ENV, TMPDIR=str(tmp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    if how == "killed":
        time.sleep(0.5)
        proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    if how == "refused":
        assert proc.returncode == 2 and "duplicate" in json.loads(out)["wheels"][0]["error"]
    assert list(tmp.iterdir()) == []


def test_unpacked_bytes_are_bounded_per_wheel_nested_archives_included(tmp_path):
    """Three nested zips of 3 MiB each in a wheel of 9 MiB: within a 15 MiB budget for the
    wheel's own members, over it with what the nested archives unpack."""
    import io

    from slim_kernel.audit.limits import HostileArchiveError, Limits
    from slim_kernel.audit.rules import Rules
    from slim_kernel.audit.runner import scan_wheel
    from slim_kernel.audit.scan import ScanContext

    members = {}
    for i in range(3):
        inner = io.BytesIO()
        with zipfile.ZipFile(inner, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("data.bin", os.urandom(3 << 20))
        members[f"pkg/inner{i}.zip"] = inner.getvalue()
    wheel = tmp_path / "nested.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    scan_wheel(str(wheel), ScanContext(Rules(), Limits(max_total_unpacked=20 << 20)), jobs=1)
    with pytest.raises(HostileArchiveError, match="nested archives included"):
        scan_wheel(str(wheel), ScanContext(Rules(), Limits(max_total_unpacked=15 << 20)), jobs=1)


@pytest.mark.parametrize("jobs", [1, 2])
def test_spill_is_bounded_per_wheel_not_per_worker(tmp_path, jobs):
    """Two nested zips of 50 MiB, each spilled to disk: a 90 MiB spill budget refuses the wheel
    whether its members are read in-process or by two workers (each may spill its share)."""
    import io

    from slim_kernel.audit.limits import HostileArchiveError, Limits
    from slim_kernel.audit.rules import Rules
    from slim_kernel.audit.runner import scan_wheel
    from slim_kernel.audit.scan import ScanContext

    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("zeros.bin", bytes(50 << 20))
    wheel = tmp_path / "spills.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(2):
            zf.writestr(f"pkg/inner{i}.zip", inner.getvalue())
    scan_wheel(str(wheel), ScanContext(Rules(), Limits(max_spill=120 << 20)), jobs=jobs, progress=False)
    with pytest.raises(HostileArchiveError, match="to keep on disk"):
        scan_wheel(str(wheel), ScanContext(Rules(), Limits(max_spill=90 << 20)), jobs=jobs, progress=False)
