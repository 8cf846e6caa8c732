"""`slim-kernel precompile` (CPU): fills the cache for the listed archs with no GPU, in parallel;
counts what it verified on disk (compiled by this run vs already present, honest under 16
concurrent runs); exits 1 naming the cause when entries cannot be stored (read-only, /proc, a file
in the way, a full disk, a publish that did not land); refuses archs below SM 9.0 and bad input
with exit 2; shows a progress bar on a terminal, a line every few seconds elsewhere."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from jit_fixtures import instances as fx

from slim_kernel import cli
from slim_kernel.jit import cache, precompile

REPO = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^precompile: (\d+) of (\d+) verified in the cache (\S+) \((\d+) compiled by this run, "
                     r"(\d+) already present(?:, (\d+) FAILED)?\); ")


@pytest.fixture
def small_catalogue(monkeypatch):
    """Four fixture kernels (quick to compile) in place of the shipped catalogue."""
    monkeypatch.setattr(precompile, "catalogue", lambda: [("fixture_axpby", fx.axpby(b)) for b in range(4)])


PROGRESS_LINE = re.compile(r"^precompile: \d+ of \d+ compiled, \d+ s$")


def _summary(out: str) -> dict:
    (line,) = out.splitlines()  # one line on stdout, nothing else
    m = SUMMARY.match(line)
    assert m, line
    verified, total, root, compiled, present, failed = m.groups()
    return {"verified": int(verified), "total": int(total), "root": root, "compiled": int(compiled),
            "present": int(present), "failed": int(failed or 0)}


def test_precompile_then_all_present(cache_dir, capsys, small_catalogue):
    n = len(precompile.load_instances(None))
    assert cli.main(["precompile", "--arch", "9.0a", "--arch", "sm_100a", "-j", "2"]) == 0
    out, err = capsys.readouterr()
    assert _summary(out) == {"verified": 2 * n, "total": 2 * n, "root": str(cache_dir), "compiled": 2 * n,
                             "present": 0, "failed": 0}
    assert all(PROGRESS_LINE.match(line) for line in err.splitlines()), err  # not a terminal: progress lines only
    assert cache.cached_counts(cache_dir) == {"sm_100a": n, "sm_90a": n}
    cache.clear_memory()
    assert cli.main(["precompile", "--arch", "9.0a", "--arch", "10.0a"]) == 0
    assert _summary(capsys.readouterr().out) | {"root": None} == {
        "verified": 2 * n, "total": 2 * n, "root": None, "compiled": 0, "present": 2 * n, "failed": 0}


@pytest.mark.needs_compiler("nvcc")
def test_precompile_ops_filter_and_compiler(cache_dir, capsys, monkeypatch):
    pairs = [("fixture_axpby", fx.axpby(b)) for b in range(3)] + [("other_op", fx.axpby(9))]
    monkeypatch.setattr(precompile, "catalogue", lambda: pairs)
    op = pairs[0][0]
    expected = sum(1 for name, _ in pairs if name == op)
    assert cli.main(["precompile", "--arch", "9.0a", "--ops", op, "--compiler", "nvcc", "-j", "1"]) == 0
    assert _summary(capsys.readouterr().out)["compiled"] == expected
    assert cache.cached_counts(cache_dir) == {"sm_90a": expected}


@pytest.mark.parametrize("argv,message", [
    (["--arch", "9.0a", "--ops", "no_such_op"], "unknown op(s) no_such_op"),
    (["--arch", "hopper"], "arch must look like"),
    (["--arch", "9.0a", "-j", "0"], "--jobs must be >= 1"),
    (["--arch", "8.0"], "arch sm_80 is not supported: the JIT kernels need SM >= 9.0"),
    (["--arch", "9.0a", "--arch", "8.9"], "arch sm_89 is not supported: the JIT kernels need SM >= 9.0"),
    (["--arch", "7.5"], "arch sm_75 is not supported"),
])
def test_precompile_bad_input_is_one_line_and_exit_2(cache_dir, capsys, monkeypatch, argv, message):
    monkeypatch.setattr(cache, "_compile", lambda *a: pytest.fail("compiled despite bad input"))
    assert cli.main(["precompile", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and message in err
    assert not cache_dir.exists()


@pytest.mark.parametrize("arch,expected", [("9.0", "sm_90"), ("9.0a", "sm_90a"), ("10.0a", "sm_100a"),
                                           ("12.0", "sm_120")])
def test_supported_archs(arch, expected):
    assert precompile.supported_arch(arch) == expected


def test_precompile_plain_sm90(cache_dir, capsys, small_catalogue):
    assert cli.main(["precompile", "--arch", "9.0", "-j", "1"]) == 0
    assert _summary(capsys.readouterr().out)["verified"] == 4
    assert cache.cached_counts(cache_dir) == {"sm_90": 4}


def test_precompile_catalogue_that_cannot_load_says_so(cache_dir, capsys, monkeypatch):
    def broken():
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(precompile, "catalogue", broken)
    assert cli.main(["precompile", "--arch", "9.0a"]) == 2
    assert "the kernel catalogue cannot be loaded: No module named 'torch'" in capsys.readouterr().err


def _unstorable(tmp_path, monkeypatch, kind: str) -> str:
    """A cache dir that cannot take entries; the reason precompile must name."""
    if kind == "read-only":
        root = tmp_path / "ro"
        real_mkdir = os.mkdir

        def mkdir(path, *a, **k):  # root ignores permission bits: simulate EROFS
            if str(path).startswith(str(root)):
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real_mkdir(path, *a, **k)

        monkeypatch.setattr(os, "mkdir", mkdir)
        return str(root), f"{root}: Read-only file system (EROFS)"
    if kind == "proc":
        return "/proc/slim_kernel_cache", "/proc/slim_kernel_cache: No such file or directory (ENOENT)"
    file = tmp_path / "a_file"
    file.write_text("")
    if kind == "file as the dir":
        return str(file), f"{file}: exists and is not a directory (ENOTDIR)"
    return str(file / "cache"), f"{file / 'cache'}: Not a directory (ENOTDIR)"


@pytest.mark.parametrize("kind", ["read-only", "proc", "file as the dir", "file as a parent"])
def test_precompile_fails_fast_when_the_cache_cannot_take_entries(cache_dir, tmp_path, capsys, monkeypatch,
                                                                  small_catalogue, kind):
    root, reason = _unstorable(tmp_path, monkeypatch, kind)
    monkeypatch.setattr(cache, "_compile", lambda *a: pytest.fail("compiled although nothing can be stored"))
    assert cli.main(["precompile", "--arch", "9.0a", "--cache-dir", root, "-j", "1"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == f"slim-kernel precompile: cannot store sm_90a entries in the cache {root}: {reason}"


def test_precompile_full_disk_names_each_entry_and_exits_1(cache_dir, capsys, monkeypatch, small_catalogue):
    def full(fd, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.os, "fdopen", full)
    assert cli.main(["precompile", "--arch", "9.0a", "-j", "1"]) == 1
    out, err = capsys.readouterr()
    assert _summary(out) | {"root": None} == {"verified": 0, "total": 4, "root": None, "compiled": 0,
                                              "present": 0, "failed": 4}
    failed = err.splitlines()
    assert len(failed) == 4 and all(line.startswith("FAILED fixture_axpby[BIAS=") for line in failed)
    assert all("compiled but not stored: No space left on device (ENOSPC)" in line for line in failed)
    assert not list((cache_dir / "cubin-v1" / "sm_90a").glob("*.slimcubin"))


def test_precompile_counts_what_is_on_disk_not_what_was_reported(cache_dir, capsys, monkeypatch, small_catalogue):
    """A publish that 'succeeds' but never lands (a lying file system) is caught by the re-read."""
    monkeypatch.setattr(cache.os, "replace", lambda src, dst: os.unlink(src))
    assert cli.main(["precompile", "--arch", "9.0a", "-j", "1"]) == 1
    out, err = capsys.readouterr()
    assert _summary(out)["verified"] == 0 and _summary(out)["failed"] == 4
    assert err.count("not in the cache after the run (missing)") == 4


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("flags,bar", [([], True), (["--no-progress"], False)])
def test_progress_bar_only_on_a_terminal(cache_dir, capsys, monkeypatch, small_catalogue, flags, bar):
    pytest.importorskip("tqdm")
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    assert cli.main(["precompile", "--arch", "9.0a", "-j", "1", *flags]) == 0
    assert ("compiling" in tty.getvalue()) is bar and ("/4 [" in tty.getvalue()) is bar  # tqdm throttles redraws
    assert _summary(capsys.readouterr().out)["compiled"] == 4


@pytest.mark.parametrize("flags,lines", [([], True), (["--no-progress"], False)])
def test_progress_lines_when_not_a_terminal(cache_dir, capsys, monkeypatch, small_catalogue, flags, lines):
    """Docker builds and CI logs: a line with the count and the elapsed time (here after every kernel)."""
    monkeypatch.setattr(precompile, "LINE_EVERY_S", 0.0)
    assert cli.main(["precompile", "--arch", "9.0a", "-j", "1", *flags]) == 0
    out, err = capsys.readouterr()
    assert _summary(out)["compiled"] == 4
    if not lines:
        assert err == ""
        return
    got = err.splitlines()
    assert all(PROGRESS_LINE.match(line) for line in got) and len(got) >= 4, err
    assert [int(line.split()[1]) for line in got[:4]] == [1, 2, 3, 4]


_RUN = textwrap.dedent("""
    import sys, time
    from jit_fixtures import instances as fx
    from slim_kernel import cli
    from slim_kernel.jit import precompile
    precompile.catalogue = lambda: [("fixture_axpby", fx.axpby(b)) for b in range(4)]
    while time.time() < float(sys.argv[1]):  # line the runs up on one instant
        time.sleep(0.001)
    sys.exit(cli.main(["precompile", "--arch", "9.0a", "-j", "1", "--no-progress"]))
