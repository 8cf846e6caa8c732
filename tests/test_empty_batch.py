"""An empty batch (M = 0, e.g. an idle data-parallel rank running the MoE gate on no tokens): every op
returns an empty, correctly shaped output of the right dtype, selects no backend and launches nothing,
in eager calls, under torch.compile(fullgraph=True), through torch.library.opcheck and (GPU) inside a
captured CUDA graph. Invalid shapes around it still raise naming the argument."""

import pytest
import torch

import slim_kernel as sk
from slim_kernel import registry

from _inputs import bmm_fp8_inputs, randn

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _inputs(gen, device="cpu"):
    """Per op: (function, args, kwargs, output shape, output dtype, output keyword) at M = 0; K, N, E drawn."""
    k = 64 * int(torch.randint(1, 5, (), generator=gen))
    e, n, b = (int(x) for x in torch.randint(1, 40, (3,), generator=gen))
    h, W = randn((3, k), gen, device=device)[:0], randn((e, k), gen, device=device)
    a, w = randn((2, k), gen, device=device)[:0], randn((n, k), gen, device=device)
    A, B, sa, sb = bmm_fp8_inputs(b, 1, k, 16, gen, device=device)
    return {
        "router": (sk.dsv3_router_gemm, (h, W, torch.float32), {}, (0, e), torch.float32, "output"),
        "router_bf16": (sk.dsv3_router_gemm, (h, W), {}, (0, e), torch.bfloat16, "output"),
        "fused": (sk.dsv3_fused_a_gemm, (a, w.t()), {}, (0, n), torch.bfloat16, "output"),
        "bmm": (sk.bmm_fp8, (A[:, :0], B, sa, sb, torch.float16), {}, (b, 0, 16), torch.float16, "out"),
    }


