"""Backend selection: priority, eligibility, pinning, env overrides, load failures."""

import sys
import types
import warnings

import pytest
import torch

import slim_kernel
import slim_kernel.ops  # noqa: F401  (registers the ops)
from slim_kernel import registry
from slim_kernel.registry import BackendUnavailableError, KernelBackend, KernelSpec

CPU = torch.device("cpu")


@pytest.fixture
def fake_op(monkeypatch):
    """A throwaway op with three backends whose implementations live in a fake module."""
    mod = types.ModuleType("_slim_fake_backends")
    calls = []
    mod.jit = lambda out, x: calls.append("jit")
    mod.torch = lambda out, x: calls.append("torch")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    op = "fake_op_" + str(id(calls))
    small_only = lambda out, x: None if x.shape[0] <= 16 else f"M={x.shape[0]} > 16"  # noqa: E731
    registry.register(
        KernelSpec(op, KernelBackend.JIT, f"{mod.__name__}:jit", device_types=frozenset({"cpu"}), check=small_only),
        KernelSpec(op, KernelBackend.FLASHINFER, f"{mod.__name__}:missing", device_types=frozenset({"cpu"})),
        KernelSpec(op, KernelBackend.TORCH, f"{mod.__name__}:torch", device_types=frozenset({"cpu"})),
    )
    yield op, calls
    registry._REGISTRY.pop(op)
    for key in [k for k in registry._BROKEN if k[0] == op]:
        registry._BROKEN.pop(key)


def _pick(op, m, backend=None):
    x = torch.empty(m, 4)
    return registry.select(op, CPU, (None, x), backend).spec.backend.value


def test_first_eligible_backend_wins(fake_op):
    op, _ = fake_op
    assert _pick(op, 8) == "jit"
    with pytest.warns(RuntimeWarning, match="flashinfer"):
        assert _pick(op, 17) == "torch"  # jit ineligible; flashinfer fails to load


def test_pinned_backend_and_reason(fake_op):
    op, _ = fake_op
    assert _pick(op, 8, "torch") == "torch"
    with pytest.raises(BackendUnavailableError, match=r"'jit' cannot serve this call: M=17 > 16"):
        _pick(op, 17, "jit")


def test_env_override(fake_op, monkeypatch):
    op, _ = fake_op
    monkeypatch.setenv(registry.env_var(op), "TORCH")
    assert _pick(op, 8) == "torch"
    assert _pick(op, 8, "jit") == "jit"  # an explicit backend= beats the environment
    monkeypatch.setenv(registry.env_var(op), "bogus")
    with pytest.raises(ValueError, match=registry.env_var(op)):
        _pick(op, 8)


def test_load_failure_falls_back_with_one_warning(fake_op):
    op, _ = fake_op
    registry._REGISTRY[op].insert(0, registry._REGISTRY[op].pop(1))  # flashinfer (broken target) first
    with pytest.warns(RuntimeWarning, match="flashinfer"):
        assert _pick(op, 8) == "jit"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _pick(op, 8) == "jit"  # remembered as broken: no second warning
    with pytest.raises(BackendUnavailableError, match="unavailable: .*:missing does not exist"):
        _pick(op, 8, "flashinfer")


def test_duplicate_registration_rejected(fake_op):
    op, _ = fake_op
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(KernelSpec(op, KernelBackend.TORCH, "x:y"))


def test_real_ops_on_cpu_use_torch_and_explain_others():
    for op in ("bmm_fp8", "dsv3_router_gemm", "dsv3_fused_a_gemm"):
        rows = registry.explain(op, CPU)
        assert rows[-1][0].backend is KernelBackend.TORCH and rows[-1][1] is None
        for spec, reason in rows[:-1]:
            assert reason, f"{op}/{spec.backend.value} should be ineligible on CPU"
    with pytest.raises(BackendUnavailableError, match="flashinfer"):
        slim_kernel.dsv3_router_gemm(torch.randn(2, 64).bfloat16(), torch.randn(8, 64).bfloat16(),
                                     backend="flashinfer")


