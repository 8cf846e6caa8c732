"""The cached eager path: same results as the dispatcher path, and it steps aside when it must."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import slim_kernel as sk
from slim_kernel import registry

from _inputs import bmm_fp8_inputs, randn


def _router_op():
    import importlib

    return importlib.import_module("slim_kernel.ops.dsv3_router_gemm")._op


@pytest.fixture
def counted(monkeypatch):
    """Counts calls that go through the registered op (the dispatcher path)."""
    op = _router_op()
    calls = []
    real = op.overload
    monkeypatch.setattr(op, "overload", lambda *a: (calls.append(1), real(*a))[1])
    return calls


def test_plain_eager_skips_the_dispatcher_and_matches_it(gen, counted):
    h, W = randn((3, 64), gen), randn((8, 64), gen)
    fast = sk.dsv3_router_gemm(h, W, torch.float32)
    assert counted == []
    out = torch.full((3, 8), float("nan"))
    torch.ops.slim_kernel.dsv3_router_gemm.default(out, h, W)
    assert torch.equal(fast, out)


def test_autograd_inputs_go_through_the_dispatcher(gen, counted):
    h, W = randn((3, 64), gen).requires_grad_(), randn((8, 64), gen)
    sk.dsv3_router_gemm(h, W, torch.float32)
    assert counted == [1]
    with torch.no_grad():
        sk.dsv3_router_gemm(h, W, torch.float32)
    assert counted == [1]


def test_fake_tensors_get_shapes_from_the_fake_kernel(gen):
    with FakeTensorMode() as mode:
        h = mode.from_tensor(randn((5, 64), gen))
        W = mode.from_tensor(randn((8, 64), gen))
        out = sk.dsv3_router_gemm(h, W, torch.float32)
        assert out.shape == (5, 8) and out.dtype == torch.float32
        A, B, sa, sb = (mode.from_tensor(t) for t in bmm_fp8_inputs(2, 3, 32, 16, gen))
        assert sk.bmm_fp8(A, B, sa, sb, torch.float16).shape == (2, 3, 16)


def test_cached_signature_still_validates_new_inputs(gen):
    h, W = randn((4, 64), gen), randn((8, 64), gen)
    sk.dsv3_router_gemm(h, W, torch.float32)
    with pytest.raises(ValueError, match="router_weights"):
        sk.dsv3_router_gemm(h, randn((8, 32), gen), torch.float32)
    with pytest.raises(ValueError, match="out_dtype"):
        sk.dsv3_router_gemm(h, W, torch.float16)
    with pytest.raises(ValueError, match="output"):
        sk.dsv3_router_gemm(h, W, torch.float32, torch.empty(8, 4).t())


def test_signature_includes_alignment_and_env(gen, monkeypatch):
    op = _router_op()
    op._plans.clear()
    base = randn((4, 72), gen)
    W = randn((8, 64), gen)
    sk.dsv3_router_gemm(base[:, :64], W, torch.float32)
    sk.dsv3_router_gemm(base[:, 1:65], W, torch.float32)  # same shape/strides, 2-byte offset
    assert len(op._plans) == 2
    monkeypatch.setenv(registry.env_var("dsv3_router_gemm"), "flashinfer")
    with pytest.raises(registry.BackendUnavailableError, match="flashinfer"):
        sk.dsv3_router_gemm(base[:, :64], W, torch.float32)


def test_bmm_fp8_schema_mutates_only_out_and_leaves_inputs_intact(gen):
    # opcheck's test_schema cannot run on fp8 inputs (SchemaCheckMode lacks fp8 ops): check by hand.
    schema = torch.ops.slim_kernel.bmm_fp8.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["output"]
    args = bmm_fp8_inputs(2, 3, 32, 16, gen)
    before = [t.clone() for t in args]
    torch.ops.slim_kernel.bmm_fp8.default(torch.empty(2, 3, 16, dtype=torch.bfloat16), *args)
    for b, a in zip(before, args):
        assert torch.equal(b.view(torch.uint8) if b.element_size() == 1 else b,
                           a.view(torch.uint8) if a.element_size() == 1 else a)
