"""The PDL knob (SLIM_KERNEL_PDL=auto|1|0) and the per-launch decision of slim_kernel/pdl.py (CPU)."""

import pytest
import torch

from slim_kernel import knobs
from slim_kernel import pdl as _pdl


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    old = knobs.pdl_setting()
    yield
    monkeypatch.delenv(knobs.ENV_PDL, raising=False)
    knobs.load_env()
    knobs.set_pdl(old)


@pytest.mark.parametrize("value,setting", [(None, "auto"), ("", "auto"), ("auto", "auto"), (" AUTO ", "auto"),
                                           ("1", True), ("on", True), ("0", False), ("off", False)])
def test_environment_values(monkeypatch, value, setting):
    if value is None:
        monkeypatch.delenv(knobs.ENV_PDL, raising=False)
    else:
        monkeypatch.setenv(knobs.ENV_PDL, value)
    knobs.load_env()
    knobs.check_env()
    assert knobs.pdl_setting() == setting
    assert knobs.pdl() == (setting is not False) and knobs.pdl_auto() == (setting == "auto")


def test_a_bad_value_names_the_variable_and_auto(monkeypatch):
    monkeypatch.setenv(knobs.ENV_PDL, "maybe")
    knobs.load_env()
    with pytest.raises(ValueError, match=r"SLIM_KERNEL_PDL must be one of .* \(or auto\)"):
        knobs.check_env()


def test_set_pdl_round_trips_and_invalidates_plans():
    for setting in ("auto", True, False, "auto"):
        gen = knobs.STATE.generation
        knobs.set_pdl(setting)
        assert knobs.pdl_setting() == setting and knobs.STATE.generation == gen + 1


def test_launch_decision(monkeypatch):
    capturing = {"now": False}
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing["now"])
    seen = []
    monkeypatch.setattr(_pdl, "follows_pdl_launch", lambda stream: seen.append(stream) or answer["v"])
    answer = {"v": False}
    knobs.set_pdl("auto")
    assert _pdl.launch_pdl(7) is True and not seen  # eager: the knob, no driver query
    capturing["now"] = True
    assert _pdl.launch_pdl(7) is False and seen == [7]  # captured after a plain producer
    answer["v"] = True
    assert _pdl.launch_pdl(7) is True  # after a PDL-aware producer
    answer["v"] = None
    assert _pdl.launch_pdl(7) is True  # the driver cannot say: keep the knob
    knobs.set_pdl(True)
    answer["v"] = False
    assert _pdl.launch_pdl(7) is True  # forced on
    knobs.set_pdl(False)
    assert _pdl.launch_pdl(7) is False


def test_no_driver_means_no_answer():
    assert _pdl.follows_pdl_launch(0) is None  # no GPU here: the binding's error is not an answer


def test_an_eager_plan_also_plans_and_warms_the_captured_context(monkeypatch):
    # Under auto an eager call (context True) plans the captured-after-plain context (False) too,
    # and runs it once, so a capture never has to select, compile or load a backend.
    import importlib

    from slim_kernel import registry
    from slim_kernel.ops import _dispatch

    mod = importlib.import_module("slim_kernel.ops.dsv3_router_gemm")  # the module, not the function

    knobs.set_pdl("auto")
    op = mod._op
    monkeypatch.setattr(op, "_pdl", lambda inputs: True)
    contexts = []
    real_select = registry.select

    def select(name, device, args, backend=None, pdl=None):
        sel = real_select(name, device, args, backend, pdl)
        fn = sel.fn

        def counted(*a):
            contexts.append(pdl)
            return fn(*a)
        return registry.Selection(sel.spec, counted, sel.why)

    monkeypatch.setattr(registry, "select", select)
    monkeypatch.setattr(_dispatch.registry, "select", select)
    op._plans.clear()
    h, w = torch.randn(3, 64).bfloat16(), torch.randn(8, 64).bfloat16()
    first = mod.dsv3_router_gemm(h, w, torch.float32)
    assert contexts == [False, True]  # the other context warmed first, this one wrote the result
    assert {k[2][1] for k in op._plans} == {True, False}  # key: (backend, env pin, (extra, context), ...)
    again = mod.dsv3_router_gemm(h, w, torch.float32)
    assert contexts == [False, True, True] and torch.equal(first, again)
    knobs.set_pdl(False)  # forced: one context, nothing extra
    contexts.clear()
    mod.dsv3_router_gemm(h, w, torch.float32)
    assert contexts == [True]  # _pdl is patched to True; no second plan when the knob is not auto
