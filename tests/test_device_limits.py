"""Never guessed into a failure: the JIT configuration a call runs fits the device's own limits, an arch nothing
measured runs the maker's kernels first, and a kernel that cannot load hands the call to the next backend.

CPU only: devices are faked (capability, name, SM count, ``jit.arch`` limits); no GPU, no compile.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import slim_kernel.ops  # noqa: F401  (registers the ops' backends)
from slim_kernel import devices, info, models, registry, routing
from slim_kernel.backends import jit as jb
from slim_kernel.jit import catalogue as cat
from slim_kernel.jit import routed
from slim_kernel.jit import rules as tile_rules
from slim_kernel.jit.arch import limits
from slim_kernel.jit.routed import config_for
from slim_kernel.jit.runtime import KernelLoadError
from slim_kernel.names import FUSED_A, ROUTER

CUDA0 = torch.device("cuda", 0)
# (name, SM count, arch, capability): what each faked GPU reports
DEVICES = {
    "rtx-pro-6000": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 188, "sm_120", (12, 0)),
    "dgx-spark": ("NVIDIA GB10", 48, "sm_121", (12, 1)),
    "b200": ("NVIDIA B200", 148, "sm_100", (10, 0)),
    "h20": ("NVIDIA H20", 78, "sm_90", (9, 0)),
    "h100-pcie": ("NVIDIA H100 PCIe", 114, "sm_90", (9, 0)),
}
MS = (1, 4, 8, 9, 16, 32)


def _fake(monkeypatch, key: str):
    """Make cuda:0 the faked GPU ``key`` for selection and the JIT backend; returns its routing device and limits."""
    name, sms, arch, cap = DEVICES[key]
    dev = routing.Device(name, sms, arch)
    lim = dataclasses.replace(limits(arch), sms=sms)
    monkeypatch.setattr(registry, "_capability", lambda index: cap)
    monkeypatch.setattr(registry, "arch", lambda device: arch)
    monkeypatch.setattr(devices, "routing_device", lambda device: dev)
    monkeypatch.setattr(jb.devices, "index", lambda device: 0)
    monkeypatch.setitem(jb._LIMITS, 0, lim)
    return dev, lim


def _jit_variant(op, shape, m, dev):
    dec = routing.lookup(op, shape.key(), m, False, dev)
    best = dec.point.best("jit") if dec is not None else None
    return best[0] if best else None


@pytest.mark.parametrize("key", list(DEVICES))
def test_every_model_pick_fits_the_device(monkeypatch, key):
    """At every model shape and a few M, the JIT configuration the call would run (routed, else a fitting one)
    launches within the device's shared memory, threads, registers and cluster size."""
    dev, lim = _fake(monkeypatch, key)
    for shape in models.all_shapes():
        for m in MS:
            nk = (shape.n, shape.k)
            label, cfg = config_for(shape.op, m, _jit_variant(shape.op, shape, m, dev), nk, lim)
            if routed.launch_reason(cfg, shape.op, m, nk, lim) is None:
                assert cfg.smem(m, nk) <= lim.smem_per_block
                continue
            # nothing fits here: every configuration serving this call is refused, and the JIT backend declines
            assert all(routed.launch_reason(c, shape.op, m, nk, lim) for c in cat.VARIANTS[shape.op].values()
                       if cat.variant_serves(c, shape.op, m, nk)), (key, shape, m, label)
            call = _router_call(m, shape.n, shape.k) if shape.op == ROUTER else _fused_a_call(m, shape.n, shape.k)
            prepare = jb.prepare_router if shape.op == ROUTER else jb.prepare_fused_a
            with pytest.raises(registry.CallNotServed, match="the device allows"):
                prepare(call, label, False)


def test_the_sm90_sized_fallback_does_not_fit_99_kib_and_is_never_picked(monkeypatch):
    """fused-A's skinny fallback asks 128 KiB at M 9-16: on a 99 KiB device another configuration serves."""
    _, lim = _fake(monkeypatch, "rtx-pro-6000")
    skinny, nk = cat.VARIANTS[FUSED_A]["skinny"], (2112, 7168)
    assert "shared memory" in routed.launch_reason(skinny, FUSED_A, 16, nk, lim)
    assert routed.launch_reason(skinny, FUSED_A, 16, nk, limits("sm_90")) is None  # a negative control: it fits an H100
    label, cfg = config_for(FUSED_A, 16, "skinny", nk, lim)
    assert label != "skinny" and routed.launch_reason(cfg, FUSED_A, 16, nk, lim) is None
    assert config_for(FUSED_A, 16, "skinny", nk)[0] == "skinny"  # without the device's limits: unchanged


