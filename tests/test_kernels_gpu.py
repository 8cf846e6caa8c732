"""Our JIT kernels for dsv3_router_gemm and dsv3_fused_a_gemm, on the GPU (``-m gpu``, SM >= 9.0).

Every configuration the routing tables may pick (``jit/catalogue.py`` VARIANTS) against a
float64 reference with poisoned outputs: M 1..16 every value (and 17..64 where the kernel serves
it), every model shape of slim_kernel/models.py and shapes off that list (other E, N and K),
fp32/bf16 out, PDL on, off and auto; then
bit-identical repeats, CUDA-graph capture, row-strided and column-sliced activations,
activations written by the kernel right before the GEMM, activations written late by a producer
that lets the GEMM launch early (PDL), tails and odd shapes.
"""

from __future__ import annotations

import pytest
import torch
from jit_fixtures import instances as fx

import slim_kernel
from slim_kernel.backends import jit as jb
from slim_kernel.jit import catalogue as cat
from slim_kernel.jit.runtime import get_kernel
from slim_kernel.names import FUSED_A, ROUTER
from slim_kernel.registry import BackendUnavailableError

FP32_TOL = 1e-5
BF16_TOL = 5e-3
SMALL_M = list(range(1, 17))
LARGE_M = [17, 24, 32, 33, 48, 64]


def _cuda_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda_sm90(), reason="needs a CUDA device with SM >= 9.0")]


def _rand(*shape, gen=None):
    # Normal values; never zero-filled. bf16 inputs, so the float64 reference sees the same values.
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)


def _check(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert not torch.isnan(out).any(), f"{what}: output has NaNs (an element was not written)"
    tol = FP32_TOL if out.dtype == torch.float32 else BF16_TOL
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"


def _router(x, w, out_dtype, backend="jit"):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), device="cuda", dtype=out_dtype)
    slim_kernel.dsv3_router_gemm(x, w, out_dtype, output=out, backend=backend)
    return out


def _fused_a(a, b, backend="jit"):
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=torch.bfloat16)
    slim_kernel.dsv3_fused_a_gemm(a, b, output=out, backend=backend)
    return out


def _gemm_into(op, x, w_nk, out):
    if op == ROUTER:
        slim_kernel.dsv3_router_gemm(x, w_nk, out.dtype, output=out, backend="jit")
    else:
        slim_kernel.dsv3_fused_a_gemm(x, w_nk.t(), output=out, backend="jit")


def _ref(act, w_nk):
    return act.double() @ w_nk.double().t()


@pytest.fixture
def use_variant():
    """use_variant(op, name): every M of op served by that catalogue configuration."""
    touched = []

    def use(op, name):
        touched.append(op)
        jb.set_config(op, ((cat.MAX_M, cat.VARIANTS[op][name]),))
        return cat.VARIANTS[op][name]

    yield use
    for op in touched:
        jb.set_config(op, None)


def _ms(cfg, shape) -> list[int]:
    """The M of the test's list that ``cfg`` serves at (N, K) ``shape``."""
    return [m for m in SMALL_M + LARGE_M if m <= cfg.max_m(shape)]


ROUTER_VARIANTS = list(cat.VARIANTS[ROUTER])
FUSED_A_VARIANTS = list(cat.VARIANTS[FUSED_A])


# ---------------------------------------------------------------- the matrix, per configuration

# the models' shapes (E 128/256/384/896 at K 7168, 256 at 6144), then shapes no model names
ROUTER_SHAPES = [(128, 7168), (256, 7168), (384, 7168), (896, 7168), (256, 6144), (160, 5120), (384, 1024),
                 (256, 4096)]
FUSED_A_SHAPES = [(2112, 7168), (3648, 7168), (2624, 6144), (1536, 5120), (2112, 1024), (2624, 4096)]


@pytest.fixture(scope="module", autouse=True)
def _matrix_compiled_in_parallel():
    """Every instance the matrix runs, compiled first in parallel, as tune does (narrow configurations compile one
    per K and M: serially, on first call, their K-fitted bodies at the off-list shapes take minutes)."""
    from slim_kernel import backend, models

    shapes = [models.router(e, k, dt) for e, k in ROUTER_SHAPES for dt in cat.OUT_DTYPES[ROUTER]]
    shapes += [models.fused_a(n, k) for n, k in FUSED_A_SHAPES]
    calls = [(s.op, m, s.n, s.k, s.out) for s in shapes for m in SMALL_M + LARGE_M]
    for load in backend.get("jit").first_use_builds(calls, torch.device("cuda", torch.cuda.current_device())).values():
        load()


