"""Packaging as a user meets it: `--version`; LICENSE, py.typed and metadata in the wheel and the
sdist; dependencies declared once in pyproject.toml, with lower bounds only; and (slow) a fresh
virtual environment where `pip install .` audits LZ4 and zstd fatbins and `pip install ".[test]" &&
pytest -q -m "not slow"` passes (the quick run: the slow tests build wheels and compile every kernel
instance, which the run around this one does already)."""

from __future__ import annotations

import email.parser
import os
import re
import runpy
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the test extra brings tomli
    import tomli as tomllib

import pytest
from _wheels import REPO, log_tail, one_wheel, pip_wheel
from audit_fixtures import fatbin_entry, fatbin_header, make_wheel, tiny_elf
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from slim_kernel import __version__
from slim_kernel.cli import main

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Set for the pytest run inside the fresh venv, so that it does not start another one.
INNER = "SLIM_KERNEL_FRESH_VENV_RUN"


def _names(reqs: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in reqs}


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"slim-kernel {__version__}\n"
    proc = subprocess.run([sys.executable, "-m", "slim_kernel", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"slim-kernel {__version__}", proc


# ---- the wheel and the sdist --------------------------------------------------------------------

@pytest.fixture(scope="module")
def pure_wheel(tmp_path_factory) -> Path:
    """The pure wheel (SLIM_KERNEL_NATIVE=OFF: seconds to build); metadata and data files are the same
    in every build flavour."""
    tmp = tmp_path_factory.mktemp("pure")
    proc = pip_wheel(tmp / "wheel", tmp / "build", dict(os.environ, SLIM_KERNEL_NATIVE="OFF"))
    assert proc.returncode == 0, log_tail(proc)
    return one_wheel(tmp / "wheel")


def _metadata(text: str):
    return email.parser.Parser().parsestr(text)


def test_wheel_carries_license_and_py_typed(pure_wheel):
    with zipfile.ZipFile(pure_wheel) as zf:
        names = zf.namelist()
        assert "slim_kernel/py.typed" in names
        (license_name,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        text = zf.read(license_name)
    assert text == (REPO / "LICENSE").read_bytes()
    assert b"Apache License" in text and b"Version 2.0, January 2004" in text
    assert text.startswith(b"Copyright 2026 slim-kernel authors\n")


def test_wheel_metadata(pure_wheel):
    assert pure_wheel.name == f"slim_kernel-{__version__}-py3-none-any.whl", "the CLI version is the wheel's"
    with zipfile.ZipFile(pure_wheel) as zf:
        meta = _metadata(zf.read(f"slim_kernel-{__version__}.dist-info/METADATA").decode())
    assert meta["License-Expression"] == "Apache-2.0" and meta["License-File"] == "LICENSE"
    assert meta["Author"] == "slim-kernel authors"
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and "Environment :: GPU :: NVIDIA CUDA" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")], "PEP 639: the expression, no classifier"
    assert meta.get_all("Project-URL")
    requires = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    core = {canonicalize_name(r.name) for r in requires if r.marker is None}
    # a plain install reads real (LZ4 / zstd compressed) wheels, and pulls no flashinfer
    assert {"torch", "zstandard", "lz4", "cuda-bindings"} <= core and "flashinfer-python" not in core
    (fi,) = [r for r in requires if r.name == "flashinfer-python"]
    assert fi.marker.evaluate({"extra": "flashinfer"}) and not fi.marker.evaluate({"extra": "test"})
    # a lower bound only: installs beside whatever flashinfer an engine pins (info names unmeasured ones)
    assert [v for v in ("0.7.1", "0.7.2", "0.7.2.post1", "0.7.4", "0.7.5", "1.0") if fi.specifier.contains(v)] == [
        "0.7.2", "0.7.2.post1", "0.7.4", "0.7.5", "1.0"]


def test_no_dependency_is_capped():
    """Library dependencies and extras get lower bounds, never caps or pins that would replace what a user
    installed (a CUDA torch brings its own NVRTC; the test extra must not swap it)."""
    for text in PYPROJECT["project"]["dependencies"] + [
            r for extra in PYPROJECT["project"]["optional-dependencies"].values() for r in extra]:
        req = Requirement(text)
        assert all(spec.operator in (">=", ">") for spec in req.specifier), f"{text}: only lower bounds"


def test_sdist_carries_license_and_py_typed(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "import sys; from scikit_build_core.build import build_sdist; "
                           "print(build_sdist(sys.argv[1]))", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, log_tail(proc)
    sdist = tmp_path / proc.stdout.strip().splitlines()[-1]
    top = f"slim_kernel-{__version__}"
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        assert f"{top}/LICENSE" in names and f"{top}/python/slim_kernel/py.typed" in names
        assert tf.extractfile(f"{top}/LICENSE").read() == (REPO / "LICENSE").read_bytes()
        meta = _metadata(tf.extractfile(f"{top}/PKG-INFO").read().decode())
    assert meta["License-Expression"] == "Apache-2.0"
    assert not [n for n in names if n.startswith((f"{top}/build/", f"{top}/dist/", f"{top}/reports/"))]


def test_dependencies_have_one_source():
    """The test extra carries what the wheel-build tests build with (they use --no-build-isolation),
    the build backend never needs torch, and noxfile.py keeps no dependency list of its own."""
    build = PYPROJECT["build-system"]["requires"]
    assert "torch" not in _names(build)
    assert _names(build) <= _names(PYPROJECT["project"]["optional-dependencies"]["test"])
    noxfile = (REPO / "noxfile.py").read_text()
    assert "sys.path.insert" not in noxfile and not re.search(r"^\s*(from|import) slim_kernel", noxfile, re.M)
    for req in PYPROJECT["project"]["optional-dependencies"]["test"] + PYPROJECT["project"]["dependencies"]:
        assert f'"{req}"' not in noxfile, f"noxfile.py repeats {req!r}: read it from pyproject.toml"


# ---- a fresh virtual environment, as a new user has it --------------------------------------------

def _compressed_fatbin_wheel(path: Path) -> Path:
    """A wheel whose only traces of two retired ops are kernel names inside an LZ4 and a zstd
    compressed fatbin entry: the audit finds them only when it can decompress both."""
    import lz4.block
    import zstandard

    entries = b""
    for op, flag, pack in (("dsv3_router_gemm", 0x2000, lambda b: lz4.block.compress(b, store_size=False)),
                           ("dsv3_fused_a_gemm", 0x8000, zstandard.ZstdCompressor().compress)):
        cubin = tiny_elf([f"{op}_kernel"])
        packed = pack(cubin)
        entries += fatbin_entry(2, packed + b"\0" * (-len(packed) % 8), flags=0x100011 | flag, csize=len(packed),
                                usize=len(cubin))
    return make_wheel(path, {"pkg/kernels.fatbin": fatbin_header(len(entries)) + entries})


def _clone(dest: Path) -> None:
    """The files a fresh clone has: tracked and untracked-but-not-ignored ones, no build outputs."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                         check=True).stdout
    for name in filter(None, out.decode().split("\0")):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _fresh_env(venv: Path, tmp: Path) -> dict:
    outer_bin = os.path.dirname(sys.executable)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLIM_KERNEL_") and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != outer_bin]
    env.update(PATH=os.pathsep.join([str(venv / "bin"), *path]), VIRTUAL_ENV=str(venv),
               SLIM_KERNEL_CACHE_DIR=str(tmp / "jit-cache"), **{INNER: "1"})
    return env


def _run(cmd: list, cwd: Path, env: dict, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


MISSING_DEPENDENCY = re.compile(r"No module named|could not import|isal not installed")


# What the fresh venv runs: a test file per dependency of the test extra (torch, NVRTC and cuda-bindings,
# cuobjdump/nvdisasm, the audit's decompressors and extras, matplotlib), not the whole quick suite again:
# the session around this test runs that on the same code.
FRESH_VENV_TESTS = ("tests/test_ops_cpu.py", "tests/test_empty_batch.py", "tests/test_info.py", "tests/test_audit_cli.py",
                    "tests/test_size.py", "tests/test_jit_compile.py", "tests/test_jit_launcher.py",
                    "tests/test_sass_stats.py")


@pytest.mark.slow
def test_fresh_venv_plain_install_audits_then_test_extra_passes_pytest(tmp_path):
    """`pip install .` then `pip install ".[test]" && pytest -q -m "not slow"` (FRESH_VENV_TESTS) in a new venv
    on a copy of the tree, as the README tells a new user (torch pinned first, see [tool.slim-kernel] test-torch)."""
    if os.environ.get(INNER):
        pytest.skip("this is the pytest run inside the fresh venv")
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout to copy the tree from")
    clone, venv = tmp_path / "clone", tmp_path / "venv"
    _clone(clone)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env, py = _fresh_env(venv, tmp_path), venv / "bin" / "python"
    pip = [py, "-m", "pip", "install", "-q"]

    torch_args, how, _ = runpy.run_path(str(REPO / "tools" / "cpu_torch.py"))["pip_args"](
        PYPROJECT["tool"]["slim-kernel"]["test-torch"])  # a CPU build where PyTorch's CPU index answers
    print(f"fresh venv: torch {how}")
    proc = _run([*pip, *torch_args], clone, env, 900)
    assert proc.returncode == 0, log_tail(proc)
    proc = _run([*pip, "."], clone, env, 1200)  # the plain install
    assert proc.returncode == 0, log_tail(proc)
    listed = _run([py, "-m", "pip", "list", "--format=freeze"], clone, env, 120).stdout
    installed = {canonicalize_name(line.split("==")[0]) for line in listed.splitlines() if "==" in line}
    assert {"slim-kernel", "zstandard", "lz4"} <= installed and "flashinfer-python" not in installed, listed
    assert "torch==2.13.0" in listed, "the pinned CPU torch was replaced"
    audit = _run([venv / "bin" / "slim-kernel", "audit", "--no-progress",
                  _compressed_fatbin_wheel(tmp_path / "fatbins" / "demo-0.1-py3-none-any.whl")], clone, env, 300)
    assert audit.returncode == 1, log_tail(audit)  # 2 would be "cannot read" (a missing decompressor)
    assert "dsv3_router_gemm" in audit.stdout and "dsv3_fused_a_gemm" in audit.stdout, log_tail(audit)

    proc = _run([*pip, ".[test]"], clone, env, 1200)
    assert proc.returncode == 0, log_tail(proc)
    tests = _run([venv / "bin" / "pytest", "-q", "-m", "not slow", *FRESH_VENV_TESTS, "--basetemp", tmp_path / "inner"],
                 clone, env, 3600)
    (tmp_path / "inner-pytest.log").write_text(tests.stdout + tests.stderr)  # kept with the basetemp
    summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else ""
    print(f"fresh venv: {summary}")
    assert tests.returncode == 0, log_tail(tests, 8000)
    assert re.search(r"\d+ passed", summary) and not re.search(r"failed|error", summary), summary
    missing = [line for line in tests.stdout.splitlines()
               if line.startswith("SKIPPED") and MISSING_DEPENDENCY.search(line)]
    assert not missing, f"the test extra lacks what these tests need: {missing}"
