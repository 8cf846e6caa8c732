"""No JIT at serve time (CPU): SLIM_KERNEL_JIT=cache-only|cache-or-fallback never compiles; a miss
raises, or leaves the call to the next backend with one warning; `precompile --model` fills exactly
what the routing can pick and those entries serve (launched against the fake driver) with zero
compiles; `info` reports whether every routed instance is cached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from jit_fixtures import instances as fx

import slim_kernel
import slim_kernel.ops  # noqa: F401  (registers the ops' backends)
from slim_kernel import cli, devices, knobs, models, registry
from slim_kernel.backends import jit as jb
from slim_kernel.jit import cache, compiler, routed
from slim_kernel.jit.arch import limits
from slim_kernel.jit.catalogue import all_instances
from slim_kernel.names import FUSED_A, ROUTER

HERE = Path(__file__).resolve().parent
SITE = Path(slim_kernel.__file__).resolve().parents[1]  # the slim_kernel these tests import


@pytest.mark.parametrize("value,mode", [(None, "compile"), ("", "compile"), ("compile", "compile"),
                                        (" Cache-Only ", "cache-only"), ("cache-or-fallback", "cache-or-fallback")])
def test_mode_values(monkeypatch, value, mode):
    if value is None:
        monkeypatch.delenv(knobs.ENV_JIT, raising=False)
    else:
        monkeypatch.setenv(knobs.ENV_JIT, value)
    assert knobs.jit_mode() == mode
    knobs.check_env()


def test_a_bad_mode_names_the_variable(monkeypatch):
    monkeypatch.setenv(knobs.ENV_JIT, "never")
    with pytest.raises(ValueError, match=r"SLIM_KERNEL_JIT must be one of compile, cache-only, cache-or-fallback, "
                                         r"got 'never'"):
        knobs.check_env()  # what planning a call signature runs


@pytest.mark.parametrize("mode", ["cache-only", "cache-or-fallback"])
def test_a_miss_raises_and_compiles_nothing(cache_dir, monkeypatch, mode):
    monkeypatch.setenv(knobs.ENV_JIT, mode)
    monkeypatch.setattr(cache, "_compile", lambda *a: pytest.fail("compiled under " + mode))
    with pytest.raises(cache.CacheMissError) as info:
        cache.get_entry(fx.axpby(), "9.0a")
    text = str(info.value)
    assert "fixture_axpby[BIAS=0] for sm_90a is not in the cache" in text and f"SLIM_KERNEL_JIT={mode}" in text
    assert "slim-kernel precompile --arch sm_90a" in text
    assert not cache_dir.exists()  # not even the directories


def test_what_precompile_stored_serves_without_compiling(cache_dir, monkeypatch):
    monkeypatch.setenv(knobs.ENV_JIT, "cache-only")
    stored = cache.load_or_compile(fx.axpby(), "9.0a")  # what precompile does: compiles whatever the mode
    assert stored.compiled and stored.path is not None
    cache.clear_memory()
    monkeypatch.setattr(cache, "_compile", lambda *a: pytest.fail("compiled a cached kernel"))
    entry = cache.get_entry(fx.axpby(), "9.0a")
    assert not entry.compiled and entry.cubin == stored.cubin


def _router_call():
    out = torch.empty(2, 256, dtype=torch.float32)
    return out, torch.randn(2, 7168).bfloat16(), torch.randn(256, 7168).bfloat16()


@pytest.mark.parametrize("mode,error", [("cache-only", cache.CacheMissError), ("cache-or-fallback", registry.CallNotServed),
                                        ("compile", cache.CacheMissError)])
def test_the_jit_backend_declines_only_when_asked_to(monkeypatch, mode, error):
    """A miss in the JIT backend's prepare: the cache's error as it is, or (cache-or-fallback) the
    registry's CallNotServed, which hands the call to the next backend."""
    monkeypatch.setenv(knobs.ENV_JIT, mode)

    def miss(instance, device_index):
        raise cache.CacheMissError(f"{instance.label} is not in the cache")

    monkeypatch.setattr("slim_kernel.jit.get_kernel", miss)
    monkeypatch.setattr(jb.devices, "index", lambda device: 0)  # CPU stand-ins for a call on cuda:0
    monkeypatch.setitem(jb._LIMITS, 0, limits("sm_90"))  # ... an H100's limits
    with pytest.raises(error, match="dsv3_router_gemm_kernel.* is not in the cache"):
        jb.prepare_router(_router_call(), "narrow_r2kc", True)