@pytest.mark.parametrize("variant", ROUTER_VARIANTS)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("e,k", ROUTER_SHAPES)
def test_router_matrix(e, k, out_dtype, variant, pdl, use_variant):
    cfg = use_variant(ROUTER, variant)
    gen = torch.Generator(device="cuda").manual_seed(e * 100003 + k)
    w = _rand(e, k, gen=gen)
    for m in _ms(cfg, (e, k)):
        x = _rand(m, k, gen=gen)
        _check(_router(x, w, out_dtype), _ref(x, w), f"router[{variant}] M={m} E={e} K={k} {out_dtype}")


@pytest.mark.parametrize("variant", FUSED_A_VARIANTS)
@pytest.mark.parametrize("n,k", FUSED_A_SHAPES)
def test_fused_a_matrix(n, k, variant, pdl, use_variant):
    cfg = use_variant(FUSED_A, variant)
    gen = torch.Generator(device="cuda").manual_seed(n * 100003 + k)
    w = _rand(n, k, gen=gen)  # the (N, K) weight; the op takes its transpose (K, N) column-major
    for m in _ms(cfg, (n, k)):
        a = _rand(m, k, gen=gen)
        _check(_fused_a(a, w.t()), _ref(a, w), f"fused_a[{variant}] M={m} N={n} K={k}")


ALL_VARIANTS = [(ROUTER, v) for v in ROUTER_VARIANTS] + [(FUSED_A, v) for v in FUSED_A_VARIANTS]
# the property tests' N: a router E that every narrow row count divides (840 = lcm(1..8)), so each
# configuration with K = 7168 straight-line instances runs them
PROPERTY_N = {ROUTER: 840, FUSED_A: 2112}


def _call(op, x, w_nk):
    return _router(x, w_nk, torch.float32) if op == ROUTER else _fused_a(x, w_nk.t())


# ---------------------------------------------------------------- properties, per configuration

@pytest.mark.parametrize("op,variant", ALL_VARIANTS)
def test_repeated_runs_bit_identical(op, variant, pdl, use_variant):
    cfg = use_variant(op, variant)
    gen = torch.Generator(device="cuda").manual_seed(7)
    w = _rand(PROPERTY_N[op], 7168, gen=gen)
    for m in {1, 5, 8, cfg.max_m(tuple(w.shape))} & set(_ms(cfg, tuple(w.shape))):
        x = _rand(m, 7168, gen=gen)
        first = _call(op, x, w)
        for _ in range(10):
            assert torch.equal(_call(op, x, w), first), f"{op}[{variant}] M={m}: results differ between runs"


@pytest.mark.parametrize("op,variant", ALL_VARIANTS)
def test_cuda_graph_capture_and_producer_written_activations(op, variant, pdl, use_variant):
    # The graph replays (producer kernel writing x) -> GEMM on one stream: with PDL the GEMM's weight
    # prologue overlaps the producer, and it must still read the x the producer wrote.
    cfg = use_variant(op, variant)
    gen = torch.Generator(device="cuda").manual_seed(11)
    w = _rand(PROPERTY_N[op], 7168, gen=gen)
    m = min(7, cfg.max_m(tuple(w.shape)))
    src, x = _rand(m, 7168, gen=gen), torch.empty(m, 7168, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, w.shape[0], device="cuda", dtype=torch.float32 if op == ROUTER else torch.bfloat16)

    def step():
        torch.mul(src, 2.0, out=x)  # the kernel that writes the activation, right before the GEMM
        _gemm_into(op, x, w, out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up (compile, plan) outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):  # new inputs each replay, poisoned outputs
        src.copy_(_rand(m, 7168, gen=gen))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(out, _ref(src * 2.0, w), f"graph {op}[{variant}] M={m}")


