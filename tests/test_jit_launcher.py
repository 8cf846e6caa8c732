"""JIT launcher (CPU): argument packing, launcher selection, the native and the pure wheel builds.

The build tests (marked slow, ~10-20 s each) build a wheel in a fresh build dir, install it into
a private directory and check it in a subprocess: the native build imports with no GPU or driver,
links neither libtorch nor libcuda, and packs arguments exactly like the fallback; the
SLIM_KERNEL_NATIVE=OFF build has no binary and falls back to the cuda-python launcher.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from _wheels import log_tail, one_wheel, pip_wheel
from jit_fixtures import instances as fx

from slim_kernel.jit import _pylauncher, runtime

REPO = Path(__file__).resolve().parents[1]


def _has_driver() -> bool:
    return _pylauncher.driver_error() is None


def test_pack_args_layout():
    blob = _pylauncher.pack_args("pilf", (0xDEADBEEF00, -3, 1 << 40, 1.5))
    assert len(blob) == 32
    assert struct.unpack("<Qiiqfi", blob) == (0xDEADBEEF00, -3, 0, 1 << 40, 1.5, 0)


@pytest.mark.parametrize("signature,args,match", [
    ("pi", (1.0, 2), "argument 0 .*'p'.* device pointer"),
    ("pi", (1, 2**31), "argument 1 .*'i'"),
    ("pl", (1, 2**63), "argument 1 .*'l'"),
    ("pf", (1, "x"), "argument 1 .*'f'"),
    ("pi", (1,), "takes 2 arguments"),
    ("pi", [1, 2], "args must be a tuple"),
])
def test_pack_args_errors_name_the_argument(signature, args, match):
    with pytest.raises(TypeError, match=match):
        _pylauncher.pack_args(signature, args)


def test_launcher_selection(monkeypatch):
    monkeypatch.setenv(runtime.ENV_LAUNCHER, "python")
    assert runtime.launcher_name() == "python"
    monkeypatch.setenv(runtime.ENV_LAUNCHER, "cuda")
    with pytest.raises(ValueError, match="SLIM_KERNEL_LAUNCHER must be one of"):
        runtime.launcher_name()
    monkeypatch.setattr(runtime, "_NATIVE", {"module": None, "why": "slim_kernel._native is not built (test)"})
    monkeypatch.setenv(runtime.ENV_LAUNCHER, "native")
    with pytest.raises(RuntimeError, match="native launcher was requested but slim_kernel._native is not built"):
        runtime.launcher_name()
    monkeypatch.delenv(runtime.ENV_LAUNCHER)
    assert runtime.launcher_name() == "python"
    assert runtime.launcher_name("python") == "python"


@pytest.mark.skipif(_has_driver(), reason="a CUDA driver is present")
def test_no_driver_is_a_clear_reason_not_a_crash(monkeypatch):
    from slim_kernel import jit

    reason = jit.available()
    assert reason is not None and "libcuda" in reason
    with pytest.raises(RuntimeError, match="libcuda"):
        jit.get_kernel(fx.axpby(), 0, launcher="python")
    info = jit.runtime_info()
    assert {"compiler", "cache_dir", "launcher", "driver", "cached"} <= set(info)
    assert info["compiler"].startswith(("nvrtc", "nvcc"))


def test_runtime_info_counts_cached_instantiations(tmp_path, monkeypatch):
    from slim_kernel import jit
    from slim_kernel.jit import cache

    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path))
    cache.clear_memory()
    assert jit.runtime_info()["cached"] == "none"
    jit.compile_cubin(fx.axpby(), "9.0a")
    jit.compile_cubin(fx.axpby(bias=1), "9.0a")
    jit.compile_cubin(fx.axpby(), "10.0a")
    assert jit.runtime_info()["cached"] == "sm_100a: 1, sm_90a: 2"
    assert str(tmp_path) in jit.runtime_info()["cache_dir"]
    cache.clear_memory()


def test_import_is_cheap():
    code = "import sys, slim_kernel.jit; print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'cuda'))))"
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO / "python")), check=True).stdout
    assert json.loads(out) == []


# ---- wheel builds -------------------------------------------------------------------------

def _build_and_install(tmp_path: Path, native: str, **env: str) -> tuple[Path, Path]:
    """Build a wheel (fresh build dir) and install it into a private site dir; return both."""
    wheel_dir, site = tmp_path / "wheel", tmp_path / "site"
    # the env form also retags an OFF wheel as pure (pyproject.toml's override)
    proc = pip_wheel(wheel_dir, tmp_path / "build", dict(os.environ, SLIM_KERNEL_NATIVE=native, **env), timeout=600)
    assert proc.returncode == 0, log_tail(proc)
    wheel = one_wheel(wheel_dir)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return wheel, site


_PROBE = textwrap.dedent("""
    import json, struct, sys
    import slim_kernel, slim_kernel.jit as jit
    from slim_kernel.jit import _pylauncher, runtime
    assert slim_kernel.__file__.startswith(sys.argv[1]), slim_kernel.__file__
    out = {"launcher": runtime.launcher_name(), "available": jit.available(), "info": jit.runtime_info()}
    native, why = runtime.native_module()
    out["native_file"] = getattr(native, "__file__", None)
    if native is not None:
        out["driver_error"] = native.driver_error()
        args = (0xDEADBEEF00, -7, -(1 << 40), 0.25, 12)
        out["same_packing"] = native.pack_args("pilfi", args) == _pylauncher.pack_args("pilfi", args)
        try:
            native.pack_args("pi", (1.5, 2))
        except TypeError as exc:
            out["type_error"] = str(exc)
        try:
            native.pack_args("pt", (1, 2))
        except ValueError as exc:
            out["bad_code"] = str(exc)
    print(json.dumps(out))