def test_non_portable_clusters_only_where_granted(monkeypatch):
    """direct_s16 launches clusters of 16 CTAs: Hopper grants them, sm_120 (portable 8) does not."""
    direct16, nk = cat.VARIANTS[ROUTER]["direct_s16"], (256, 7168)
    assert routed.launch_reason(direct16, ROUTER, 12, nk, dataclasses.replace(limits("sm_90"), sms=78)) is None
    _, lim = _fake(monkeypatch, "rtx-pro-6000")
    assert "clusters of 16" in routed.launch_reason(direct16, ROUTER, 12, nk, lim)
    label, cfg = config_for(ROUTER, 12, "direct_s16", nk, lim)
    assert label != "direct_s16" and routed.launch_reason(cfg, ROUTER, 12, nk, lim) is None


def _router_call(m=16, e=256, k=7168):
    return torch.empty(m, e), torch.randn(m, k).bfloat16(), torch.randn(e, k).bfloat16()


def _fused_a_call(m=16, n=2112, k=7168):
    return torch.empty(m, n).bfloat16(), torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16().t()


def test_rules_that_do_not_fit_are_declined_before_any_load(monkeypatch):
    """Tile rules sized for an H100 on a 99 KiB device: the JIT backend declines (CallNotServed), loading nothing."""
    _fake(monkeypatch, "rtx-pro-6000")
    monkeypatch.setattr("slim_kernel.jit.get_kernel", lambda *a: pytest.fail("a kernel was loaded"))
    monkeypatch.setitem(routed._RULES, FUSED_A, tile_rules.parse_rules("64:kernel=skinny,warps=8,stages=8,split=1", FUSED_A))
    with pytest.raises(registry.CallNotServed, match="shared memory per CTA, the device allows 101376"):
        jb.prepare_fused_a(_fused_a_call(), None, False)


@pytest.mark.parametrize("key,expect", [("rtx-pro-6000", "torch"), ("dgx-spark", "torch"), ("b200", "flashinfer")])
def test_an_unmeasured_arch_runs_the_makers_kernels_first(monkeypatch, key, expect):
    """No table for sm_100/sm_120: flashinfer where eligible (its router stops at SM 10.x), else torch; the JIT
    last; ``info`` says which rule decided. On a measured arch (the negative control) the JIT leads."""
    _fake(monkeypatch, key)
    order, _, dec = registry.ranked(ROUTER, CUDA0, info._meta_args(ROUTER, {"e": 256, "k": 7168, "out": "float32"}, 4),
                                    False)
    names = [s.backend.value for s in order]
    assert dec is None and names[0] == expect and names[-1] == "jit", names
    assert registry.order_rule(ROUTER, CUDA0, dec) == "maker-first"
    assert "nothing measured on sm_1" in registry.why(order[0], dec, registry.unmeasured_arch(ROUTER, CUDA0))
    _fake(monkeypatch, "h20")
    order, _, dec = registry.ranked(ROUTER, CUDA0, info._meta_args(ROUTER, {"e": 256, "k": 7168, "out": "float32"}, 4),
                                    False)
    assert dec is not None and order[0].backend.value == "jit"
    assert registry.order_rule(ROUTER, CUDA0, dec) == "estimate"


def test_bmm_fp8_keeps_a_working_backend_on_sm120(monkeypatch):
    """flashinfer's cuBLASLt bmm_fp8 is not eligible on SM 12.x; the torch reference serves; SM 9.0 keeps flashinfer."""
    spec = next(s for s in registry._REGISTRY["bmm_fp8"] if s.backend.value == "flashinfer")
    monkeypatch.setattr(registry, "_capability", lambda index: (12, 0))
    assert "SM <= 11.0" in spec.device_reason(CUDA0)
    monkeypatch.setattr(registry, "_capability", lambda index: (9, 0))
    assert spec.device_reason(CUDA0) is None


