"""Sessions: build, test, audit, size, lint (CPU) and gpu, bench (on the GPU machine).

`nox -s build test` builds the wheel into dist/ and tests exactly that wheel in a fresh
environment. `nox -s test` alone rebuilds first when dist/ is missing or older than the
sources, so it never tests a stale wheel.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import nox

ROOT = Path(__file__).parent
DIST = ROOT / "dist"
STAMP = DIST / ".source-hash"
REPORTS = ROOT / "reports"
CPU_TORCH = "torch==2.13.0"  # the CPU build this workplace serves locally; never an unpinned torch
TEST_DEPS = ["pytest>=8", "hypothesis>=6", "pyelftools>=0.31", "zstandard>=0.22", "lz4>=4.3", "numpy",
             "tqdm", "cuda-bindings>=13", "nvidia-cuda-nvrtc==13.0.*", "nvidia-cuda-cuobjdump", "matplotlib",
             "scikit-build-core>=0.10", "nanobind>=2.4", "ninja"]

nox.options.default_venv_backend = "venv"
AUDIT_DEPS = ["pyelftools>=0.31", "zstandard>=0.22", "lz4>=4.3", "tqdm", "matplotlib"]

nox.options.sessions = ["build", "audit"]


def _source_hash() -> str:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "pyproject.toml", "CMakeLists.txt",
                            "csrc", "python"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    digest = hashlib.sha256()
    for name in sorted(files):
        path = ROOT / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _wheel() -> Path:
    wheels = sorted(DIST.glob("slim_kernel-*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"expected exactly one slim_kernel wheel in {DIST}, found {wheels}")
    return wheels[0]


def _build_wheel(session: nox.Session) -> Path:
    session.install("build")
    for old in DIST.glob("slim_kernel-*.whl"):
        old.unlink()
    session.run("python", "-m", "build", "--wheel", "--outdir", str(DIST), str(ROOT))
    STAMP.write_text(_source_hash())
    wheel = _wheel()
    session.log(f"built {wheel.name} ({wheel.stat().st_size / 1024:.1f} KiB)")
    return wheel


def _fresh_wheel(session: nox.Session) -> Path:
    if not STAMP.exists() or STAMP.read_text() != _source_hash() or not list(DIST.glob("slim_kernel-*.whl")):
        session.log("dist/ is missing or stale: rebuilding the wheel first")
        return _build_wheel(session)
    return _wheel()


@nox.session
def build(session: nox.Session) -> None:
    """Build the shipped wheel into dist/."""
    _build_wheel(session)


@nox.session
def test(session: nox.Session) -> None:
    """Install the built wheel (never the source tree) into a fresh env and run pytest."""
    wheel = _fresh_wheel(session)
    session.install(CPU_TORCH, *TEST_DEPS)
    # --no-deps: torch is pinned above; flashinfer (1 GB of CUDA deps) is optional on CPU.
    session.install("--no-deps", "--force-reinstall", str(wheel))
    session.run("slim-kernel", "info")
    tmp = session.create_tmp()
    session.run("python", "-m", "pytest", str(ROOT / "tests"), "-p", "no:cacheprovider", "--basetemp",
                os.path.join(tmp, "pytest"), *session.posargs, env={"SLIM_KERNEL_CACHE_DIR": os.path.join(tmp, "jit")})


@nox.session
def audit(session: nox.Session) -> None:
    """Audit the built wheel for retired AOT code (fails on any finding). Needs no torch."""
    wheel = _fresh_wheel(session)
    session.install(*AUDIT_DEPS)
    session.install("--no-deps", "--force-reinstall", str(wheel))
    REPORTS.mkdir(exist_ok=True)
    session.run("slim-kernel", "audit", str(wheel), *session.posargs)
    with open(REPORTS / "audit.json", "w") as f:
        session.run("slim-kernel", "audit", "--json", str(wheel), stdout=f)
    session.log(f"audit JSON: {REPORTS / 'audit.json'}")


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "python", "tests", "benchmark", "noxfile.py")
