"""Sessions: build, test, audit, size, lint (CPU) and gpu, bench (on the GPU machine).

`nox -s build test` builds the wheel into dist/ and tests exactly that wheel in a fresh
environment. `nox -s test` alone rebuilds first when dist/ is missing or older than the
sources, so it never tests a stale wheel.

Every dependency comes from pyproject.toml (its dependencies, extras and dependency groups) and the
op names from python/slim_kernel/names.py: this file keeps no list of its own and never imports
the package source.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import subprocess
import time
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

nox.needs_version = ">=2025.2.9"  # nox.project.load_toml / dependency_groups
nox.options.default_venv_backend = "venv"
nox.options.sessions = ["build", "audit", "size"]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")
# names.py is import-free: run on its own, it gives the op list without the package on sys.path.
RETIRED_OPS = tuple(runpy.run_path(str(ROOT / "python" / "slim_kernel" / "names.py"))["OPS"])
DIST = ROOT / "dist"
STAMP = DIST / ".source-hash"
REPORTS = ROOT / "reports"
BASELINE_DIST = DIST / "aot-baseline"  # the AOT size baseline (SLIM_KERNEL_AOT_BASELINE=ON), never shipped
BASELINE_STAMP = BASELINE_DIST / ".source-hash"
CPU_TORCH = PYPROJECT["tool"]["slim-kernel"]["test-torch"]  # a pinned CPU build: never an unpinned torch
# What audit/size install besides the wheel (installed --no-deps): its dependencies and the audit
# extra, less torch and the CUDA bindings, which the audit never imports.
AUDIT_SKIPS = ("torch", "cuda-bindings")


def _requirements(*extras: str, skip: tuple[str, ...] = ()) -> list[str]:
    """The project's dependencies plus the given extras, self-references (slim-kernel[x]) expanded,
    less the distributions named in `skip`."""
    project = PYPROJECT["project"]
    me, skipped = canonicalize_name(project["name"]), {canonicalize_name(n) for n in skip}
    out: list[str] = []

    def add(reqs: list[str]) -> None:
        for text in reqs:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if name == me:
                for extra in sorted(req.extras):
                    add(project["optional-dependencies"][extra])
            elif name not in skipped and text not in out:
                out.append(text)

    add(project["dependencies"])
    for extra in extras:
        add(project["optional-dependencies"][extra])
    return out


def _source_hash() -> str:
    # everything the wheel is built from, README (METADATA) and LICENSE (dist-info) included
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "pyproject.toml", "README.md", "LICENSE",
                            "CMakeLists.txt", "cmake", "csrc", "python"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
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
    session.install(CPU_TORCH)  # first, so that the wheel's torch>=2.4 never resolves to a CUDA build
    session.install(f"{wheel}[test]")  # what `pip install ".[test]"` installs (flashinfer is an extra)
    session.install("--no-deps", "--force-reinstall", str(wheel))  # exactly this wheel in a reused env
    session.run("slim-kernel", "info")
    session.run("slim-kernel", "audit", "--no-progress", str(wheel))  # the wheel under test holds no AOT code
    tmp = session.create_tmp()
    session.run("python", "-m", "pytest", str(ROOT / "tests"), "-p", "no:cacheprovider", "--basetemp",
                os.path.join(tmp, "pytest"), *session.posargs, env={"SLIM_KERNEL_CACHE_DIR": os.path.join(tmp, "jit")})


@nox.session
def audit(session: nox.Session) -> None:
    """Audit the built wheel for retired AOT code (fails on any finding). Needs no torch."""
    wheel = _fresh_wheel(session)
    session.install(*_requirements("audit", skip=AUDIT_SKIPS))
    session.install("--no-deps", "--force-reinstall", str(wheel))
    REPORTS.mkdir(exist_ok=True)
    session.run("slim-kernel", "audit", "--no-progress", str(wheel), *session.posargs)  # per layer: scanned/found
    out = session.run("slim-kernel", "audit", "--json", "--no-progress", str(wheel), silent=True)
    (REPORTS / "audit.json").write_text(out)
    session.log(f"audit JSON: {REPORTS / 'audit.json'}")


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """On a GPU machine: `nox -s gpu -- BUNDLE` installs the flashinfer bundle and the project, runs `pytest -m gpu`."""
    _gpu_run(session, "tests")


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """On a GPU machine: `nox -s bench -- BUNDLE`: decode-step GEMM (routing table regenerated), eager, ncu."""
    _gpu_run(session, "bench", "eager", "ncu")


def _gpu_run(session: nox.Session, *stages: str) -> None:
    # BUNDLE: a flashinfer wheel folder from ../shared/device/make-bundle.py, or "none"
    bundle, *extra = session.posargs or [os.environ.get("SLIM_KERNEL_BUNDLE", "none")]
    session.run("bash", str(ROOT / "benchmark" / "gpu_run.sh"), bundle, *(extra or stages), external=True)


@nox.session
def lint(session: nox.Session) -> None:
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", "python", "tests", "benchmark", "noxfile.py")


# ---- size: shipped wheel vs the AOT baseline ------------------------------------------------

def _wheel_budget() -> str:
    """[tool.slim-kernel] wheel-budget from pyproject.toml."""
    budget = PYPROJECT["tool"]["slim-kernel"].get("wheel-budget")
    if not budget:
        raise RuntimeError("pyproject.toml has no [tool.slim-kernel] wheel-budget")
    return str(budget)


def _find_nvcc(session: nox.Session) -> str | None:
    """The JIT compiler's own nvcc lookup (CUDACXX, CUDA_HOME, PATH, /usr/local/cuda), run in the
    session's environment, where the wheel is installed (the module is stdlib-only)."""
    out = session.run("python", "-c", "from slim_kernel.jit.compiler import find_nvcc; print(find_nvcc() or '')",
                      silent=True)
    return (out or "").strip() or None