def test_a_kernel_the_driver_cannot_load_falls_back_with_one_warning(monkeypatch):
    """KernelLoadError from the loader: the JIT backend declines, the next backend serves, one warning; pinned, it raises."""
    _fake(monkeypatch, "h100-pcie")

    def unloadable(instance, device_index):
        raise KernelLoadError("slim_kernel: cannot load JIT kernel x (sm_90a): compiled by nvrtc 13.0, the driver "
                              "supports CUDA 12.8")

    monkeypatch.setattr("slim_kernel.jit.get_kernel", unloadable)
    monkeypatch.setattr(registry, "_load", lambda spec: (jb.prepare_router if spec.backend.value == "jit" else
                                                          (lambda *args: "served"), None))
    monkeypatch.setattr(registry, "_BROKEN", {})
    args = _router_call(m=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sel = registry.select(ROUTER, CUDA0, args)
    assert sel.spec.backend.value != "jit"
    fell = [str(w.message) for w in caught if "falling back" in str(w.message)]
    assert len(fell) == 1 and "'jit'" in fell[0] and "CUDA 12.8" in fell[0] and "nvrtc 13.0" in fell[0]
    with pytest.raises(registry.BackendUnavailableError, match="CUDA 12.8"):
        registry.select(ROUTER, CUDA0, args, backend="jit")


_DRIVER_RUN = textwrap.dedent("""
    import ctypes, json, re, sys
    sys.path.insert(0, sys.argv[1])
    from jit_fixtures import instances as fx
    from slim_kernel import jit
    from slim_kernel.jit import cache, runtime
    runtime.arch_for_device = lambda index: "sm_90a"   # no torch.cuda here
    fake = ctypes.CDLL("libcuda.so.1")
    major = int(re.search(r"(\\d+)\\.", cache.get_entry(fx.axpby(), "sm_90a").header["compiler"])[1])
    out = {"major": major}
    def attempt(tag, bias, driver, error):
        fake.fake_set_driver_version(driver)
        fake.fake_set_load_error(error)
        try:
            jit.get_kernel(fx.axpby(bias=bias), 0, launcher="python")
            out[tag] = "loaded"
        except runtime.KernelLoadError as exc:
            out[tag] = "KernelLoadError: " + str(exc)
    attempt("older_major", 31, (major - 1) * 1000 + 80, 0)
    attempt("refused_image", 32, major * 1000, 222)
    attempt("no_binary", 33, major * 1000, 209)
    attempt("same_major", 34, major * 1000, 0)
    attempt("after_refusal", 32, major * 1000, 0)  # the driver updated: the same cached cubin loads
    k = jit.get_kernel(fx.axpby(bias=35), 0, launcher="python")
    out["fits"] = k.launch_reason(256, 100 * 1024)
    out["too_much_smem"] = k.launch_reason(256, 300 * 1024)
    fake.fake_set_max_threads(384)  # a register-heavy function: fewer threads per block than the catalogue thought
    out["too_many_threads"] = k.launch_reason(448, 0)
    print(json.dumps(out))
""")


def test_a_cubin_of_a_newer_cuda_than_the_driver_is_refused_naming_both(fake_driver, tmp_path):
    """A cubin compiled by CUDA N under a CUDA N-1 driver is refused before the load, naming both versions; a
    load the driver answers CUDA_ERROR_UNSUPPORTED_PTX_VERSION / NO_BINARY_FOR_GPU is a KernelLoadError
    (the JIT backend then declines: the next backend serves), never a crash; the same driver major loads."""
    tests = Path(__file__).resolve().parent
    env = {k: v for k, v in os.environ.items() if k != "SLIM_KERNEL_LAUNCHER"}
    env.update(LD_LIBRARY_PATH=str(fake_driver), PYTHONPATH=str(tests.parent / "python"),
               SLIM_KERNEL_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", _DRIVER_RUN, str(tests)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    major = r["major"]
    assert r["older_major"].startswith("KernelLoadError") and f"CUDA {major}." in r["older_major"]
    assert f"the driver supports CUDA {major - 1}.8" in r["older_major"]
    assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION" in r["refused_image"] and f"CUDA {major}.0" in r["refused_image"]
    assert "compiled by" in r["refused_image"]
    assert "CUDA_ERROR_NO_BINARY_FOR_GPU" in r["no_binary"]
    assert r["same_major"] == "loaded" and r["after_refusal"] == "loaded"
    # the driver asked before the first launch: what the function's registers and opt-in allow
    assert r["fits"] is None
    assert "cuFuncSetAttribute(8=307200)" in r["too_much_smem"] and "INVALID_VALUE" in r["too_much_smem"]
    assert r["too_many_threads"] == "needs 448 threads per CTA, fixture_axpby allows 384 at its registers"


def test_info_says_the_makers_kernels_decide_on_an_unmeasured_arch(monkeypatch):
    _fake(monkeypatch, "rtx-pro-6000")
    rows = info._picks(CUDA0)
    assert rows and {r["source"] for r in rows} == {"maker-first"}
    assert all(not r["pick"].startswith("jit") and "nothing measured on sm_120" in r["why"] and
               r["tune"].startswith("slim-kernel tune --") for r in rows)
    _fake(monkeypatch, "h100-pcie")  # a negative control: sm_90 is measured
    assert "maker-first" not in {r["source"] for r in info._picks(CUDA0)}
