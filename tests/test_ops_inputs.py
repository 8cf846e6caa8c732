"""Hostile but fair op inputs (CPU): each gets a ValueError/TypeError naming the argument, or works.

Covers: scales of rank > 1, meta tensors (shape propagation in eager), a backend
that is not a string, sparse / nested / mkldnn layouts, and a flashinfer install whose import
raises something other than ImportError (a fallback with one warning, or a clear error when pinned).
"""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch

import slim_kernel as sk
from slim_kernel import registry
from slim_kernel.registry import BackendUnavailableError, KernelBackend

from _inputs import bmm_fp8_inputs, randn


def test_scales_must_be_one_element_of_rank_at_most_one(gen):
    A, B, sa, sb = bmm_fp8_inputs(2, 3, 32, 16, gen)
    for bad in (torch.ones(1, 1, 1, 1), torch.ones(1, 1), torch.ones(2)):
        with pytest.raises(ValueError, match="A_scale must be a one-element tensor of rank 0 or 1"):
            sk.bmm_fp8(A, B, bad, sb, torch.bfloat16)
        with pytest.raises(ValueError, match="B_scale must be a one-element tensor of rank 0 or 1"):
            sk.bmm_fp8(A, B, sa, bad, torch.bfloat16)
    out = sk.bmm_fp8(A, B, torch.tensor(float(sa)), sb.reshape(1), torch.bfloat16)  # rank 0 and 1 both fine
    assert out.shape == (2, 3, 16) and torch.isfinite(out.float()).all()


def test_meta_tensors_propagate_shapes_in_eager():
    meta = torch.device("meta")
    h = torch.empty(5, 64, dtype=torch.bfloat16, device=meta)
    w = torch.empty(8, 64, dtype=torch.bfloat16, device=meta)
    out = sk.dsv3_router_gemm(h, w, torch.float32)
    assert out.device.type == "meta" and out.shape == (5, 8) and out.dtype == torch.float32
    b = torch.empty(24, 64, dtype=torch.bfloat16, device=meta).t()
    assert sk.dsv3_fused_a_gemm(h, b).shape == (5, 24)
    A = torch.empty(2, 3, 32, dtype=torch.float8_e4m3fn, device=meta)
    B = torch.empty(2, 16, 32, dtype=torch.float8_e4m3fn, device=meta).transpose(-2, -1)
    s = torch.ones(1, device=meta)
    assert sk.bmm_fp8(A, B, s, s, torch.float16).shape == (2, 3, 16)
    with pytest.raises(ValueError, match="router_weights must be on hidden_states's device"):
        sk.dsv3_router_gemm(h, torch.empty(8, 64, dtype=torch.bfloat16), torch.float32)


@pytest.mark.parametrize("backend", [["torch"], 1, KernelBackend])
def test_backend_must_be_a_string(gen, backend):
    h, w = randn((2, 64), gen), randn((8, 64), gen)
    with pytest.raises(TypeError, match="backend must be a str"):
        sk.dsv3_router_gemm(h, w, backend=backend)


def _layouts(t: torch.Tensor):
    yield "sparse COO", t.to_sparse()
    yield "sparse CSR", t.to_sparse_csr()
    yield "nested", torch.nested.nested_tensor([t[0], t[1]])
    if torch.backends.mkldnn.is_available():
        yield "mkldnn", t.float().to_mkldnn()


def test_non_strided_layouts_are_refused_by_name(gen):
    h, w = randn((2, 64), gen), randn((8, 64), gen)
    for _, bad in _layouts(h.float()):
        with pytest.raises(ValueError, match="hidden_states must be a dense \\(strided\\) tensor"):
            sk.dsv3_router_gemm(bad, w)
    for _, bad in _layouts(w.float()):
        with pytest.raises(ValueError, match="router_weights must be a dense \\(strided\\) tensor"):
            sk.dsv3_router_gemm(h, bad)


@pytest.fixture
def broken_backend(monkeypatch, tmp_path):
    """An op whose flashinfer-like backend module raises ``exc`` when imported, ahead of the torch reference."""
    made = []
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(exc: BaseException):
        name = f"_slim_broken_{len(made)}"
        (tmp_path / f"{name}.py").write_text(f"raise {exc!r}\n")  # as a half-installed package would
        good = types.ModuleType(name + "_ok")
        good.torch = lambda out, x: out.copy_(x)
        monkeypatch.setitem(sys.modules, name + "_ok", good)
        op = f"broken_op_{id(made)}_{len(made)}"
        cpu = frozenset({"cpu"})
        registry.register(
            registry.KernelSpec(op, KernelBackend.FLASHINFER, f"{name}:impl", device_types=cpu),
            registry.KernelSpec(op, KernelBackend.TORCH, f"{name}_ok:torch", device_types=cpu))
        made.append(op)
        return op

    yield make
    for op in made:
        registry._REGISTRY.pop(op, None)
        for key in [k for k in registry._BROKEN if k[0] == op]:
            registry._BROKEN.pop(key)


@pytest.mark.parametrize("exc", [AttributeError("module has no attribute 'gemm'"), TypeError("bad stub"),
                                 SystemExit(3), RuntimeError("CUDA mismatch")], ids=lambda e: type(e).__name__)
def test_a_backend_that_fails_to_import_falls_back_once(broken_backend, exc):
    op = broken_backend(exc)
    x = torch.randn(3, 4)
    with pytest.warns(RuntimeWarning, match=f"unavailable: {type(exc).__name__}"):
        sel = registry.select(op, torch.device("cpu"), (torch.empty(3, 4), x))
    assert sel.spec.backend is KernelBackend.TORCH
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # remembered: no second warning
        assert registry.select(op, torch.device("cpu"), (torch.empty(3, 4), x)).spec.backend is KernelBackend.TORCH
    with pytest.raises(BackendUnavailableError, match=f"'flashinfer' cannot serve this call: unavailable: {type(exc).__name__}"):
        registry.select(op, torch.device("cpu"), (torch.empty(3, 4), x), "flashinfer")
