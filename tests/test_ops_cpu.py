"""The three public ops on CPU: results vs float64, bad inputs, opcheck, torch.compile."""

import pytest
import torch

import slim_kernel as sk

from _inputs import TOL, bmm_fp8_inputs, bmm_fp8_ref, fused_a_ref, randn, rel_err, router_ref

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


# --- results ---------------------------------------------------------------------------------

@pytest.mark.parametrize("a_dtype", FP8)
@pytest.mark.parametrize("b_dtype", FP8)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b,m,k,n", [(1, 1, 16, 8), (3, 5, 48, 24), (2, 17, 33, 7)])
def test_bmm_fp8_matches_float64(gen, a_dtype, b_dtype, out_dtype, b, m, k, n):
    A, B, sa, sb = bmm_fp8_inputs(b, m, k, n, gen, a_dtype, b_dtype)
    out = torch.full((b, m, n), float("nan"), dtype=out_dtype)
    res = sk.bmm_fp8(A, B, sa, sb, out_dtype, out)
    assert res is out
    assert rel_err(out, bmm_fp8_ref(A, B, sa, sb)) <= TOL[out_dtype]


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,k,e", [(1, 64, 8), (7, 96, 13), (16, 7168, 256), (33, 40, 5)])
def test_router_matches_float64(gen, out_dtype, m, k, e):
    h, W = randn((m, k), gen), randn((e, k), gen)
    out = sk.dsv3_router_gemm(h, W, out_dtype)
    assert out.shape == (m, e) and out.dtype == out_dtype
    assert rel_err(out, router_ref(h, W)) <= TOL[out_dtype]


@pytest.mark.parametrize("m,k,n", [(1, 64, 16), (5, 256, 48), (17, 100, 7)])
def test_fused_a_matches_float64(gen, m, k, n):
    a, w = randn((m, k), gen), randn((n, k), gen)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    assert sk.dsv3_fused_a_gemm(a, w.t(), out) is out
    assert rel_err(out, fused_a_ref(a, w.t())) <= TOL[torch.bfloat16]


def test_strided_views_are_correct(gen):
    big = randn((9, 300), gen)
    h = big[1:8:2, 10:138]  # row-strided and offset view
    W = randn((12, 128), gen)
    assert rel_err(sk.dsv3_router_gemm(h, W, torch.float32), router_ref(h, W)) <= 1e-5
    a = randn((6, 200), gen)[:, :128]
    w = randn((20, 128), gen)
    assert rel_err(sk.dsv3_fused_a_gemm(a, w.t()), fused_a_ref(a, w.t())) <= 5e-3
    A, B, sa, sb = bmm_fp8_inputs(4, 3, 32, 8, gen)
    A2, B2 = A[::2], B[1::2]
    assert rel_err(sk.bmm_fp8(A2, B2, sa, sb, torch.bfloat16), bmm_fp8_ref(A2, B2, sa, sb)) <= 5e-3


# --- bad inputs: the right error type, naming the argument -------------------------------------

def _router_ok(gen):
    return dict(hidden_states=randn((4, 64), gen), router_weights=randn((8, 64), gen))


def _fused_ok(gen):
    return dict(mat_a=randn((4, 64), gen), mat_b=randn((16, 64), gen).t())


def _bmm_ok(gen):
    A, B, sa, sb = bmm_fp8_inputs(2, 3, 32, 16, gen)
    return dict(A=A, B=B, A_scale=sa, B_scale=sb, dtype=torch.bfloat16)


