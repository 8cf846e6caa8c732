"""JIT cache (CPU): key contents, cross-process single compile, corrupt/wrong-arch entries are
rebuilt, read-only and full cache dirs degrade to an in-memory compile."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import pytest
from jit_fixtures import instances as fx

from slim_kernel.jit import cache, compiler
from slim_kernel.jit.spec import KernelInstance

REPO = Path(__file__).resolve().parents[1]


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


@pytest.mark.needs_compiler("nvrtc", "nvcc")
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
    real_mkdir, real_open = os.mkdir, os.open

    def mkdir(path, *a, **k):
        if str(path).startswith(str(root)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *a, **k)

    def open_(path, flags, *a, **k):
        if str(path).startswith(str(root)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)


def test_readonly_cache_dir_compiles_in_memory_with_one_warning(cache_dir, kernel_tree, monkeypatch):
    _make_readonly(monkeypatch, cache_dir)
    with pytest.warns(RuntimeWarning, match=r"cannot store .*Read-only file system \(EROFS\).*compiled in memory") \
            as record:
        a = cache.get_entry(_axpby(kernel_tree), "sm_90a")
        b = cache.get_entry(_axpby(kernel_tree, bias=3), "sm_90a")
    assert len([w for w in record if "cannot store" in str(w.message)]) == 1
    assert a.compiled and a.path is None and b.path is None and a.cubin[:4] == b"\x7fELF"
    assert "EROFS" in a.store_error
    assert not cache_dir.exists()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_readonly_cache_dir_by_permissions(cache_dir, kernel_tree):
    cache_dir.mkdir(parents=True)
    cache_dir.chmod(0o555)
    try:
        with pytest.warns(RuntimeWarning, match=r"Permission denied \(EACCES\) for uid"):
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
    with pytest.warns(RuntimeWarning, match=r"cannot store .*No space left on device \(ENOSPC\)"):
        entry = cache.get_entry(_axpby(kernel_tree), "sm_90a")
    assert entry.compiled and entry.path is None and entry.cubin[:4] == b"\x7fELF"
    arch_dir = cache_dir / "cubin-v1" / "sm_90a"
    assert not list(arch_dir.glob("*.slimcubin")) and not list((arch_dir / ".staging").iterdir())


def test_modes_share_the_inside_and_respect_the_umask_of_the_root(tmp_path, monkeypatch, kernel_tree):
    root = tmp_path / "asked" / "cache"
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(root))
    cache.clear_memory()
    old = os.umask(0o077)
    try:
        entry = cache.get_entry(_axpby(kernel_tree), "sm_90a")
    finally:
        os.umask(old)
        cache.clear_memory()
    mode = lambda p: p.stat().st_mode & 0o777  # noqa: E731
    assert mode(root) == mode(root.parent) == 0o700  # the user's dirs: their umask
    arch_dir = entry.path.parent
    assert [mode(d) for d in (root / "cubin-v1", arch_dir, arch_dir / ".staging", arch_dir / ".locks")] == [0o755] * 4
    assert mode(entry.path) == 0o644


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


def _entry_path(inst, arch="sm_90a", name="nvrtc") -> Path:
    return cache.entry_path(inst, arch, _key(inst, arch, name))


_HOSTILE = {
    "symlink to /dev/zero": lambda p: os.symlink("/dev/zero", p),
    "FIFO": os.mkfifo,
    "1 TiB sparse file": lambda p: open(p, "wb").truncate(1 << 40),
    "header of 200,000 [": lambda p: p.write_bytes(cache._HEAD.pack(cache.MAGIC, 200_000) + b"[" * 200_000),
    "header of 20,000 [": lambda p: p.write_bytes(cache._HEAD.pack(cache.MAGIC, 20_000) + b"[" * 20_000),
    "directory": os.mkdir,
}
_READER = textwrap.dedent("""
    import json, resource, sys, warnings
    from jit_fixtures import instances as fx
    from slim_kernel.jit import cache, compiler
    cache.get_entry(fx.axpby(99), "sm_90a", "nvrtc")  # NVRTC loaded and warm before memory is capped
    peak = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmPeak")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (peak + (512 << 20),) * 2)
    out = {}
    for bias in map(int, sys.argv[1:]):
        inst = fx.axpby(bias)
        key = cache.cache_key(inst, "sm_90a", compiler.get_compiler("nvrtc"))
        why = cache.read_entry(cache.entry_path(inst, "sm_90a", key), key, "sm_90a")[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            entry = cache.get_entry(inst, "sm_90a", "nvrtc")
        out[bias] = {"why": why, "compiled": entry.compiled, "store_error": entry.store_error}
    print(json.dumps(out))
""")


def test_hostile_entries_are_refused_without_hanging_or_growing_and_rebuilt(cache_dir):
    """Symlink to /dev/zero, FIFO, huge file, deep JSON headers: each refused with its reason in a
    child capped at +512 MiB of address space and 120 s, then rebuilt in place (a directory in the
    way cannot be replaced: compiled in memory, the reason kept)."""
    kinds = list(_HOSTILE)
    arch_dir = cache.prepare_dir("sm_90a")
    for bias, kind in enumerate(kinds, start=1):
        path = _entry_path(fx.axpby(bias))
        assert path.parent == arch_dir
        _HOSTILE[kind](path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), str(REPO / "tests")]))
    proc = subprocess.run([sys.executable, "-c", _READER, *map(str, range(1, len(kinds) + 1))], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = {kinds[int(b) - 1]: r for b, r in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    assert out["symlink to /dev/zero"]["why"] == "not a regular file (a symlink)"
    assert out["FIFO"]["why"] == "not a regular file (a FIFO)"
    assert out["directory"]["why"] == "not a regular file (a directory)"
    assert out["1 TiB sparse file"]["why"] == f"{1 << 40} bytes, more than an entry can be ({cache.MAX_ENTRY_BYTES})"
    assert out["header of 200,000 ["]["why"] == "header length 200000 out of bounds"
    assert out["header of 20,000 ["]["why"] == f"header has more than {cache.MAX_HEADER_BRACKETS} brackets"
    assert all(r["compiled"] for r in out.values())
    assert "Is a directory (EISDIR)" in out["directory"]["store_error"]
    for bias, kind in enumerate(kinds, start=1):
        if kind != "directory":
            assert out[kind]["store_error"] is None
            path = _entry_path(fx.axpby(bias))
            assert path.is_file() and not path.is_symlink()
            assert cache.verify_on_disk(fx.axpby(bias), "sm_90a", "nvrtc") is None, kind


def _age(path: Path, seconds: float = cache.STALE_AFTER_S + 60) -> Path:
    old = time.time() - seconds
    os.utime(path, (old, old), follow_symlinks=False)
    return path


def test_publish_sweeps_stale_staging_files_and_nvcc_dirs(cache_dir, kernel_tree, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    staging = cache.prepare_dir("sm_90a") / ".staging"
    nvcc_parent = compiler.nvcc_temp_parent(create=True)
    assert nvcc_parent == tmp_path / "tmp" / f"slim_kernel_nvcc-{os.getuid()}"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("not ours")
    stale = [staging / "killed.slimcubin.abc.tmp", nvcc_parent / "slim_nvcc_killed"]
    stale[0].write_bytes(b"partial")
    stale[1].mkdir()
    (stale[1] / "kernel.cubin").write_bytes(b"partial")
    for p in stale:
        _age(p)
    link = staging / "old-link"
    link.symlink_to(outside)
    _age(link)
    fresh = [staging / "live.tmp", nvcc_parent / "slim_nvcc_live"]
    fresh[0].write_bytes(b"being written")
    fresh[1].mkdir()
    cache.get_entry(_axpby(kernel_tree), "sm_90a")  # one publish
    assert not any(os.path.lexists(p) for p in [*stale, link])
    assert all(p.exists() for p in fresh) and (outside / "keep").exists()


def test_nvcc_work_dirs_live_under_the_swept_parent(cache_dir, kernel_tree, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen, real_run = [], subprocess.run

    def run(cmd, **kw):
        seen.append(Path(cmd[cmd.index("-o") + 1]).parent)
        return real_run(cmd, **kw)

    monkeypatch.setattr(compiler.subprocess, "run", run)
    cache.get_entry(_axpby(kernel_tree), "sm_90a", "nvcc")
    parent = tmp_path / f"slim_kernel_nvcc-{os.getuid()}"
    assert seen and seen[-1].parent == parent and list(parent.iterdir()) == []


def test_a_squatted_nvcc_parent_is_not_used(cache_dir, kernel_tree, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    parent = tmp_path / f"slim_kernel_nvcc-{os.getuid()}"
    parent.write_text("someone else's file")
    assert compiler.nvcc_temp_parent(create=True) is None
    assert cache.get_entry(_axpby(kernel_tree), "sm_90a", "nvcc").cubin[:4] == b"\x7fELF"
    if os.geteuid() == 0:  # a directory owned by another user
        parent.unlink()
        parent.mkdir()
        os.chown(parent, 65534, 65534)
        assert compiler.nvcc_temp_parent(create=True) is None


def _as_other_user(fn, uid: int = 65534, timeout_s: int = 120):
    """``fn()`` in a forked child running as ``uid`` (no exec: the interpreter may sit in a directory
    that uid cannot enter); its JSON-able result, or the exception it raised as a string."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(r)
            signal.alarm(timeout_s)  # a hang ends the child, and the test with it
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result, code = {"result": fn()}, 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            result = {"error": repr(exc)}
        finally:
            os.write(w, json.dumps(result).encode())
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    out = json.loads(data or b'{"error": "the child died without a word"}')
    assert "error" not in out, out["error"]
    return out["result"]


def _read_as_other_user() -> dict:
    assert os.getuid() == 65534
    out = {}
    for name, bias in (("hit", 1), ("unreadable", 2), ("miss", 3)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            entry = cache.get_entry(fx.axpby(bias), "sm_90a", "nvrtc")
        out[name] = {"compiled": entry.compiled, "stored": entry.path is not None,
                     "warnings": [str(w.message) for w in caught]}
    return out


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to run a child as uid 65534")
def test_cache_built_by_one_uid_serves_another(monkeypatch):
    """Root builds the cache (as at image build), uid 65534 reads it: hits served silently, no
    compile; an unreadable entry (0600, as old builds wrote them) is refused and rebuilt in memory
    with one warning naming what is wrong: EACCES for uid 65534, the entry unreadable."""
    sources = Path(fx.__file__).resolve().parent
    shared = Path(tempfile.mkdtemp(prefix="slim_kernel_shared_"))
    blocked = [d for top in (sources, shared.parent) for d in (top, *top.parents) if not d.stat().st_mode & 0o001]
    if blocked:  # e.g. the fresh-venv test runs this suite from a copy under pytest's 0700 temp dirs
        shutil.rmtree(shared)
        pytest.skip(f"uid 65534 cannot enter {blocked[0]} (the kernel sources or the temp dir)")
    try:
        shared.chmod(0o755)
        monkeypatch.setenv(cache.ENV_CACHE_DIR, str(shared / "cache"))
        cache.clear_memory()
        old = os.umask(0o022)
        try:
            cache.get_entry(fx.axpby(1), "sm_90a", "nvrtc")
            cache.get_entry(fx.axpby(2), "sm_90a", "nvrtc").path.chmod(0o600)
        finally:
            os.umask(old)
            cache.clear_memory()  # the child must find the entries on disk, not in inherited memory
        out = _as_other_user(_read_as_other_user)
        assert out["hit"] == {"compiled": False, "stored": True, "warnings": []}
        for name in ("unreadable", "miss"):
            assert out[name]["compiled"] and not out[name]["stored"]
        (warning,) = out["unreadable"]["warnings"]
        assert "Permission denied (EACCES) for uid 65534" in warning and "refused: unreadable" in warning
        assert out["miss"]["warnings"] == []  # one warning per cache dir and process
    finally:
        shutil.rmtree(shared)
