"""The bmm_fp8 fast path's detector, self-check and fallback, against fake flashinfer releases (CPU).

The fakes (tests/_fake_flashinfer.py) are shaped like 0.7.2 (workspace helper imported into
gemm_base) and 0.7.4 (per-stream helper in utils, memoized runner); variants break one
internal each. Which code ran is read from the fake's call log.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest
import torch

from slim_kernel.backends import flashinfer_fastpath as fp

import _fake_flashinfer
from _inputs import bmm_fp8_inputs


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """fake(shape, **breakage) -> the imported fake flashinfer; everything undone afterwards."""
    for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delenv(fp.ENV, raising=False)
    fp.reset()

    def install(shape="0.7.4", **breakage):
        monkeypatch.syspath_prepend(str(_fake_flashinfer.write(tmp_path / "site", shape, **breakage)))
        return importlib.import_module("flashinfer")

    yield install
    for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
        del sys.modules[name]
    fp.reset()


def _gb():
    return sys.modules["flashinfer.gemm.gemm_base"]


def _tuner():
    return sys.modules["flashinfer.autotuner"].AutoTuner.get()


def _call(gen, tokens=4, k=32, n=16, out_dtype=torch.bfloat16, inputs=None):
    A, B, sa, sb = inputs or bmm_fp8_inputs(3, tokens, k, n, gen)
    out = torch.full((A.shape[0], A.shape[1], B.shape[2]), float("nan"), dtype=out_dtype)
    fp.bmm_fp8(out, A, B, sa, sb)
    return out, ((A.float() @ B.float()) * (sa * sb)).to(out_dtype)


def _runtime_warnings(record):
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("shape, workspace", [("0.7.2", "flashinfer.utils._get_cache_buf"),
                                              ("0.7.4", "flashinfer.utils._get_stream_cache_buf")])
def test_fast_path_found_verified_and_used(fake, gen, shape, workspace):
    fake(shape)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out, ref = _call(gen)
        assert torch.equal(out, ref)
        # first call of the signature: ours (heuristic) then the public call to compare with
        assert _gb().CALLS[0][0] == "heuristic" and "public" in _gb().CALLS
        state = fp.fast_path_state()
        assert (state["flashinfer"], state["bmm_fp8_fast_path"], state["reason"]) == (shape, "on", None)
        assert state["workspace"] == workspace
        _gb().CALLS.clear()
        asked = _tuner().asked
        for _ in range(3):
            out, ref = _call(gen)
            assert torch.equal(out, ref)
        assert [c[0] for c in _gb().CALLS] == ["heuristic"] * 3  # no public call, no checks
        assert _tuner().asked == asked  # the tuner's answer is cached
    assert not _runtime_warnings(record)


def test_per_stream_workspace_of_0_7_4_is_used(fake, gen):
    fi = fake("0.7.4")
    _call(gen)
    for stream in (1, 2, 0):
        fi.utils.CURRENT_STREAM[0] = stream
        _gb().CALLS.clear()
        _call(gen)
        expected = fi.utils._get_stream_cache_buf("bmm_fp8_workspace", _gb().DEFAULT_WORKSPACE_SIZE,
                                                  torch.device("cpu"))
        assert _gb().CALLS == [("heuristic", expected.data_ptr())]
    assert len({b.data_ptr() for b in fi.utils._stream_cache_buf.values()}) == 3


def test_tuning_config_is_found_by_type_not_name(fake, gen):
    fake("0.7.2", config_name="_FP8_GEMM_TUNING_CONFIG_RENAMED")
    out, ref = _call(gen)
    assert torch.equal(out, ref) and fp.fast_path_state()["bmm_fp8_fast_path"] == "on"


@pytest.mark.parametrize("breakage, reason", [
    ({"helper": "_get_workspace"}, "calls none of the workspace helpers"),
    ({"config_from_dict": True}, "names 0 TuningConfigs"),
    ({"drop_tuner_attr": "_file_configs"}, "AutoTuner has no _file_configs"),
])
def test_missing_internal_means_public_call_and_one_warning(fake, gen, breakage, reason):
    fake("0.7.2", **breakage)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for tokens in (1, 4, 4, 7):
            out, ref = _call(gen, tokens)
            assert torch.equal(out, ref)
    messages = _runtime_warnings(record)
    assert len(messages) == 1 and reason in messages[0], messages
    assert _gb().CALLS.count("public") == 4 and "checks" not in _gb().CALLS  # skip_check: the op validated
    state = fp.fast_path_state()
    assert state["bmm_fp8_fast_path"] == "off" and reason in state["reason"]


def test_self_check_turns_off_a_path_that_disagrees(fake, gen):
    fake("0.7.4")
    fp.decide()
    right = fp._direct.heuristic
    wrong_calls = []

    def wrong(A, B, out, sa, sb, ws):
        wrong_calls.append(1)
        right(A, B, out, sa, sb, ws)
        out.add_(1)

    fp._direct.heuristic = wrong
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        out, ref = _call(gen)
        assert torch.equal(out, ref)  # the public result, not ours
        _gb().CALLS.clear()
        for _ in range(3):
            out, ref = _call(gen)
            assert torch.equal(out, ref)
    messages = _runtime_warnings(record)
    assert len(messages) == 1 and "differs from flashinfer.bmm_fp8" in messages[0], messages
    assert wrong_calls == [1]
    assert _gb().CALLS.count("public") == 3
    assert fp.fast_path_state()["bmm_fp8_fast_path"] == "off"


def test_env_turns_it_off_without_a_warning(fake, gen, monkeypatch):
    monkeypatch.setenv(fp.ENV, "0")
    fake("0.7.4")
    assert fp.fast_path_state()["reason"] == f"{fp.ENV}=0"
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            out, ref = _call(gen)
            assert torch.equal(out, ref)
    assert not _runtime_warnings(record)
    assert _gb().CALLS.count("public") == 2 and fp._direct is None
    assert fp.fast_path_state()["bmm_fp8_fast_path"] == "off"


def test_capture_defers_the_check_to_the_first_eager_call(fake, gen, monkeypatch):
    fake("0.7.4")
    inputs = bmm_fp8_inputs(3, 4, 32, 16, gen)
    monkeypatch.setattr(fp, "_capturing", lambda: True)
    out, ref = _call(gen, inputs=inputs)
    assert torch.equal(out, ref)
    assert [c if isinstance(c, str) else c[0] for c in _gb().CALLS] == ["public", "heuristic"]  # public only
    assert fp.fast_path_state()["bmm_fp8_fast_path"] == "untested"
    monkeypatch.setattr(fp, "_capturing", lambda: False)
    _call(gen, inputs=inputs)  # eager: verified now
    assert fp.fast_path_state()["bmm_fp8_fast_path"] == "on"
    monkeypatch.setattr(fp, "_capturing", lambda: True)
    _gb().CALLS.clear()
    out, ref = _call(gen, inputs=inputs)
    assert torch.equal(out, ref) and [c[0] for c in _gb().CALLS] == ["heuristic"]  # verified: the fast path


def test_a_new_tuned_tactic_is_asked_for_and_verified(fake, gen):
    fake("0.7.2")
    inputs = bmm_fp8_inputs(3, 4, 32, 16, gen)
    _call(gen, inputs=inputs)
    _tuner().profiling_cache[("fp8_gemm", tuple(inputs[0].shape))] = 3  # as after flashinfer's autotune()
    _gb().CALLS.clear()
    out, ref = _call(gen, inputs=inputs)
    assert torch.equal(out, ref)
    assert _gb().CALLS.count(("algo", 3)) == 2 and "public" in _gb().CALLS  # ours + the public one, compared
    _gb().CALLS.clear()
    _call(gen, inputs=inputs)
    assert _gb().CALLS == [("algo", 3)]


def test_tuning_mode_asks_the_tuner_on_every_call(fake, gen):
    fake("0.7.4")
    _call(gen)
    _tuner().is_tuning_mode = True
    asked = _tuner().asked
    for _ in range(3):
        _call(gen)
    assert _tuner().asked == asked + 3
    _tuner().is_tuning_mode = False
    _call(gen)
    _call(gen)
    assert _tuner().asked == asked + 3  # the plan cached before tuning is valid again (same token)


def test_nan_results_compare_bit_for_bit(fake, gen):
    fake("0.7.4")
    A, B, sa, sb = bmm_fp8_inputs(2, 3, 32, 16, gen)
    A[0, 0, 0] = torch.tensor(float("nan")).to(A.dtype)  # a scalar fill of an fp8 tensor needs torch >= 2.5
    out, _ = _call(gen, inputs=(A, B, sa, sb))
    assert torch.isnan(out[0, 0]).all() and not torch.isnan(out[1]).any()
    assert fp.fast_path_state()["bmm_fp8_fast_path"] == "on"  # NaN == NaN bitwise: not a mismatch


def test_strided_operands_are_made_dense_once(fake, gen):
    fake("0.7.4")
    A, B, sa, sb = bmm_fp8_inputs(2, 8, 64, 16, gen)
    A_view, B_view = A[:, ::2, :32], B[:, :32, :]  # row-strided A; B with a batch stride of 64 * 16
    out, ref = _call(gen, inputs=(A_view, B_view, sa, sb))
    assert torch.equal(out, ref) and fp.fast_path_state()["bmm_fp8_fast_path"] == "on"


def test_public_call_without_skip_check_support(fake, gen):
    fake("0.7.2", helper="_get_workspace", decorated=False)
    with pytest.warns(RuntimeWarning, match="workspace helpers"):
        out, ref = _call(gen)
    assert torch.equal(out, ref) and _gb().CALLS[0] == "public"


def test_state_without_flashinfer_imports_nothing(monkeypatch):
    monkeypatch.setattr(fp.metadata, "version", _raise_not_found)
    monkeypatch.setattr(fp.importlib.util, "find_spec", lambda name: None)
    state = fp.fast_path_state(probe=True)
    assert state["flashinfer"] is None and state["bmm_fp8_fast_path"] == "off"
    assert state["reason"] == "flashinfer-python is not installed"


def _raise_not_found(name):
    raise fp.metadata.PackageNotFoundError(name)


def test_state_before_the_first_call_and_probe(fake):
    fake("0.7.4")
    for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
        del sys.modules[name]  # installed, not imported
    state = fp.fast_path_state()
    assert state == {"flashinfer": "0.7.4", "bmm_fp8_fast_path": "untested", "reason": fp._NOT_CHECKED,
                     "workspace": None}
    assert "flashinfer" not in sys.modules
    probed = fp.fast_path_state(probe=True)
    assert probed["bmm_fp8_fast_path"] == "untested" and probed["workspace"] == "flashinfer.utils._get_stream_cache_buf"
    assert sys.modules["flashinfer.autotuner"].AutoTuner._instance is None  # the probe built no tuner


def test_probe_reports_a_missing_internal(fake):
    fake("0.7.2", config_from_dict=True)
    state = fp.fast_path_state(probe=True)
    assert state["bmm_fp8_fast_path"] == "off" and "TuningConfigs" in state["reason"]


def test_router_and_tinygemm_factories_bind_kernel_and_pdl(fake, monkeypatch):
    # The flashinfer backend's prepare_<op> binds the kernel and the launch context once per plan.
    fake()
    from slim_kernel.backends import flashinfer as fib

    seen = []
    kernel = lambda x, w, out, launch_with_pdl: seen.append(("router", x.is_contiguous(), w.shape,  # noqa: E731
                                                             launch_with_pdl))
    monkeypatch.setattr(fib, "router_kernel", lambda e, k, dt: kernel if (e, k, dt) == (256, 16, torch.float32) else None)
    monkeypatch.setattr(fib, "tinygemm_bf16", lambda x, w, out, use_pdl: seen.append(("tinygemm", w.shape, use_pdl)))
    h, w, logits = torch.randn(8, 16)[::2], torch.randn(256, 16), torch.empty(4, 256)
    fib.prepare_router((logits, h, w), None, False)(logits, h, w)
    a, wt, out = torch.randn(4, 16), torch.randn(32, 16).t(), torch.empty(4, 32)
    fib.prepare_fused_a((out, a, wt), None, True)(out, a, wt)
    assert seen == [("router", True, (16, 256), False), ("tinygemm", (32, 16), True)]


def test_flashinfer_calls_run_with_the_tensors_device_current(fake, monkeypatch, fake_devices):
    # flashinfer launches on the current device: a plan for cuda:1 runs with cuda:1 current (slim_kernel/devices.py)
    fake()
    from types import SimpleNamespace

    from slim_kernel.backends import flashinfer as fib

    seen = []
    kernel = lambda x, w, out, launch_with_pdl: seen.append(("router", fake_devices["cur"]))  # noqa: E731
    monkeypatch.setattr(fib, "router_kernel", lambda e, k, dt: kernel)
    monkeypatch.setattr(fib, "tinygemm_bf16", lambda x, w, out, use_pdl: seen.append(("tinygemm", fake_devices["cur"])))
    on_1 = torch.device("cuda", 1)
    tensor = SimpleNamespace(contiguous=lambda: None, t=lambda: None, shape=(256, 16), dtype=torch.float32, device=on_1)
    fib.prepare_router((tensor, tensor, tensor), None, True)(tensor, tensor, tensor)
    fib.prepare_fused_a((tensor, tensor, tensor), None, False)(tensor, tensor, tensor)
    assert seen == [("router", 1), ("tinygemm", 1)] and fake_devices["cur"] == 0