""")


def _probe(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SLIM_KERNEL_LAUNCHER")}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run([sys.executable, "-c", _PROBE, str(site)], capture_output=True, text=True, env=env,
                          cwd=site, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def native_build(tmp_path_factory):
    """The native wheel, built once for this module, and the dir it is installed in."""
    return _build_and_install(tmp_path_factory.mktemp("native"), "ON")


@pytest.mark.slow
def test_native_build_imports_without_gpu_and_links_no_torch(native_build):
    wheel, site = native_build
    names = zipfile.ZipFile(wheel).namelist()
    natives = [n for n in names if n.startswith("slim_kernel/_native") and n.endswith(".so")]
    assert len(natives) == 1, names
    assert any(n.startswith("slim_kernel/jit/kernels/") and n.endswith(".cuh") for n in names) or not list(
        (REPO / "python/slim_kernel/jit/kernels").glob("*.cuh")), "kernel sources missing from the wheel"
    so = site / natives[0]
    if shutil.which("ldd"):
        ldd = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
        linked = [line.split()[0] for line in ldd.splitlines() if line.strip()]  # names, not load addresses
        for lib in ("torch", "c10", "libcuda", "libcudart", "libpython"):
            assert not any(lib in name for name in linked), ldd
    report = _probe(site)
    assert report["launcher"] == "native" and report["native_file"].startswith(str(site))
    assert report["same_packing"] is True
    assert "argument 0" in report["type_error"]
    assert "outside 'pilf'" in report["bad_code"]
    assert report["info"]["launcher"] == "native"
    if not _has_driver():
        assert "libcuda.so.1" in report["driver_error"]
        assert "libcuda" in report["available"]


@pytest.mark.slow
@pytest.mark.parametrize("native, env", [("OFF", {}), ("AUTO", {"CXX": "/nonexistent"})],
                         ids=["native-off", "no-compiler"])
def test_pure_build_is_tagged_pure_and_falls_back(tmp_path, native, env):
    """SLIM_KERNEL_NATIVE=OFF, and the default AUTO on a machine without a C++ compiler (CMake stops the
    first attempt, pyproject's `if.failed` override retries it pure): a py3-none-any wheel, no binary."""
    wheel, site = _build_and_install(tmp_path, native, **env)
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd", ".dylib"))], names
    wheel_file = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert "Root-Is-Purelib: true" in wheel_file and "Tag: py3-none-any" in wheel_file, wheel_file
    report = _probe(site)
    assert report["launcher"] == "python" and report["native_file"] is None
    assert report["info"]["launcher"].startswith("python (cuda-python fallback")


@pytest.mark.slow
def test_native_on_without_compiler_fails_instead_of_going_pure(tmp_path):
    """ON demands the launcher: no compiler is an error, also in the pure retry, never a pure wheel."""
    proc = pip_wheel(tmp_path / "wheel", tmp_path / "build", dict(os.environ, SLIM_KERNEL_NATIVE="ON",
                                                                  CXX="/nonexistent"), timeout=600)
    assert proc.returncode != 0, log_tail(proc)
    assert "/nonexistent" in proc.stdout + proc.stderr, log_tail(proc)
    assert not list((tmp_path / "wheel").glob("*.whl"))


# ---- both launchers against a fake driver (tests/conftest.py) -------------------------------

_FAKE_RUN = textwrap.dedent("""
    import ctypes, json, sys, threading
    sys.path.insert(0, sys.argv[2])
    from jit_fixtures import instances as fx
    from slim_kernel import jit
    from slim_kernel.jit import runtime
    runtime.arch_for_device = lambda index: "sm_90a"   # no torch.cuda here
    fake = ctypes.CDLL("libcuda.so.1")
    fake.fake_last_launch.restype = ctypes.c_char_p
    last = lambda: json.loads(fake.fake_last_launch())
    out = {"available": jit.available()}
    for name in sys.argv[1].split(","):
        r = out[name] = {}
        k = jit.get_kernel(fx.axpby(), 0, launcher=name)
        r["memoized"] = jit.get_kernel(fx.axpby(), 0, launcher=name) is k
        fake.fake_set_nparams(6)
        k.launch((3, 1, 1), (256, 1, 1), (0x1000, 0x2000, 0x3000, 12345, 1.5, -7), stream=0xABC)
        r["plain"] = last()
        k.launch((4, 2, 1), (128, 1, 1), (1, 2, 3, -(1 << 40), -0.5, 1), stream=0, pdl=True, cluster=(2, 1, 1))
        r["pdl_cluster"] = last()
        k.launch([2, 1, 1], [32], (1, 2, 3, 4, 1.0, 1), stream=0)  # lists and short dims
        r["lists"] = last()
        try:
            k.launch((1,), (32,), (1.5, 2, 3, 4, 1.0, 1), stream=0)
        except TypeError as exc:
            r["bad_arg"] = str(exc)
        errors = []
        t = threading.Thread(target=lambda: (k.launch(5, 64, (1, 2, 3, 4, 1.0, 2), stream=7), errors.append(None)))
        t.start(); t.join()
        r["thread_ok"] = errors == [None]
        r["thread"] = last()
        # the context already current (as torch leaves it): no push/pop around the launch
        ctx = ctypes.c_void_p()
        fake.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
        fake.cuCtxPushCurrent_v2(ctx)
        k.launch((1, 1, 1), (32, 1, 1), (9, 9, 9, 9, 9.0, 9), stream=3)
        r["depth_with_current"] = fake.fake_ctx_depth()
        fake.cuCtxPopCurrent_v2(None)
        s = jit.get_kernel(fx.smem_cluster(), 0, launcher=name)
        fake.fake_set_nparams(3)
        s.launch((8, 1, 1), (256, 1, 1), (5, 6, 25600), stream=1, smem=100 * 1024)
        r["smem"] = last()
        r["smem_limit"] = s.impl.smem_limit
        r["smem_attr"] = s.impl.attribute(8)
        s.prefer_carveout(40)
        s.prefer_carveout(25)  # never lowered
        r["carveout"] = [s.carveout, s.impl.attribute(9)]
        try:
            s.impl.set_attribute(9, 101)
        except RuntimeError as exc:
            r["bad_carveout"] = str(exc)
        # a launch's own carveout (CUDA >= 12.6 drivers), and what a plan gets on newer and older drivers
        s.launch((8, 1, 1), (256, 1, 1), (5, 6, 25600), stream=1, smem=100 * 1024, carveout=37)
        r["launch_carveout"] = last()["attrs"]
        r["bad_launch_carveout"] = []
        for bad in (101, -1, 1.5, "40"):
            try:
                s.launch((8, 1, 1), (256, 1, 1), (5, 6, 25600), stream=1, smem=100 * 1024, carveout=bad)
                r["bad_launch_carveout"].append(None)
            except (TypeError, ValueError) as exc:
                r["bad_launch_carveout"].append([type(exc).__name__, "carveout" in str(exc)])
        runtime._LAUNCH_CARVEOUT.clear()
        r["plan_carveout_new"] = [runtime.launch_carveout_supported(name), s.launch_carveout(55),
                                  s.launch_carveout(None), s.impl.attribute(9)]
        r["info_carveout_new"] = jit.runtime_info().get("carveout")
        fake.fake_set_driver_version(12040)
        runtime._LAUNCH_CARVEOUT.clear()
        r["plan_carveout_old"] = [runtime.launch_carveout_supported(name), s.launch_carveout(55),
                                  s.launch_carveout(45), s.impl.attribute(9)]
        r["info_carveout_old"] = jit.runtime_info().get("carveout")
        try:  # a driver that does not take the attribute refuses the launch, naming it
            s.launch((8, 1, 1), (256, 1, 1), (5, 6, 25600), stream=1, smem=100 * 1024, carveout=37)
        except RuntimeError as exc:
            r["old_driver_launch"] = str(exc)
        fake.fake_set_driver_version(13000)
        runtime._LAUNCH_CARVEOUT.clear()
        try:
            k.launch((1, 1, 1), (2048, 1, 1), (1, 2, 3, 4, 1.0, 1), stream=0)
        except RuntimeError as exc:
            r["bad_block"] = str(exc)
        try:
            jit.get_kernel(fx.axpby(bias=9), 5, launcher=name)
        except RuntimeError as exc:
            r["bad_device"] = str(exc)
        # first load and first smem raise while a (global-mode) capture is in progress
        fake.fake_set_capturing(1)
        try:
            c = jit.get_kernel(fx.axpby(bias=7), 0, launcher=name)
            c.launch((1, 1, 1), (32, 1, 1), (1, 2, 3, 4, 1.0, 1), stream=5)
            s.launch((8, 1, 1), (256, 1, 1), (5, 6, 30000), stream=5, smem=120_000)
            r["capture_load_ok"] = True
        except RuntimeError as exc:
            r["capture_load_ok"] = str(exc)
        fake.fake_set_capturing(0)
        r["capture_mode_after"] = fake.fake_capture_mode()
        k1 = jit.get_kernel(fx.axpby(), 1, launcher=name)
        fake.fake_set_nparams(6)
        k1.launch((1, 1, 1), (32, 1, 1), (1, 2, 3, 4, 1.0, 1), stream=11)
        r["device1"] = last()
        r["depth_after"] = fake.fake_ctx_depth()
    out["launches"] = fake.fake_launch_count()
    print(json.dumps(out))
""")


def _run_fake(fake_driver: Path, pythonpath: Path, launchers: str, script: str | None = None) -> dict:
    """Run ``script`` (default: the launch checks) in a child that loads the fake libcuda."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLIM_KERNEL_LAUNCHER",)}
    env.update(LD_LIBRARY_PATH=str(fake_driver), PYTHONPATH=str(pythonpath))
    proc = subprocess.run([sys.executable, "-c", script or _FAKE_RUN, launchers, str(REPO / "tests")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_fake_launches(r: dict) -> None:
    assert r["memoized"]
    assert r["plain"] == {"entry": "fixture_axpby", "grid": [3, 1, 1], "block": [256, 1, 1], "smem": 0,
                          "stream": 0xABC, "attrs": [],
                          "params": ["0000000000001000", "0000000000002000", "0000000000003000",
                                     "0000000000003039", "000000003fc00000", "00000000fffffff9"]}
    assert r["pdl_cluster"]["attrs"] == [[6, 1], [4, 2, 1, 1]]
    assert r["pdl_cluster"]["grid"] == [4, 2, 1] and r["pdl_cluster"]["stream"] == 0
    assert r["pdl_cluster"]["params"][3:5] == ["ffffff0000000000", "00000000bf000000"]
    assert r["lists"]["grid"] == [2, 1, 1] and r["lists"]["block"] == [32, 1, 1]
    assert "argument 0" in r["bad_arg"] and "device pointer" in r["bad_arg"]
    assert r["thread_ok"] and r["thread"]["grid"] == [5, 1, 1] and r["thread"]["block"] == [64, 1, 1]
    assert r["depth_with_current"] == 1
    assert r["smem"]["smem"] == 100 * 1024 and r["smem_limit"] == 100 * 1024 and r["smem_attr"] == 100 * 1024
    assert r["smem"]["params"] == ["0000000000000005", "0000000000000006", "0000000000006400"]
    assert r["carveout"] == [40, 40] and "cuFuncSetAttribute(9=101)" in r["bad_carveout"]
    assert "CUDA_ERROR_INVALID_VALUE" in r["bad_carveout"]
    assert r["launch_carveout"] == [[14, 37]]
    assert r["bad_launch_carveout"] == [["ValueError", True], ["ValueError", True], ["TypeError", True],
                                        ["TypeError", True]]
    # a CUDA >= 12.6 driver: each launch carries the plan's carveout, the function's attribute untouched
    assert r["plan_carveout_new"] == [True, 55, None, 40]
    # older: the function's attribute, raised to the largest asked for (never lowered), and no launch attribute
    assert r["plan_carveout_old"] == [False, None, None, 55]
    assert "carveout=37" in r["old_driver_launch"] and "CUDA_ERROR_INVALID_VALUE" in r["old_driver_launch"]
    assert r["info_carveout_new"] == "each launch its own"  # what `slim-kernel info` says
    assert r["info_carveout_old"].startswith("one per kernel") and "12.6" in r["info_carveout_old"]
    assert "launch of fixture_axpby" in r["bad_block"] and "CUDA_ERROR_INVALID_VALUE" in r["bad_block"]
    assert "CUDA_ERROR_INVALID_DEVICE" in r["bad_device"]
    assert r["capture_load_ok"] is True and r["capture_mode_after"] == 0
    assert r["device1"]["stream"] == 11
    assert r["depth_after"] == 0, "a launcher left a context pushed"


def test_python_launcher_against_fake_driver(fake_driver):
    report = _run_fake(fake_driver, REPO / "python", "python")
    assert report["available"] is None
    _check_fake_launches(report["python"])


@pytest.mark.slow
def test_native_launcher_against_fake_driver(fake_driver, native_build):
    _, site = native_build
    report = _run_fake(fake_driver, site, "native,python")
    assert report["available"] is None
    _check_fake_launches(report["native"])
    _check_fake_launches(report["python"])
    for key in ("plain", "pdl_cluster", "lists", "thread", "smem", "device1"):
        assert report["native"][key] == report["python"][key], key


# ---- the preferred shared-memory carveout (jit/runtime.py) ----------------------------------



def test_carveout_leaves_room_beside_the_ctas_an_sm_gets():
    from slim_kernel.jit.catalogue import SMEM_PER_SM as H200_SMEM_PER_SM
    from slim_kernel.jit.runtime import carveout_percent

    # GLM-5's router at M=10 (narrow_r2k6c, 31 KB, 128 CTAs on 132 SMs): the driver's 32 KB would leave
    # no room for the kernel before it; 2 KB of room asks for 15% (34 KB, served as 64 KB)
    assert carveout_percent(31744, 128, 132, H200_SMEM_PER_SM, 2048) == 15
    # 228 CTAs on 132 SMs: two CTAs per SM stay resident, plus the room (stream_w3 at Kimi-K3's 3648 rows)
    assert carveout_percent(104448, 228, 132, H200_SMEM_PER_SM, 2048) == 92
    # never more than the SM has, and never below what the CTAs need
    assert carveout_percent(200_000, 132, 132, H200_SMEM_PER_SM, 64 * 1024) == 100
    for smem, ctas, room in ((0, 1, 1), (1000, 400, 4096), (50_000, 500, 1), (120_000, 132, 2048)):
        pct = carveout_percent(smem, ctas, 132, H200_SMEM_PER_SM, room)
        per_sm = min(-(-ctas // 132), H200_SMEM_PER_SM // (smem + 1024))
        assert 0 < pct <= 100 and pct * H200_SMEM_PER_SM / 100 >= min(H200_SMEM_PER_SM, per_sm * (smem + 1024) + room)
    # the driver's choice: no room asked for, no CTA fits, or the SM's size unknown
    assert carveout_percent(31744, 128, 132, H200_SMEM_PER_SM, 0) is None
    assert carveout_percent(H200_SMEM_PER_SM, 1, 132, H200_SMEM_PER_SM, 2048) is None
    assert carveout_percent(31744, 128, 132, 0, 2048) is None
    assert carveout_percent(70784, 128, 132, H200_SMEM_PER_SM, 2048, cluster=True) is None  # ring_c8 at M 9-16


@pytest.mark.parametrize("raw,value", [(None, 32768), ("", 32768), ("0", 0), (" 2048 ", 2048)])
def test_smem_room_knob(monkeypatch, raw, value):
    from slim_kernel import knobs

    if raw is None:
        monkeypatch.delenv(knobs.ENV_SMEM_ROOM, raising=False)
    else:
        monkeypatch.setenv(knobs.ENV_SMEM_ROOM, raw)
    assert knobs.smem_room() == value


@pytest.mark.parametrize("raw", ["-1", "2k", "1.5", str((1 << 20) + 1)])
def test_a_bad_smem_room_names_the_variable(monkeypatch, raw):
    from slim_kernel import knobs

    monkeypatch.setenv(knobs.ENV_SMEM_ROOM, raw)
    with pytest.raises(ValueError, match="SLIM_KERNEL_SMEM_ROOM"):
        knobs.smem_room()
