import functools
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

pytest_plugins = ["_heartbeat"]  # a line every 20 s while one test runs long (CI logs)


@functools.cache
def _compiler_problem(name: str) -> str | None:
    """Why the JIT compiler `name` cannot be used here, or None."""
    from slim_kernel.jit import compiler

    try:
        compiler.get_compiler(name)
    except compiler.CompilerUnavailableError as exc:
        return str(exc)
    return None


def _compilers_needed(item) -> set[str]:
    """JIT compilers an item needs: its `needs_compiler(...)` markers and a `compiler_name` parameter."""
    names = {name for mark in item.iter_markers("needs_compiler") for name in mark.args}
    callspec = getattr(item, "callspec", None)
    if callspec is not None and isinstance(callspec.params.get("compiler_name"), str):
        names.add(callspec.params["compiler_name"])
    return names


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    cuda = torch.cuda.is_available()
    # CI (CI=true) has both compilers (the `test` extra brings NVRTC, the machine nvcc): there a missing
    # one fails its tests with the compiler's own error instead of skipping them unseen.
    strict = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    for item in items:
        if "gpu" in item.keywords and not cuda:
            item.add_marker(no_gpu)
        if strict:
            continue
        for name in sorted(_compilers_needed(item)):
            problem = _compiler_problem(name)
            if problem:
                item.add_marker(pytest.mark.skip(reason=f"{name} is not usable here: {problem}"))
                break


@pytest.fixture
def gen():
    """A fresh seed per test, printed on failure, so each run draws new random inputs."""
    seed = torch.randint(0, 2**31 - 1, ()).item()
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def _pdl_knob(setting):
    from slim_kernel import knobs

    old = knobs.pdl_setting()
    knobs.set_pdl(setting)
    yield setting
    knobs.set_pdl(old)


@pytest.fixture(params=[True, False, "auto"], ids=["pdl", "nopdl", "auto"])
def pdl(request):
    """The PDL knob (slim_kernel.knobs) set to on, off or auto for the test, restored after."""
    yield from _pdl_knob(request.param)


@pytest.fixture
def pdl_auto():
    """The PDL knob at auto (the default) for the test, whatever the test sets it to restored after."""
    yield from _pdl_knob("auto")


@pytest.fixture
def fake_devices(monkeypatch):
    """CUDA device switching without a GPU: slim_kernel.devices.current() reads ``state["cur"]`` and
    ``torch.cuda.device(i)`` sets it for its scope, logging each switch in ``state["switches"]``."""
    import contextlib

    from slim_kernel import devices

    state = {"cur": 0, "switches": []}

    @contextlib.contextmanager
    def device(index):
        index = devices.index(index)
        previous, state["cur"] = state["cur"], index
        state["switches"].append(index)
        try:
            yield
        finally:
            state["cur"] = previous

    monkeypatch.setattr(devices, "current", lambda: state["cur"])
    monkeypatch.setattr(torch.cuda, "device", device)
    return state


@pytest.fixture(scope="session")
def fake_driver(tmp_path_factory):
    """A fake libcuda.so.1 (tests/jit_fixtures/fake_libcuda.c) in a directory for LD_LIBRARY_PATH."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler for the fake driver")
    out = tmp_path_factory.mktemp("fake_cuda")
    source = Path(__file__).resolve().parent / "jit_fixtures" / "fake_libcuda.c"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out / "libcuda.so.1"), str(source),
                    "-Wl,-soname,libcuda.so.1"], check=True)
    return out


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private, empty JIT cache ($SLIM_KERNEL_CACHE_DIR): compiling allowed, no trace file."""
    from slim_kernel import knobs
    from slim_kernel.jit import cache

    root = tmp_path / "cache"
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(root))
    monkeypatch.delenv(cache.ENV_TRACE, raising=False)
    monkeypatch.delenv(knobs.ENV_JIT, raising=False)
    cache.clear_memory()
    yield root
    cache.clear_memory()