@pytest.mark.parametrize("pdl", [True], indirect=True)
@pytest.mark.parametrize("op,variant", ALL_VARIANTS)
def test_pdl_reads_the_activation_after_an_early_triggering_producer(op, variant, pdl, use_variant):
    # The producer lets the GEMM launch at once and writes x 1 ms later (past the host's launch of the
    # warmed-up GEMM, eager on a side stream): a kernel that loads x before its griddepcontrol.wait reads
    # the old x (ptxas moves .nc loads across the wait: ptx.cuh).
    cfg = use_variant(op, variant)
    gen = torch.Generator(device="cuda").manual_seed(12)
    w = _rand(PROPERTY_N[op], 7168, gen=gen)
    writer = get_kernel(fx.early_writer(), torch.cuda.current_device())
    side = torch.cuda.Stream()  # a stream of its own, as in a captured graph (not the legacy default stream)
    for m in [m for m in (1, 4, 8, 11, 16, 32) if m <= cfg.max_m(tuple(w.shape))]:
        src, x = _rand(m, 7168, gen=gen), _rand(m, 7168, gen=gen)  # x: the old activation
        out = torch.full((m, w.shape[0]), float("nan"), device="cuda",
                         dtype=torch.float32 if op == ROUTER else torch.bfloat16)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _gemm_into(op, x, w, out)  # compiled and planned before the pair below
            out.fill_(float("nan"))
            writer.launch((4, 1, 1), (256, 1, 1), (src.data_ptr(), x.data_ptr(), x.numel(), 1_000_000),
                          stream=side.cuda_stream)
            _gemm_into(op, x, w, out)
        torch.cuda.synchronize()
        _check(out, _ref(src, w), f"early-triggering producer {op}[{variant}] M={m}")


@pytest.mark.parametrize("op,variant", ALL_VARIANTS)
def test_row_strided_and_column_sliced_views(op, variant, pdl, use_variant):
    cfg = use_variant(op, variant)
    gen = torch.Generator(device="cuda").manual_seed(200)
    k = 4096
    w = _rand(256 if op == ROUTER else 2112, k, gen=gen)
    for m in {1, 3, cfg.max_m(tuple(w.shape)), 12} & set(_ms(cfg, tuple(w.shape))):
        buf = _rand(m + 3, k + 136, gen=gen)
        for x in (buf[2:2 + m, :k], buf[1:1 + m, 64:64 + k]):  # row stride k + 136; a 128-byte column offset
            assert m == 1 or not x.is_contiguous()
            _check(_call(op, x, w), _ref(x, w), f"strided {op}[{variant}] M={m} offset {x.storage_offset()}")


# ---------------------------------------------------------------- the default path, shapes, windows

@pytest.mark.parametrize("m,n,k", [(1, 1, 8), (3, 7, 40), (9, 24, 1000), (16, 100, 7176), (16, 16, 264),
                                   (2, 520, 4104), (40, 130, 1032)])
def test_tails_and_odd_shapes(m, n, k, pdl):
    # K not a multiple of 32 or 64 (zero-filled tail), N/E not multiples of 16 (partial row tiles).
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 11 + k)
    x, w = _rand(m, k, gen=gen), _rand(n, k, gen=gen)
    for dt in (torch.float32, torch.bfloat16):
        _check(_router(x, w, dt), _ref(x, w), f"router M={m} E={n} K={k} {dt}")
    _check(_fused_a(x, w.t()), _ref(x, w), f"fused_a M={m} N={n} K={k}")


@pytest.mark.parametrize("op,variant", ALL_VARIANTS)
def test_tails_per_configuration(op, variant, use_variant):
    cfg = use_variant(op, variant)
    gen = torch.Generator(device="cuda").manual_seed(5)
    for m, n, k in [(1, 7, 40), (3, 24, 1000), (8, 100, 7176), (2, 520, 4104)]:
        if m <= cfg.max_m((n, k)):
            x, w = _rand(m, k, gen=gen), _rand(n, k, gen=gen)
            _check(_call(op, x, w), _ref(x, w), f"{op}[{variant}] M={m} N={n} K={k}")


def test_default_path_serves_every_m(pdl):
    gen = torch.Generator(device="cuda").manual_seed(3)
    w, wf = _rand(256, 7168, gen=gen), _rand(2112, 7168, gen=gen)
    for m in SMALL_M + LARGE_M:
        x = _rand(m, 7168, gen=gen)
        _check(_router(x, w, torch.float32, backend=None), _ref(x, w), f"default router M={m}")
        _check(_fused_a(x, wf.t(), backend=None), _ref(x, wf), f"default fused_a M={m}")


def test_outside_window_falls_back():
    x, w = _rand(cat.MAX_M + 1, 1024), _rand(256, 1024)
    with pytest.raises(BackendUnavailableError):
        _router(x, w, torch.float32)
    _check(_router(x, w, torch.float32, backend=None), _ref(x, w), "router fallback above the JIT window")
    odd = _rand(4, 1025)[:, 1:]  # not 16-byte aligned rows: jit refuses, the default path is right
    with pytest.raises(BackendUnavailableError):
        _router(odd, w[:, :1024], torch.float32)
    _check(_router(odd, w[:, :1024], torch.float32, backend=None), _ref(odd, w[:, :1024]), "fallback odd view")