def _decline(args, variant, pdl):
    raise registry.CallNotServed("cannot serve this call without compiling: a kernel is not in the cache")


def _serve(output, *inputs):
    output.fill_(7.0)


@pytest.fixture
def two_backends(monkeypatch):
    """A test op served by a declining prepare target, then by a plain one (both on the CPU)."""
    op = "cache_only_test_op"
    cpu = frozenset({"cpu"})
    monkeypatch.setitem(registry._REGISTRY, op, [
        registry.KernelSpec(op, registry.KernelBackend.JIT, f"{__name__}:_decline", device_types=cpu, prepare=True),
        registry.KernelSpec(op, registry.KernelBackend.TORCH, f"{__name__}:_serve", device_types=cpu)])
    return op


def test_a_declined_call_goes_to_the_next_backend_with_one_warning(two_backends):
    out = torch.zeros(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sel = registry.select(two_backends, torch.device("cpu"), (out, out))
    assert sel.spec.backend == registry.KernelBackend.TORCH
    sel.fn(out, out)
    assert out.tolist() == [7.0] * 3
    assert [str(w.message) for w in caught] == [
        "slim_kernel: cache_only_test_op backend 'jit' cannot serve this call without compiling: a kernel is not "
        "in the cache; falling back"]


def test_a_pinned_backend_that_declines_raises(two_backends):
    with pytest.raises(registry.BackendUnavailableError, match="without compiling"):
        registry.select(two_backends, torch.device("cpu"), (torch.zeros(1), torch.zeros(1)), backend="jit")


# ---- what the routing can pick ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_routed_variant_is_what_the_registry_binds(monkeypatch, name):
    """routed.routed_variant answers as the registry's decision does for a call of that shape."""
    from slim_kernel import routing

    h200 = routing.Device("NVIDIA H200", 132, "sm_90")
    monkeypatch.setattr(registry, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(devices, "routing_device", lambda device: h200)
    dev = torch.device("cuda", 0)
    meta = torch.device("meta")
    for shape in models.model_shapes(name):
        for m in (1, 3, 6, 9, 16, 24, 40, 64):
            act = torch.empty(m, shape.k, dtype=torch.bfloat16, device=meta)
            out = torch.empty(m, shape.n, dtype=getattr(torch, shape.out), device=meta)
            w = torch.empty(shape.n, shape.k, dtype=torch.bfloat16, device=meta)
            args = (out, act, w if shape.op == ROUTER else w.t())
            for pdl in (True, False):
                dec = registry.decision(shape.op, dev, args, pdl)
                best = dec.point.best("jit") if dec else None
                assert routed.routed_variant(shape.op, shape.key(), m, h200, pdl) == (best[0] if best else None)


def test_routed_instances_of_the_tuned_shapes_are_catalogued():
    shapes = models.model_shapes("deepseek-v3")
    pairs = routed.routed_instances("sm_90a", shapes)
    assert {op for op, _ in pairs} == {ROUTER, FUSED_A}
    assert set(pairs) <= set(all_instances())  # K=7168, E=256: the tuned shape's instances
    assert len(pairs) < len(all_instances()) / 4
    # no table for sm_100a: the fallback configuration serves every M
    other = routed.routed_instances("sm_100a", shapes)
    assert {dict(i.defines)["SK_FAMILY"] for _, i in other} == {0}


def test_precompile_without_a_gpu_covers_every_shipped_device_of_the_arch(monkeypatch):
    """An image built on a CPU machine serves whichever measured Hopper it lands on: the routed instances are
    the union of what each shipped group (the H200's, the H100's) routes, and each group alone misses some."""
    devs = routed.target_devices("sm_90a")
    assert {d.name for d in devs} >= {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    assert routed.target_device("sm_90a") == devs[0]
    shapes = models.model_shapes("deepseek-v3")
    union = set(routed.routed_instances("sm_90a", shapes))
    per_device = []
    for dev in devs:
        monkeypatch.setattr(routed, "target_devices", lambda arch, dev=dev: [dev])
        per_device.append(set(routed.routed_instances("sm_90a", shapes)))
    assert set().union(*per_device) == union
    assert all(one < union for one in per_device)  # neither device's picks alone cover the other's


@pytest.mark.parametrize("argv,message", [
    (["--model", "llama"], "unknown model 'llama' (known: deepseek-v3, kimi-k2"),
    (["--router", "256"], "--router wants E,K[,out]"),
    (["--router", "256,7168,fp16"], "--router output dtype must be float32 or bfloat16, got 'fp16'"),
    (["--router", "256,7165"], "K a positive multiple of 8"),
    (["--fused-a", "2112,x"], "--fused-a wants N,K (e.g. 2112,7168), got '2112,x'"),
    (["--fused-a", "0,7168"], "need N/E >= 1"),
])
def test_bad_shapes_are_exit_2_naming_the_option(cache_dir, capsys, argv, message):
    assert cli.main(["precompile", "--arch", "9.0a", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def stub_compiles(cache_dir, monkeypatch):
    """Every compile returns one real sm_90a cubin (a fixture kernel's): the cache stores and checks
    it like any other, in a fraction of the time."""
    cubin = cache.load_or_compile(fx.axpby(), "9.0a").cubin
    cache.clear_memory()
    count = {"n": 0}

    def compile_stub(self, instance, arch):
        count["n"] += 1
        return compiler.CompileResult(cubin, "", 0.0, None)

    for cls in (compiler.NvrtcCompiler, compiler.NvccCompiler):
        monkeypatch.setattr(cls, "compile", compile_stub)
    return count


def test_precompile_for_a_model_fills_exactly_the_routed_instances(stub_compiles, capsys):
    assert cli.main(["precompile", "--arch", "9.0a", "--model", "kimi-k2", "-j", "1"]) == 0
    routed_set = routed.routed_instances("sm_90a", models.model_shapes("kimi-k2"))
    out = capsys.readouterr().out
    assert out.startswith(f"precompile: {len(routed_set)} of {len(routed_set)} verified") and "routed for router E=384 K=7168 float32" in out
    assert stub_compiles["n"] == len(routed_set) == sum(cache.cached_counts().values()) - 1  # + the stub's own
    assert all(cache.is_cached(inst, "sm_90a") for _, inst in routed_set)
    cov = routed.cache_coverage("sm_90a", models.model_shapes("kimi-k2"))
    assert cov["routed"] == cov["cached"] == len(routed_set) and cov["missing"] == []
    cov = routed.cache_coverage("sm_90a", models.model_shapes("deepseek-v3"))  # E=256 needs other instances
    assert cov["missing"] and cov["cached"] + len(cov["missing"]) == cov["routed"]


_SERVE = textwrap.dedent("""
    import ctypes, json, sys
    sys.path.insert(0, sys.argv[1])
    from slim_kernel import models
    from slim_kernel.jit import cache, catalogue, get_kernel, routed, runtime
    runtime.arch_for_device = lambda index: "sm_90a"   # no torch.cuda here
    fake = ctypes.CDLL("libcuda.so.1")
    fake.fake_set_nparams(9)
    launched, missing = 0, None
    for op, inst in routed.routed_instances("sm_90a", models.model_shapes("kimi-k2")):
        get_kernel(inst, 0, launcher="python").launch((1, 1, 1), (128, 1, 1), (1, 2, 3, 4, 5, 6, 7, 8, 9), stream=0)
        launched += 1
    try:
        unrouted = next(i for op, i in catalogue.all_instances() if dict(i.defines).get("SK_OUT_BF16") == 1)
        get_kernel(unrouted, 0, launcher="python")  # kimi-k2's router has float32 logits
    except cache.CacheMissError as exc:
        missing = str(exc)
    print(json.dumps({"launched": launched, "launches": fake.fake_launch_count(), "missing": missing}))
""")


def test_precompiled_instances_serve_with_zero_compiles(stub_compiles, capsys, fake_driver, tmp_path):
    """A server-like process: SLIM_KERNEL_JIT=cache-only, every routed instance of the model loaded and
    launched (the fake driver), no compile (the JIT trace stays empty); an instance the model never
    routes to is a CacheMissError."""
    assert cli.main(["precompile", "--arch", "9.0a", "--model", "kimi-k2", "-j", "1"]) == 0
    capsys.readouterr()
    trace = tmp_path / "trace.jsonl"
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake_driver), SLIM_KERNEL_JIT="cache-only",
               SLIM_KERNEL_JIT_TRACE=str(trace), PYTHONPATH=str(SITE))
    proc = subprocess.run([sys.executable, "-c", _SERVE, str(HERE)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    routed_count = len(routed.routed_instances("sm_90a", models.model_shapes("kimi-k2")))
    assert report["launched"] == report["launches"] == routed_count
    assert "is not in the cache" in report["missing"] and "SLIM_KERNEL_JIT=cache-only" in report["missing"]
    assert not trace.exists() or trace.read_text() == ""