def _baseline_wheel(session: nox.Session) -> Path | None:
    """Build (when stale) the AOT baseline wheel into dist-baseline/; None when nvcc is missing."""
    nvcc = _find_nvcc(session)
    if nvcc is None:
        session.warn("nvcc not found (PATH, CUDACXX, CUDA_HOME, /usr/local/cuda): the AOT baseline cannot be built; "
                     "reporting the shipped wheel only")
        return None
    archs = os.environ.get("SLIM_KERNEL_AOT_ARCHS", "")  # empty: the release list in csrc/aot_baseline
    # The instance list comes from slim_kernel.backends.jit, which imports torch; the build runs
    # without isolation, so the build backend goes in here (CMake drives ninja or make from the system).
    session.install(CPU_TORCH, *PYPROJECT["build-system"]["requires"])
    BASELINE_DIST.mkdir(parents=True, exist_ok=True)
    manifest = BASELINE_DIST / "manifest.json"
    session.run("python", str(ROOT / "csrc" / "aot_baseline" / "manifest.py"), "-o", str(manifest))
    stamp = hashlib.sha256(f"{_source_hash()} {archs} {nvcc}".encode() + manifest.read_bytes()).hexdigest()
    wheels = sorted(BASELINE_DIST.glob("slim_kernel-*.whl"))
    if len(wheels) == 1 and BASELINE_STAMP.exists() and BASELINE_STAMP.read_text() == stamp:
        session.log(f"AOT baseline is up to date: {wheels[0].name}")
        return wheels[0]
    for old in wheels:
        old.unlink()
    env = {"SLIM_KERNEL_AOT_BASELINE": "ON", "SLIM_KERNEL_AOT_MANIFEST": str(manifest),
           "CUDACXX": nvcc, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    if archs:
        env["SLIM_KERNEL_AOT_ARCHS"] = archs
    start = time.perf_counter()
    session.run("python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(BASELINE_DIST),
                str(ROOT), env=env)
    (wheel,) = BASELINE_DIST.glob("slim_kernel-*.whl")
    if "+aot" not in wheel.name:
        raise RuntimeError(f"{wheel.name} does not carry the +aot local version: the baseline override is broken")
    BASELINE_STAMP.write_text(stamp)
    session.log(f"built the AOT baseline {wheel.name} ({wheel.stat().st_size / 1024:.1f} KiB, archs "
                f"{archs or 'release list'}) in {time.perf_counter() - start:.0f} s")
    return wheel


def _audit_json(session: nox.Session, wheel: Path, out: Path) -> dict:
    """`slim-kernel audit --json` of one wheel (its entry of ``{"schema": 1, "wheels": [...]}``);
    exit 2 (unreadable) or 3 (a missing decompressor) fails the session."""
    with open(out, "w") as f:
        session.run("slim-kernel", "audit", "--json", str(wheel), stdout=f, success_codes=[0, 1])
    doc = json.loads(out.read_text())
    if doc.get("schema") != 1:
        session.error(f"{out}: audit JSON schema {doc.get('schema')!r}, expected 1")
    return doc["wheels"][0]


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f} KiB"