@pytest.fixture
def no_selection(monkeypatch):
    """Any backend selection fails the test: an empty output must launch nothing."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a backend was selected for an empty output: {args[:2]}")

    monkeypatch.setattr(registry, "select", refuse)


@pytest.mark.parametrize("case", ["router", "router_bf16", "fused", "bmm"])
def test_empty_batch_eager(gen, case, no_selection):
    fn, args, kwargs, shape, dtype, out_kw = _inputs(gen)[case]
    for _ in range(2):  # the first call plans, the second runs the cached plan
        got = fn(*args, **kwargs)
        assert got.shape == shape and got.dtype == dtype and got.device.type == "cpu"
    given = torch.empty(shape, dtype=dtype)
    assert fn(*args, **kwargs, **{out_kw: given}) is given
    for pin in ("torch", "jit"):  # nothing to serve, so no pin can fail
        assert fn(*args, **kwargs, backend=pin).shape == shape


@pytest.mark.parametrize("case", ["router", "fused", "bmm"])
def test_empty_batch_still_checks_its_arguments(gen, case):
    fn, args, kwargs, shape, dtype, out_kw = _inputs(gen)[case]
    wrong_n = (*shape[:-1], shape[-1] + 1)
    with pytest.raises(ValueError, match=rf"\b{out_kw}\b"):
        fn(*args, **kwargs, **{out_kw: torch.empty(wrong_n, dtype=dtype)})
    with pytest.raises(ValueError, match=rf"\b{out_kw}\b"):  # M = 1 output for M = 0 input
        fn(*args, **kwargs, **{out_kw: torch.empty((*shape[:-2], 1, shape[-1]), dtype=dtype)})
    with pytest.raises(ValueError, match=r"\bbackend\b"):
        fn(*args, **kwargs, backend="cutlass")


def test_empty_batch_other_empty_dims_still_raise(gen):
    h = randn((0, 64), gen)
    with pytest.raises(ValueError, match=r"\bhidden_states\b"):
        sk.dsv3_router_gemm(randn((0, 0), gen), randn((8, 0), gen))
    with pytest.raises(ValueError, match=r"\brouter_weights\b"):
        sk.dsv3_router_gemm(h, randn((0, 64), gen))
    with pytest.raises(ValueError, match=r"\bmat_b\b"):
        sk.dsv3_fused_a_gemm(h, randn((0, 64), gen).t())
    with pytest.raises(ValueError, match=r"\bmat_b\b"):
        sk.dsv3_fused_a_gemm(h, randn((8, 32), gen).t())
    A, B, sa, sb = bmm_fp8_inputs(2, 1, 32, 16, gen)
    with pytest.raises(ValueError, match=r"\bA\b"):  # an empty batch count is not an empty batch of tokens
        sk.bmm_fp8(A[:0, :0], B[:0], sa, sb, torch.bfloat16)


def test_empty_batch_opcheck(gen):
    cases = _inputs(gen)
    h, W, _ = cases["router"][1]
    a, wt = cases["fused"][1]
    A, B, sa, sb, _ = cases["bmm"][1]
    checks = [
        (torch.ops.slim_kernel.dsv3_router_gemm.default, (torch.empty(0, W.shape[0]), h, W, None), None),
        (torch.ops.slim_kernel.dsv3_fused_a_gemm.default, (torch.empty(0, wt.shape[1], dtype=torch.bfloat16), a, wt,
                                                           "torch"), None),
        # torch's SchemaCheckMode compares fp8 inputs with ops CPU lacks for fp8 (as in test_ops_cpu.py)
        (torch.ops.slim_kernel.bmm_fp8.default, (torch.empty(A.shape[0], 0, 16, dtype=torch.float16), A, B, sa, sb,
                                                 None), ("test_autograd_registration", "test_faketensor",
                                                         "test_aot_dispatch_dynamic")),
    ]
    for op, args, utils in checks:
        kwargs = {"test_utils": utils} if utils else {}
        torch.library.opcheck(op, args, **kwargs)


class _AllOps(torch.nn.Module):
    def forward(self, h, W, a, wt, A, B, sa, sb, out):
        r = sk.dsv3_router_gemm(h, W, torch.float32)
        f = sk.dsv3_fused_a_gemm(a, wt)
        q = sk.bmm_fp8(A, B, sa, sb, torch.float16)
        given = sk.dsv3_router_gemm(h, W, torch.bfloat16, out)
        return r, f, q, given


def test_empty_batch_torch_compile_fullgraph(gen, no_selection):
    torch._dynamo.reset()
    cases = _inputs(gen)
    h, W, _ = cases["router"][1]
    a, wt = cases["fused"][1]
    A, B, sa, sb, _ = cases["bmm"][1]
    out = torch.empty(0, W.shape[0], dtype=torch.bfloat16)
    args = (h, W, a, wt, A, B, sa, sb, out)
    eager = _AllOps()(*args)
    compiled = torch.compile(_AllOps(), fullgraph=True, backend="inductor")(*args)
    for e, c in zip(eager, compiled):
        assert c.shape == e.shape and c.dtype == e.dtype and c.numel() == 0
    assert [tuple(t.shape) for t in eager] == [(0, W.shape[0]), (0, wt.shape[1]), (A.shape[0], 0, 16),
                                               (0, W.shape[0])]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["router", "router_bf16", "fused", "bmm"])
def test_empty_batch_captured_in_a_cuda_graph(gen, case, no_selection):
    """Eager, then inside a captured graph, then replayed: empty outputs, no kernel in the graph."""
    fn, args, kwargs, shape, dtype, out_kw = _inputs(gen, "cuda")[case]
    given = torch.empty(shape, dtype=dtype, device="cuda")
    assert fn(*args, **kwargs, **{out_kw: given}) is given
    assert fn(*args, **kwargs).shape == shape
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(*args, **kwargs)
        fn(*args, **kwargs, **{out_kw: given})
    graph.replay()
    torch.cuda.synchronize()
    assert captured.shape == shape and captured.dtype == dtype and captured.is_cuda
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn(*args, **kwargs, **{out_kw: given})
        torch.cuda.synchronize()
    assert not [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.gpu
def test_empty_batch_torch_compile_on_cuda(gen, no_selection):
    torch._dynamo.reset()
    cases = _inputs(gen, "cuda")
    h, W, _ = cases["router"][1]
    a, wt = cases["fused"][1]
    A, B, sa, sb, _ = cases["bmm"][1]
    out = torch.empty(0, W.shape[0], dtype=torch.bfloat16, device="cuda")
    got = torch.compile(_AllOps(), fullgraph=True)(h, W, a, wt, A, B, sa, sb, out)
    assert [tuple(t.shape) for t in got] == [(0, W.shape[0]), (0, wt.shape[1]), (A.shape[0], 0, 16), (0, W.shape[0])]