BAD = [
    # (op, builder, changes, error type, name in message)
    ("router", _router_ok, {"hidden_states": "x"}, TypeError, "hidden_states"),
    ("router", _router_ok, {"hidden_states": torch.randn(4, 64)}, ValueError, "hidden_states"),
    ("router", _router_ok, {"hidden_states": torch.randn(2, 4, 64).bfloat16()}, ValueError, "hidden_states"),
    ("router", _router_ok, {"router_weights": torch.randn(8, 32).bfloat16()}, ValueError, "router_weights"),
    ("router", _router_ok, {"router_weights": torch.randn(8, 64).half()}, ValueError, "router_weights"),
    ("router", _router_ok, {"hidden_states": torch.empty(4, 0, dtype=torch.bfloat16),
                            "router_weights": torch.empty(8, 0, dtype=torch.bfloat16)}, ValueError, "hidden_states"),
    ("router", _router_ok, {"out_dtype": torch.float16}, ValueError, "out_dtype"),
    ("router", _router_ok, {"out_dtype": "float32"}, TypeError, "out_dtype"),
    ("router", _router_ok, {"output": torch.empty(4, 9)}, ValueError, "output"),
    ("router", _router_ok, {"output": torch.empty(4, 8, dtype=torch.bfloat16), "out_dtype": torch.float32},
     ValueError, "output"),
    ("router", _router_ok, {"output": torch.empty(8, 4).t()}, ValueError, "output"),
    ("router", _router_ok, {"router_weights": torch.randn(8, 64, device="meta").bfloat16()}, ValueError, "router_weights"),
    ("router", _router_ok, {"backend": "cutlass"}, ValueError, "backend"),
    ("fused", _fused_ok, {"mat_a": torch.randn(4, 64)}, ValueError, "mat_a"),
    ("fused", _fused_ok, {"mat_b": torch.randn(64, 16).bfloat16()}, ValueError, "mat_b"),  # row-major
    ("fused", _fused_ok, {"mat_b": torch.randn(16, 32).bfloat16().t()}, ValueError, "mat_b"),  # K mismatch
    ("fused", _fused_ok, {"mat_a": torch.empty(4, 0, dtype=torch.bfloat16),
                          "mat_b": torch.empty(16, 0, dtype=torch.bfloat16).t()}, ValueError, "mat_a"),
    ("fused", _fused_ok, {"mat_b": torch.randn(16, 64, 1).bfloat16()}, ValueError, "mat_b"),
    ("fused", _fused_ok, {"output": torch.empty(4, 16)}, ValueError, "output"),
    ("fused", _fused_ok, {"output": torch.empty(4, 17, dtype=torch.bfloat16)}, ValueError, "output"),
    ("bmm", _bmm_ok, {"A": torch.randn(2, 3, 32)}, ValueError, "A"),
    ("bmm", _bmm_ok, {"A": torch.randn(3, 32).to(torch.float8_e4m3fn)}, ValueError, "A"),
    ("bmm", _bmm_ok, {"B": torch.randn(2, 32, 16).to(torch.float8_e4m3fn)}, ValueError, "B"),  # row-major B
    ("bmm", _bmm_ok, {"B": torch.randn(2, 16, 31).to(torch.float8_e4m3fn).transpose(1, 2)}, ValueError, "B"),
    ("bmm", _bmm_ok, {"B": torch.randn(3, 16, 32).to(torch.float8_e4m3fn).transpose(1, 2)}, ValueError, "B"),
    ("bmm", _bmm_ok, {"A_scale": torch.ones(2)}, ValueError, "A_scale"),
    ("bmm", _bmm_ok, {"B_scale": torch.ones(1, dtype=torch.float64)}, ValueError, "B_scale"),
    ("bmm", _bmm_ok, {"B_scale": 1.0}, TypeError, "B_scale"),
    ("bmm", _bmm_ok, {"A_scale": torch.ones(1, device="meta")}, ValueError, "A_scale"),
    ("bmm", _bmm_ok, {"dtype": torch.float32}, ValueError, "dtype"),
    ("bmm", _bmm_ok, {"out": torch.empty(2, 3, 17, dtype=torch.bfloat16)}, ValueError, "out"),
    ("bmm", _bmm_ok, {"out": torch.empty(2, 3, 16, dtype=torch.float16)}, ValueError, "out"),
    ("bmm", _bmm_ok, {"A": torch.empty(0, 3, 32).to(torch.float8_e4m3fn),
                      "B": torch.empty(0, 16, 32).to(torch.float8_e4m3fn).transpose(1, 2)}, ValueError, "A"),
    ("bmm", _bmm_ok, {"A": torch.empty(2, 3, 0).to(torch.float8_e4m3fn),
                      "B": torch.empty(2, 16, 0).to(torch.float8_e4m3fn).transpose(1, 2)}, ValueError, "A"),
]
OPS = {"router": sk.dsv3_router_gemm, "fused": sk.dsv3_fused_a_gemm, "bmm": sk.bmm_fp8}


