"""Sessions: build, test, audit, size, torch-floor, torch-newest, lint (CPU) and gpu, bench (on the GPU machine).

`nox -s build test` builds the wheel into dist/ and tests exactly that wheel in a fresh
environment. `nox -s test` alone rebuilds first when dist/ is missing or older than the
sources, so it never tests a stale wheel. `torch-floor` and `torch-newest` run the quick tests
(`-m "not slow"`) on the oldest torch pyproject.toml allows and on the newest release.

Every dependency comes from pyproject.toml (its dependencies, extras and dependency groups) and the
op names from python/slim_kernel/names.py: this file keeps no list of its own and never imports
the package source.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
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
# Which instances the AOT baseline compiles: "subset" (default: one per op, kernel family and output
# dtype, about a minute) or "full" (the whole catalogue, about 20 minutes on 2 cores).
ENV_AOT_SET = "SLIM_KERNEL_AOT_SET"
CPU_TORCH = PYPROJECT["tool"]["slim-kernel"]["test-torch"]  # a pinned CPU build: never an unpinned torch
# stdlib-only: where PyTorch's CPU index answers, the test torch comes from there (tools/cpu_torch.py)
TORCH_INDEX = runpy.run_path(str(ROOT / "tools" / "cpu_torch.py"))
# What audit/size install besides the wheel (installed --no-deps): its dependencies and the audit
# extra, less torch, which the audit never imports (cuda-bindings and nvidia-nvjitlink read LTO IR).
AUDIT_SKIPS = ("torch",)


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
    """Install the built wheel (never the source tree) into a fresh env with a CPU torch and run pytest."""
    args, how, index = TORCH_INDEX["pip_args"](CPU_TORCH)
    session.log(f"torch: {how}")
    _test_wheel(session, args, session.posargs, pytest_env={TORCH_INDEX["ENV"]: index},
                fallback=[CPU_TORCH] if args != [CPU_TORCH] else None)


@nox.session(name="torch-floor")
def torch_floor(session: nox.Session) -> None:
    """The quick tests on the oldest torch pyproject.toml allows (`torch>=X`: torch==X.*, the CUDA build
    PyPI has, several GB; the GPU paths' torch calls are checked on meta tensors)."""
    _test_wheel(session, [f"torch=={_torch_floor()}.*"], ["-m", "not slow", *session.posargs])


@nox.session(name="torch-newest")
def torch_newest(session: nox.Session) -> None:
    """The quick tests on the newest torch release on the index (a CUDA build, several GB, with its NVRTC),
    whatever pip constraints the machine sets (PIP_CONSTRAINT is emptied for this session's installs)."""
    _test_wheel(session, ["--upgrade", "torch"], ["-m", "not slow", *session.posargs],
                pip_env={"PIP_CONSTRAINT": os.devnull})


def _torch_floor() -> str:
    """X of the `torch>=X` dependency in pyproject.toml."""
    for text in PYPROJECT["project"]["dependencies"]:
        req = Requirement(text)
        if canonicalize_name(req.name) == "torch":
            floors = [spec.version for spec in req.specifier if spec.operator == ">="]
            if floors:
                return floors[0]
    raise RuntimeError("pyproject.toml declares no torch>=X dependency")


def _torch_version(session: nox.Session) -> str:
    return session.run("python", "-c", "import torch; print(torch.__version__)", silent=True).strip().splitlines()[-1]


def _test_wheel(session: nox.Session, torch_args: list[str], pytest_args: list[str], pip_env: dict | None = None,
                pytest_env: dict | None = None, fallback: list[str] | None = None) -> None:
    """torch first (so that the wheel's torch>=X never resolves to another build; ``fallback`` where
    ``torch_args`` fail), then the wheel with its test extra, which must leave that torch as it is; then
    info, the audit of the wheel and pytest, whose temp files (basetemp, JIT cache, pip cache) are
    removed afterwards."""
    wheel = _fresh_wheel(session)
    try:
        session.install(*torch_args, env=pip_env)
    except nox.command.CommandFailed:
        if fallback is None:
            raise
        session.warn(f"installing {' '.join(torch_args)} failed: installing {' '.join(fallback)} instead")
        session.install(*fallback, env=pip_env)
    torch = _torch_version(session)
    session.install(f"{wheel}[test]", env=pip_env)  # what `pip install ".[test]"` installs (flashinfer is an extra)
    session.install("--no-deps", "--force-reinstall", str(wheel), env=pip_env)  # exactly this wheel in a reused env
    if _torch_version(session) != torch:
        session.error(f"installing {wheel.name}[test] replaced torch {torch} with {_torch_version(session)}")
    session.log(f"testing {wheel.name} on torch {torch}")
    session.run("slim-kernel", "info")
    session.run("slim-kernel", "audit", "--no-progress", str(wheel))  # the wheel under test holds no AOT code
    tmp = Path(session.create_tmp())
    env = {"SLIM_KERNEL_CACHE_DIR": str(tmp / "jit"), "PIP_CACHE_DIR": str(tmp / "pip-cache"), **(pytest_env or {})}
    try:
        session.run("python", "-m", "pytest", str(ROOT / "tests"), "-p", "no:cacheprovider", "--basetemp",
                    str(tmp / "pytest"), *pytest_args, env=env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        _drop_environment(session, f"removed the test run's temp files ({tmp})")


def _drop_environment(session: nox.Session, done: str) -> None:
    """Remove the session's environment (over 1 GB with torch) unless nox was asked to reuse it (-r,
    --reuse-existing-virtualenvs): without that nox makes it anew on the next run anyway."""
    venv = Path(session.virtualenv.location)
    if getattr(session.virtualenv, "reuse_existing", False):
        session.log(f"{done}; the session's environment stays for reuse (-r): {_du(venv)}")
        return
    size = _du(venv)
    shutil.rmtree(venv, ignore_errors=True)
    session.log(f"{done} and the session's environment ({size}; -r keeps it for the next run)")


def _du(path: Path) -> str:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return f"{path} {total / 2**30:.2f} GiB"


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
    # BUNDLE: a folder of flashinfer wheels (and their dependencies) to install, or "none"
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


def _aot_set() -> str:
    value = os.environ.get(ENV_AOT_SET, "").strip().lower() or "subset"
    if value not in ("subset", "full"):
        raise ValueError(f"{ENV_AOT_SET} must be subset or full, got {os.environ.get(ENV_AOT_SET)!r}")
    return value


def _baseline_wheel(session: nox.Session) -> tuple[Path, dict] | None:
    """Build (when stale) the AOT baseline wheel into dist/aot-baseline/; (wheel, the manifest's
    selection); None when nvcc is missing. The instance list (csrc/aot_baseline/manifest.py) reads the
    torch-free catalogue; the build runs without isolation, so the build backend goes in here (CMake
    drives ninja or make from the system)."""
    nvcc = _find_nvcc(session)
    if nvcc is None:
        session.warn("nvcc not found (PATH, CUDACXX, CUDA_HOME, /usr/local/cuda): the AOT baseline cannot be built; "
                     "reporting the shipped wheel only")
        return None
    archs = os.environ.get("SLIM_KERNEL_AOT_ARCHS", "")  # empty: the release list in csrc/aot_baseline
    session.install(*PYPROJECT["build-system"]["requires"])
    BASELINE_DIST.mkdir(parents=True, exist_ok=True)
    manifest = BASELINE_DIST / "manifest.json"
    subset = ["--subset"] if _aot_set() == "subset" else []
    session.run("python", str(ROOT / "csrc" / "aot_baseline" / "manifest.py"), "-o", str(manifest), *subset,
                silent=True)
    selection = json.loads(manifest.read_text())["selection"]
    stamp = hashlib.sha256(f"{_source_hash()} {archs} {nvcc}".encode() + manifest.read_bytes()).hexdigest()
    wheels = sorted(BASELINE_DIST.glob("slim_kernel-*.whl"))
    if len(wheels) == 1 and BASELINE_STAMP.exists() and BASELINE_STAMP.read_text() == stamp:
        session.log(f"AOT baseline is up to date (its sources, instances and nvcc did not change): {wheels[0].name}")
        return wheels[0], selection
    for old in wheels:
        old.unlink()
    env = {"SLIM_KERNEL_AOT_BASELINE": "ON", "SLIM_KERNEL_AOT_MANIFEST": str(manifest),
           "CUDACXX": nvcc, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    if archs:
        env["SLIM_KERNEL_AOT_ARCHS"] = archs
    what = (f"AOT baseline ({selection['set']}: {selection['instances']} of {selection['catalogue']} instances, "
            f"archs {archs or 'release list'})")
    session.log(f"building the {what}; {ENV_AOT_SET}=full builds every instance")
    start = time.perf_counter()
    steps = _run_with_progress(session, ["python", "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps",
                                         "-w", str(BASELINE_DIST), str(ROOT)], env, what)
    (wheel,) = BASELINE_DIST.glob("slim_kernel-*.whl")
    if "+aot" not in wheel.name:
        raise RuntimeError(f"{wheel.name} does not carry the +aot local version: the baseline override is broken")
    BASELINE_STAMP.write_text(stamp)
    session.log(f"built the {what}: {wheel.name} ({wheel.stat().st_size / 1024:.1f} KiB, {steps} build steps) in "
                f"{time.perf_counter() - start:.0f} s")
    return wheel, selection


_STEP = re.compile(r"^\s*\[\s*(\d+)/(\d+)\]")  # ninja's "[12/47] Building CUDA object ..."


def _run_with_progress(session: nox.Session, cmd: list[str], env: dict, what: str) -> int:
    """Run ``cmd`` in the session's environment: on a terminal one progress line updated in place (the
    build steps ninja reports), elsewhere (CI logs) a line every 30 s; the last lines of the output when
    it fails. Returns the number of build steps seen."""
    tty = sys.stdout.isatty()
    full_env = {**os.environ, **env, "VIRTUAL_ENV": str(Path(session.bin).parent),
                "PATH": os.pathsep.join([session.bin, os.environ.get("PATH", "")])}
    tail: collections.deque = collections.deque(maxlen=60)
    start, steps = time.perf_counter(), 0
    said = start
    with subprocess.Popen([str(Path(session.bin) / cmd[0]), *cmd[1:]], cwd=ROOT, env=full_env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as proc:
        for line in proc.stdout:
            tail.append(line.rstrip())
            step = _STEP.match(line)
            if step:
                steps = int(step[1])
                now = time.perf_counter()
                if tty:
                    print(f"\r  {what}: build step {step[1]}/{step[2]}, {now - start:.0f} s", end="", flush=True)
                elif now - said >= 30:
                    said = now
                    session.log(f"{what}: build step {step[1]}/{step[2]}, {now - start:.0f} s")
    if tty and steps:
        print()
    if proc.returncode:
        session.error(f"the {what} build failed (exit {proc.returncode}); its last lines:\n" + "\n".join(tail))
    return steps


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


def _record_baseline_scope(report: dict, selection: dict) -> None:
    """Say in reports/size.json and size.md which instances the baseline holds and how to read the numbers:
    a subset baseline is smaller than the real one (the reduction is a lower bound); its device code,
    scaled per op by the catalogue's instance count, estimates the full one."""
    scope = dict(selection)
    if selection["set"] == "subset":
        per_op = report["baseline"]["per_op"]
        ops = [op for op in selection["per_op"] if op in per_op]
        measured = sum(per_op[op]["device"] for op in ops)
        estimate = sum(per_op[op]["device"] * selection["catalogue_per_op"][op] // selection["per_op"][op] for op in ops)
        scope["kernel_device_bytes"], scope["full_kernel_device_bytes_estimate"] = measured, estimate
        scope["summary"] = (f"subset: {selection['instances']} of {selection['catalogue']} instances "
                            f"({selection['rule']}), so the reduction above is a lower bound. Their kernels take "
                            f"{_kib(measured)} of device code; scaled per op by the catalogue's instance count (a rough "
                            f"estimate: instances of one op differ in size), all {selection['catalogue']} would take "
                            f"about {_kib(estimate)}. {ENV_AOT_SET}=full builds and measures every instance.")
    else:
        scope["summary"] = f"full: all {selection['catalogue']} instances of the catalogue (measured, not scaled)"
    report["aot_baseline"] = scope
    (REPORTS / "size.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(REPORTS / "size.md", "a") as md:
        md.write(f"\n## AOT baseline scope\n\n{scope['summary']}\n")


@nox.session
def size(session: nox.Session) -> None:
    """Shipped wheel vs the AOT baseline (a subset of the instances unless SLIM_KERNEL_AOT_SET=full; the
    report says which): audit both (baseline = negative control), size report, budget."""
    wheel = _fresh_wheel(session)
    session.install(*_requirements("audit", skip=AUDIT_SKIPS))
    session.install("--no-deps", "--force-reinstall", str(wheel))
    baseline, selection = _baseline_wheel(session) or (None, None)
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
    if selection is not None:
        _record_baseline_scope(report, selection)
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
        session.log(f"AOT baseline scope: {report['aot_baseline']['summary']}")
    session.log(f"reports: {REPORTS / 'size.md'}, {REPORTS / 'size.json'}, {REPORTS / 'size.png'}")