def test_import_is_lazy():
    import subprocess
    code = ("import sys, slim_kernel; assert 'torch' not in sys.modules; "
            "slim_kernel.dsv3_router_gemm; assert 'torch' in sys.modules; "
            "assert 'flashinfer' not in sys.modules; "
            "assert 'slim_kernel._native' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_routing_table_ranks_eligible_backends(fake_op, monkeypatch):
    """A measured point reorders the eligible backends; unmeasured ones keep priority order."""
    from slim_kernel import routing

    op, _ = fake_op
    tab = routing.parse({"schema": 1, "arch": "sm_90", "entries": [
        {"op": op, "shape": {"k": 4}, "m": 2, "flashinfer": "0.7.4", "pdl": True,
         "us": {"jit:a": 5.0, "torch": 3.0}}]}, "test")[0]
    monkeypatch.setattr(registry, "decision", lambda o, d, args, pdl=None: tab.lookup(
        o, {"k": args[1].shape[1]}, args[1].shape[0], (("flashinfer", "0.7.4"),), True if pdl is None else pdl))
    sel = registry.select(op, CPU, (None, torch.empty(2, 4)))
    assert sel.spec.backend is KernelBackend.TORCH and "torch 3.00 us" in sel.why
    assert _pick(op, 3) == "torch"  # M=3: the nearest measured M (2) decides
    assert _pick(op, 11) == "jit"  # nothing measured within 8 of M=11: priority order
    assert _pick(op, 2, "jit") == "jit"  # a pin beats the table


def test_routing_table_nearest_version_and_m_never_another_shape():
    from slim_kernel import routing

    tab = routing.parse({"schema": 1, "arch": "sm_90", "entries": [
        {"op": "o", "shape": {"n": 2112, "k": 7168}, "m": 1, "flashinfer": v, "pdl": True, "us": {"torch": t}}
        for v, t in (("0.7.2.post1", 1.0), ("0.7.4", 2.0))]}, "test")[0]
    exact = tab.lookup("o", {"n": 2112, "k": 7168}, 1, (("flashinfer", "0.7.4"),), True)
    assert exact.match == "exact" and exact.point.best("torch") == (None, 2.0)
    old = tab.lookup("o", {"n": 2112, "k": 7168}, 1, (("flashinfer", "0.7.0"),), True)
    assert old.point.version("flashinfer") == "0.7.2.post1" and "0.7.2.post1 measurements" in old.match
    # another shape is never borrowed (routing.lookup estimates it instead: estimate.py)
    assert tab.lookup("o", {"n": 2000, "k": 7168}, 1, (("flashinfer", "not installed"),), True) is None
    near_m = tab.lookup("o", {"n": 2112, "k": 7168}, 5, (("flashinfer", "0.7.4"),), True)
    assert near_m.point.m == 1 and "nearest measured M=1" in near_m.match
    assert tab.lookup("o", {"n": 2112, "k": 7168}, 10, (("flashinfer", "0.7.4"),), True) is None
    assert tab.lookup("o", {"n": 2112, "k": 7168}, 1, (("flashinfer", "0.7.4"),), False) is None
    with pytest.raises(ValueError, match="schema"):
        routing.parse({"schema": 99, "arch": "x", "entries": []}, "test")[0]


def test_bad_backend_argument_types():
    h, W = torch.randn(2, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    with pytest.raises(TypeError, match="backend must be a str"):
        slim_kernel.dsv3_router_gemm(h, W, backend=["torch"])
    with pytest.raises(ValueError, match="backend must be one of"):
        slim_kernel.dsv3_router_gemm(h, W, backend="cuda")


def test_the_launch_context_picks_the_table_points(monkeypatch, fake_op):
    # pdl: true points (after a PDL-aware producer) and pdl: false points (after a plain one) can
    # name different winners; select(pdl=...) looks up the context's points.
    from slim_kernel import routing

    op, _ = fake_op
    tab = routing.parse({"schema": 1, "arch": "sm_90", "entries": [
        {"op": op, "shape": {"k": 4}, "m": 2, "flashinfer": "0.7.4", "pdl": True, "us": {"jit:a": 2.0, "torch": 3.0}},
        {"op": op, "shape": {"k": 4}, "m": 2, "flashinfer": "0.7.4", "pdl": False, "us": {"jit:a": 5.0, "torch": 3.0}},
    ]}, "test")[0]
    monkeypatch.setattr(registry, "decision", lambda o, d, args, pdl=None: tab.lookup(
        o, {"k": args[1].shape[1]}, args[1].shape[0], (("flashinfer", "0.7.4"),), True if pdl is None else pdl))
    args = (None, torch.empty(2, 4))
    assert registry.select(op, CPU, args, pdl=True).spec.backend is KernelBackend.JIT
    assert registry.select(op, CPU, args, pdl=False).spec.backend is KernelBackend.TORCH
    assert registry.select(op, CPU, args).spec.backend is KernelBackend.JIT  # None: the knob (on)