@pytest.mark.parametrize("op,build,change,exc,name", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input_raises_naming_argument(gen, op, build, change, exc, name):
    kwargs = {**build(gen), **change}
    with pytest.raises(exc, match=rf"\b{name}\b"):
        OPS[op](**kwargs)


def test_output_is_not_written_on_bad_input(gen):
    out = torch.full((4, 8), 7.0)
    with pytest.raises(ValueError):
        sk.dsv3_router_gemm(randn((4, 64), gen), randn((8, 32), gen), torch.float32, out)
    assert torch.all(out == 7.0)


# --- torch.library integration ---------------------------------------------------------------

ALL_OPCHECK = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _opcheck_cases(gen):
    A, B, sa, sb = bmm_fp8_inputs(2, 3, 32, 16, gen)
    yield torch.ops.slim_kernel.bmm_fp8.default, (torch.empty(2, 3, 16, dtype=torch.bfloat16), A, B, sa, sb, None)
    h, W = randn((5, 64), gen), randn((8, 64), gen)
    yield torch.ops.slim_kernel.dsv3_router_gemm.default, (torch.empty(5, 8), h, W, "torch")
    a, w = randn((3, 64), gen), randn((16, 64), gen)
    yield torch.ops.slim_kernel.dsv3_fused_a_gemm.default, (torch.empty(3, 16, dtype=torch.bfloat16), a, w.t(), None)


def test_opcheck_all_ops(gen):
    cases = list(_opcheck_cases(gen))
    assert len(cases) == 3
    for op, args in cases:
        utils = ALL_OPCHECK
        if args[1].dtype in FP8:
            # torch's SchemaCheckMode compares fp8 inputs with ops CPU lacks for fp8
            # ("mul_cpu_reduced_float", on CUDA too): test_dispatch.py checks bmm_fp8's schema by hand.
            utils = tuple(u for u in ALL_OPCHECK if u != "test_schema")
        torch.library.opcheck(op, args, test_utils=utils)


class _AllOps(torch.nn.Module):
    def forward(self, h, W, a, wt, A, B, sa, sb):
        r = sk.dsv3_router_gemm(h, W, torch.float32)
        f = sk.dsv3_fused_a_gemm(a, wt)
        q = sk.bmm_fp8(A, B, sa, sb, torch.bfloat16)
        return r.sum() + f.float().sum() + q.float().sum(), r, f, q


def test_torch_compile_fullgraph_matches_eager(gen):
    torch._dynamo.reset()
    args = (randn((4, 64), gen), randn((8, 64), gen), randn((3, 64), gen), randn((16, 64), gen).t(),
            *bmm_fp8_inputs(2, 3, 32, 16, gen))
    model = _AllOps()
    eager = model(*args)
    explanation = torch._dynamo.explain(model)(*args)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(model, fullgraph=True, backend="inductor")
    got = compiled(*args)
    torch.testing.assert_close(got[0], eager[0])  # inductor may reorder the scalar sum
    for e, g in zip(eager[1:], got[1:]):
        torch.testing.assert_close(g, e, rtol=0, atol=0)  # the ops themselves: bit-identical


# --- the torch reference's CUDA path, on meta tensors (any torch >= the floor) -------------------

@pytest.mark.parametrize("out_dtype_api", [False, True])
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16])
def test_torch_reference_cuda_path_calls_exist_on_this_torch(monkeypatch, out_dtype_api, out):
    """The calls the CUDA branch makes (torch.mm/bmm with out_dtype= where torch has it, fp32 operands
    where it does not) run on this torch: meta tensors stand in for CUDA ones."""
    from slim_kernel.backends import torch_ref

    if out_dtype_api and not torch_ref.MM_OUT_DTYPE:
        pytest.skip(f"torch {torch.__version__} has no torch.mm(out_dtype=): the reference does not use it")
    monkeypatch.setattr(torch_ref, "MM_OUT_DTYPE", out_dtype_api)
    monkeypatch.setattr(torch_ref, "_bf16_on_cuda", lambda a, b: a.dtype == b.dtype == torch.bfloat16)
    meta = torch.device("meta")
    h, w = (torch.empty(s, dtype=torch.bfloat16, device=meta) for s in ((5, 64), (24, 64)))
    o = torch.empty(5, 24, dtype=out, device=meta)
    torch_ref.dsv3_router_gemm(o, h, w)
    torch_ref.dsv3_fused_a_gemm(o, h, w.t())
    assert torch_ref._mm_fp32(h.unsqueeze(0), w.t().unsqueeze(0)).dtype == torch.float32  # the bmm form
    assert torch_ref.MM_OUT_DTYPE is out_dtype_api


def test_out_dtype_detection_matches_torch():
    from slim_kernel.backends import torch_ref

    assert torch_ref.MM_OUT_DTYPE == ("dtype" in torch.ops.aten.mm.overloads())