""")


def test_sixteen_concurrent_runs_count_honestly(tmp_path):
    """16 runs on a cold cache: 4 compiles in all, so the runs' 'compiled by this run' sum to 4 and
    each run verifies 4 of 4."""
    trace = tmp_path / "trace.jsonl"
    env = dict(os.environ, SLIM_KERNEL_CACHE_DIR=str(tmp_path / "cache"), SLIM_KERNEL_JIT_TRACE=str(trace),
               PYTHONPATH=os.pathsep.join([str(REPO / "python"), str(REPO / "tests")]))
    start = str(time.time() + 5.0)
    procs = [subprocess.Popen([sys.executable, "-c", _RUN, start], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(16)]
    summaries = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        summaries.append(_summary(out))
    assert all(s["verified"] == s["total"] == 4 and s["failed"] == 0 for s in summaries)
    assert all(s["compiled"] + s["present"] == 4 for s in summaries)
    compiles = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len([e for e in compiles if e["event"] == "compile"]) == 4
    assert sum(s["compiled"] for s in summaries) == 4


def test_the_shipped_catalogue_is_what_precompile_builds():
    from slim_kernel.jit import catalogue as cat

    assert precompile.catalogue() == cat.all_instances()
    assert set(precompile.load_instances(["dsv3_fused_a_gemm"])) == {
        i for op, i in cat.all_instances() if op == "dsv3_fused_a_gemm"}
