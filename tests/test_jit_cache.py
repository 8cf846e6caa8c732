"""JIT cache (CPU): key contents, cross-process single compile, corrupt/wrong-arch entries are
rebuilt, read-only and full cache dirs degrade to an in-memory compile."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
from jit_fixtures import instances as fx

from slim_kernel.jit import cache, compiler
from slim_kernel.jit.spec import KernelInstance

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(root))
    monkeypatch.delenv(cache.ENV_TRACE, raising=False)
    cache.clear_memory()
    yield root
    cache.clear_memory()


@pytest.fixture
def kernel_tree(tmp_path):
    """A private copy of the fixture kernels, free to edit."""
    tree = tmp_path / "kernels"
    shutil.copytree(fx.HERE, tree, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    (tree / "unrelated.cuh").write_text("// not included by anything\n")
    return tree


def _axpby(tree: Path, bias: int = 0) -> KernelInstance:
    return KernelInstance.make(str(tree / "fixture_axpby.cuh"), "fixture_axpby", "ppplfi", BIAS=bias)


def _key(inst, arch="sm_90a", name="nvrtc"):
    return cache.cache_key(inst, arch, compiler.get_compiler(name))


def test_key_follows_included_header_not_unrelated_files(kernel_tree):
    inst = _axpby(kernel_tree)
    before = _key(inst)
    (kernel_tree / "unrelated.cuh").write_text("// changed\n")
    (kernel_tree / "fixture_smem_cluster.cuh").write_text("// a sibling kernel changed\n")
    assert _key(inst) == before
    header = kernel_tree / "fixture_common.cuh"
    header.write_text(header.read_text() + "\n// a comment is enough\n")
    after = _key(inst)
    assert after != before
    (kernel_tree / "fixture_axpby.cuh").write_text((kernel_tree / "fixture_axpby.cuh").read_text() + "\n")
    assert _key(inst) != after


def test_key_follows_nested_includes(kernel_tree):
    (kernel_tree / "deep.cuh").write_text("#pragma once\n#define DEEP 1\n")
    header = kernel_tree / "fixture_common.cuh"
    header.write_text(header.read_text() + '\n#include "deep.cuh"\n')
    inst = _axpby(kernel_tree)
    before = _key(inst)
    (kernel_tree / "deep.cuh").write_text("#pragma once\n#define DEEP 2\n")
    assert _key(inst) != before


def test_key_covers_defines_arch_compiler_and_version(kernel_tree, monkeypatch):
    inst = _axpby(kernel_tree)
    keys = {_key(inst), _key(_axpby(kernel_tree, bias=1)), _key(inst, arch="sm_100a"), _key(inst, name="nvcc")}
    assert len(keys) == 4
    monkeypatch.setattr(cache, "__version__", "999.0")
    assert _key(inst) not in keys


def test_entry_is_published_and_reused(cache_dir, kernel_tree):
    inst = _axpby(kernel_tree)
    first = cache.get_entry(inst, "9.0a")
    assert first.compiled and first.path is not None and first.path.is_file()
    assert first.path.parent == cache_dir / "cubin-v1" / "sm_90a"
    cache.clear_memory()
    second = cache.get_entry(inst, "sm_90a")
    assert not second.compiled and second.cubin == first.cubin
    assert cache.cached_counts() == {"sm_90a": 1}
    assert not any((first.path.parent / ".staging").iterdir()), "staging files left behind"


@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "garbage", "empty", "other_arch"])
def test_corrupt_entry_is_rebuilt_never_loaded(cache_dir, kernel_tree, damage, caplog):
    inst = _axpby(kernel_tree)
    good = cache.get_entry(inst, "sm_90a")
    path = good.path
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) - 100])
    elif damage == "flip_byte":
        path.write_bytes(data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:])
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a valid sm_100a entry copied over the sm_90a one
        path.write_bytes(cache.get_entry(inst, "sm_100a").path.read_bytes())
    cache.clear_memory()
    valid, why = cache.read_entry(path, good.header["key"], "sm_90a")
    assert valid is None and why
    rebuilt = cache.get_entry(inst, "sm_90a")
    assert rebuilt.compiled and rebuilt.cubin == good.cubin
    assert cache.read_entry(path, good.header["key"], "sm_90a")[0] is not None
    assert "invalid" in caplog.text and "rebuilding" in caplog.text


def test_wrong_sm_inside_a_consistent_header_is_rejected(cache_dir, kernel_tree):
    """A header that claims sm_90a around an sm_100 cubin (checksum consistent) is still refused."""
    inst = _axpby(kernel_tree)
    good = cache.get_entry(inst, "sm_90a")
    other = cache.get_entry(inst, "sm_100a").cubin
    import hashlib

    header = dict(good.header, cubin_size=len(other), cubin_sha256=hashlib.sha256(other).hexdigest())
    good.path.write_bytes(cache.pack_entry(header, other))
    entry, why = cache.read_entry(good.path, good.header["key"], "sm_90a")
    assert entry is None and "SM 100" in why


def _make_readonly(monkeypatch, root: Path):
    """Simulate a read-only filesystem under ``root`` (root ignores chmod, so patch the writes)."""
    real_mkdir, real_open = Path.mkdir, os.open

    def mkdir(self, *a, **k):
        if str(self).startswith(str(root)):
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *a, **k)

    def open_(path, flags, *a, **k):
        if str(path).startswith(str(root)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(cache.os, "open", open_)


def test_readonly_cache_dir_compiles_in_memory_with_one_warning(cache_dir, kernel_tree, monkeypatch):
    _make_readonly(monkeypatch, cache_dir)
    with pytest.warns(RuntimeWarning, match="not writable.*compiling in memory") as record:
        a = cache.get_entry(_axpby(kernel_tree), "sm_90a")
        b = cache.get_entry(_axpby(kernel_tree, bias=3), "sm_90a")
    assert len([w for w in record if "not writable" in str(w.message)]) == 1
    assert a.compiled and a.path is None and b.path is None and a.cubin[:4] == b"\x7fELF"
    assert not cache_dir.exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_readonly_cache_dir_by_permissions(cache_dir, kernel_tree):
    cache_dir.mkdir(parents=True)
    cache_dir.chmod(0o555)
    try:
        with pytest.warns(RuntimeWarning, match="not writable"):
            entry = cache.get_entry(_axpby(kernel_tree), "sm_90a")
        assert entry.path is None
    finally:
        cache_dir.chmod(0o755)


def test_warm_readonly_cache_loads_without_warning_or_compile(cache_dir, kernel_tree, monkeypatch):
    inst = _axpby(kernel_tree)
    cache.get_entry(inst, "sm_90a")
    cache.clear_memory()
    _make_readonly(monkeypatch, cache_dir)
    monkeypatch.setattr(cache, "_compile", lambda *a: pytest.fail("compiled although the entry was cached"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        entry = cache.get_entry(inst, "sm_90a")
    assert not entry.compiled and entry.path is not None


def test_full_disk_keeps_the_compiled_kernel_and_leaves_no_partial_file(cache_dir, kernel_tree, monkeypatch):
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[:10])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    with pytest.warns(RuntimeWarning, match="cannot write the JIT cache entry"):
        entry = cache.get_entry(_axpby(kernel_tree), "sm_90a")
    assert entry.compiled and entry.path is None and entry.cubin[:4] == b"\x7fELF"
    arch_dir = cache_dir / "cubin-v1" / "sm_90a"
    assert not list(arch_dir.glob("*.slimcubin")) and not list((arch_dir / ".staging").iterdir())


_WORKER = textwrap.dedent("""
    import json, sys, time
    from slim_kernel.jit.cache import get_entry
    from slim_kernel.jit.spec import KernelInstance
    start = float(sys.argv[2])
    while time.time() < start:   # line the processes up on one instant
        time.sleep(0.001)
    entry = get_entry(KernelInstance.make(sys.argv[1], "fixture_axpby", "ppplfi", BIAS=5), "sm_90a")
    print(json.dumps({"compiled": entry.compiled, "size": len(entry.cubin)}))
""")


@pytest.mark.parametrize("compiler_name", ["nvrtc", "nvcc"])
def test_eight_processes_on_a_cold_cache_compile_once(tmp_path, kernel_tree, compiler_name):
    import time

    trace = tmp_path / "trace.jsonl"
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), SLIM_KERNEL_CACHE_DIR=str(tmp_path / "cache"),
               SLIM_KERNEL_JIT_TRACE=str(trace), SLIM_KERNEL_JIT_COMPILER=compiler_name)
    start = time.time() + 3.0
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(kernel_tree / "fixture_axpby.cuh"), str(start)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    compiles = [e for e in events if e["event"] == "compile"]
    assert len(compiles) == 1, events
    assert sum(r["compiled"] for r in results) == 1
    assert len({r["size"] for r in results}) == 1
