"""`slim-kernel precompile` (CPU): fills the cache for the listed archs with no GPU, in parallel;
a second run compiles nothing and says so; bad input is a clear error."""

from __future__ import annotations

import sys
import types

import pytest

from slim_kernel import cli
from slim_kernel.jit import cache, precompile


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path / "cache"))
    cache.clear_memory()
    yield tmp_path / "cache"
    cache.clear_memory()


def _instances():
    try:
        return precompile.load_instances(None)
    except RuntimeError as exc:
        pytest.skip(str(exc))


def test_precompile_then_nothing_to_do(cache_dir, capsys):
    n = len(_instances())
    assert cli.main(["precompile", "--arch", "9.0a", "--arch", "sm_100a", "-j", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{2 * n} instantiations" in out and f"compiled {2 * n} of {2 * n}" in out
    assert cache.cached_counts(cache_dir) == {"sm_100a": n, "sm_90a": n}
    cache.clear_memory()
    assert cli.main(["precompile", "--arch", "9.0a", "--arch", "10.0a"]) == 0
    out = capsys.readouterr().out
    assert f"nothing to do: all {2 * n} are already cached" in out


def test_precompile_ops_filter_and_compiler(cache_dir, capsys):
    instances = _instances()
    op = instances[0].source.rsplit("/", 1)[-1].split(".")[0]
    expected = sum(1 for i in instances if i.source.rsplit("/", 1)[-1].split(".")[0] == op)
    assert cli.main(["precompile", "--arch", "9.0a", "--ops", op, "--compiler", "nvcc", "-j", "1"]) == 0
    assert f"compiled {expected} of {expected}" in capsys.readouterr().out
    assert cache.cached_counts(cache_dir) == {"sm_90a": expected}


@pytest.mark.parametrize("argv,message", [
    (["--arch", "9.0a", "--ops", "no_such_op"], "unknown op(s) no_such_op"),
    (["--arch", "hopper"], "arch must look like"),
    (["--arch", "9.0a", "-j", "0"], "--jobs must be >= 1"),
])
def test_precompile_bad_input(cache_dir, capsys, argv, message):
    _instances()
    assert cli.main(["precompile", *argv]) == 2
    assert message in capsys.readouterr().err


def test_precompile_without_instances_says_so(cache_dir, capsys, monkeypatch):
    fake = types.ModuleType("slim_kernel.backends.jit")  # a JIT backend without all_instances()
    monkeypatch.setitem(sys.modules, "slim_kernel.backends.jit", fake)
    import slim_kernel.backends as backends

    monkeypatch.setattr(backends, "jit", fake, raising=False)
    assert cli.main(["precompile", "--arch", "9.0a"]) == 2
    assert "has no all_instances() yet" in capsys.readouterr().err