@nox.session
def size(session: nox.Session) -> None:
    """Shipped wheel vs the AOT baseline: audit both (baseline = negative control), size report, budget."""
    wheel = _fresh_wheel(session)
    session.install(*_requirements("audit", skip=AUDIT_SKIPS))
    session.install("--no-deps", "--force-reinstall", str(wheel))
    baseline = _baseline_wheel(session)
    REPORTS.mkdir(exist_ok=True)

    shipped = _audit_json(session, wheel, REPORTS / "audit-shipped.json")
    if not shipped["clean"]:
        session.error(f"the shipped wheel {wheel.name} contains retired AOT code: {shipped['ops_found']} "
                      f"(see {REPORTS / 'audit-shipped.json'})")
    session.log(f"audit: shipped wheel {wheel.name} is clean")
    if baseline is not None:
        base = _audit_json(session, baseline, REPORTS / "audit-baseline.json")
        missed = sorted(set(RETIRED_OPS) - set(base["ops_found"]))
        if base["clean"] or missed:
            session.error(f"negative control failed: the audit did not flag {missed or list(RETIRED_OPS)} in the AOT "
                          f"baseline {baseline.name} (see {REPORTS / 'audit-baseline.json'})")
        layers = sorted({f["layer"] for f in base["findings"]})
        session.log(f"audit: AOT baseline {baseline.name} flagged for {', '.join(base['ops_found'])} "
                    f"(layers: {', '.join(layers)}), as it must be")
    else:
        (REPORTS / "audit-baseline.json").unlink(missing_ok=True)  # never leave a stale one next to the report

    budget = _wheel_budget()
    args = ["slim-kernel", "size", str(wheel), *(["--baseline", str(baseline)] if baseline else []), "--budget", budget,
            "--markdown", str(REPORTS / "size.md"), "--png", str(REPORTS / "size.png"), "--json"]
    with open(REPORTS / "size.json", "w") as f:
        session.run(*args, stdout=f)  # exit 1 (over budget) fails the session, with the reason on stderr
    report = json.loads((REPORTS / "size.json").read_text())
    subject = report["subject"]
    session.log(f"shipped: {wheel.name} {_kib(subject['file_bytes'])} (budget {budget}), "
                f"{_kib(subject['unpacked'])} unpacked")
    if baseline is not None:
        cmp, base = report["comparison"], report["baseline"]
        session.log(f"AOT baseline: {baseline.name} {_kib(base['file_bytes'])}, {_kib(base['unpacked'])} unpacked")
        session.log(f"reduction: wheel file {_kib(cmp['file_bytes']['bytes'])} ({cmp['file_bytes']['percent']}%), "
                    f"unpacked {_kib(cmp['unpacked']['bytes'])} ({cmp['unpacked']['percent']}%), native "
                    f"{_kib(cmp['native_bytes']['bytes'])} ({cmp['native_bytes']['percent']}%)")
        for op, d in cmp["per_op"].items():
            session.log(f"  {op}: {_kib(d['bytes'])} ({d['percent']}%) of native code removed")
    session.log(f"reports: {REPORTS / 'size.md'}, {REPORTS / 'size.json'}, {REPORTS / 'size.png'}")
