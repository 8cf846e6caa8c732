"""Every flashinfer entry point slim-kernel calls, on a GPU with the installed flashinfer.

bmm_fp8: the fast path is on for this flashinfer, bit-identical to
``flashinfer.bmm_fp8(backend="cublas")`` on the MLA shapes (its first, self-checked call and
its plain fast-path calls), uses flashinfer's own workspace buffers, turns itself off when it
disagrees, and under graph capture serves unverified signatures by the public call. The
router kernels (every mm_M1_16_K{K}_N{E}[_bf16] it ships) and tinygemm_bf16 through the ops with
backend="flashinfer" vs float64, outputs poisoned with NaN.
"""

from __future__ import annotations

import importlib.util
from importlib import metadata

import pytest
import torch

import slim_kernel as sk
from slim_kernel import registry
from slim_kernel.backends import flashinfer_fastpath as fp
from slim_kernel.names import FLASHINFER_FUSED_A_PROGRAMS, FLASHINFER_ROUTERS

from _inputs import TOL, bmm_fp8_inputs, bmm_fp8_ref, fused_a_ref, randn, rel_err, router_ref

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_FLASHINFER, reason="flashinfer not installed")]
MIXES = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]  # cuBLASLt has no e5m2 x e5m2


@pytest.fixture(autouse=True)
def fresh_fast_path():
    """Each test decides, detects and verifies from scratch, and leaves a fresh state behind."""
    fp.reset()
    yield
    fp.reset()


def _eligible(op, *args):
    """Skip unless flashinfer can serve this call on this device (the spec's SM window, shapes)."""
    for spec, reason in registry.explain(op, args[1].device, args):
        if spec.backend.value == "flashinfer" and reason is not None:
            pytest.skip(f"flashinfer cannot serve {op} here: {reason}")


def _bits(t):
    return t.view(torch.int16)


def _bmm(A, B, sa, sb, out_dtype):
    out = torch.full((A.shape[0], A.shape[1], B.shape[2]), float("nan"), dtype=out_dtype, device=A.device)
    _eligible("bmm_fp8", out, A, B, sa, sb)
    return sk.bmm_fp8(A, B, sa, sb, out_dtype, out, backend="flashinfer")


def test_fast_path_is_on_for_the_installed_flashinfer(gen):
    A, B, sa, sb = bmm_fp8_inputs(16, 4, 128, 512, gen, device="cuda")
    _bmm(A, B, sa, sb, torch.bfloat16)
    state = fp.fast_path_state()
    assert state["flashinfer"] == metadata.version("flashinfer-python")
    assert (state["bmm_fp8_fast_path"], state["reason"]) == ("on", None), state
    assert fp._serve is fp._direct
    assert fp._direct.heuristic is not None  # tactic -1 found in the runner's forward: no runner detour


@pytest.mark.parametrize("kn", [(128, 512), (512, 128)])
@pytest.mark.parametrize("tokens", [1, 16, 64, 512])
@pytest.mark.parametrize("dtypes", MIXES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_bmm_fp8_bit_identical_to_flashinfer_cublas(gen, kn, tokens, dtypes, out_dtype):
    import flashinfer

    k, n = kn
    A, B, sa, sb = bmm_fp8_inputs(16, tokens, k, n, gen, *dtypes, device="cuda")
    first = _bmm(A, B, sa, sb, out_dtype)  # the self-checked call
    again = _bmm(A, B, sa, sb, out_dtype)  # the fast path alone
    expected = flashinfer.bmm_fp8(A, B, sa, sb, out_dtype, backend="cublas")
    assert torch.equal(_bits(first), _bits(expected)) and torch.equal(_bits(again), _bits(expected))
    assert fp.fast_path_state()["bmm_fp8_fast_path"] == "on"  # so `again` really was the fast path
    assert rel_err(again, bmm_fp8_ref(A, B, sa, sb)) <= 2e-2  # fp8 inputs, 16-bit output


def test_workspace_is_flashinfers_own_per_stream_buffer(gen):
    import flashinfer
    import flashinfer.utils as fu

    A, B, sa, sb = bmm_fp8_inputs(16, 16, 512, 128, gen, device="cuda")
    _bmm(A, B, sa, sb, torch.bfloat16)  # verified on the current stream
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ours = _bmm(A, B, sa, sb, torch.bfloat16)  # fast path only (verified): it alone takes the side buffer
        stream_cache = getattr(fu, "_stream_cache_buf", None)
        if fp._direct.workspace is getattr(fu, "_get_stream_cache_buf", object()):
            assert ("bmm_fp8_workspace", A.device, side.cuda_stream) in stream_cache
        else:
            assert fp._direct.workspace is fu._get_cache_buf and stream_cache is None
        expected = flashinfer.bmm_fp8(A, B, sa, sb, torch.bfloat16, backend="cublas")
    torch.cuda.synchronize()
    assert torch.equal(_bits(ours), _bits(expected))


def test_self_check_turns_off_a_path_that_disagrees(gen):
    import flashinfer

    A, B, sa, sb = bmm_fp8_inputs(16, 8, 128, 512, gen, device="cuda")
    fp.decide()
    direct, right, wrong_calls = fp._direct, fp._direct.heuristic, []

    def wrong(A, B, out, A_scale, B_scale, ws):
        wrong_calls.append(1)
        right(A, B, out, A_scale, B_scale, ws)
        out.add_(1)

    direct.heuristic = wrong
    with pytest.warns(RuntimeWarning, match="differs from flashinfer.bmm_fp8") as record:
        first = _bmm(A, B, sa, sb, torch.bfloat16)
    assert len([w for w in record if "bmm_fp8 fast path off" in str(w.message)]) == 1
    later = _bmm(A, B, sa, sb, torch.bfloat16)
    expected = flashinfer.bmm_fp8(A, B, sa, sb, torch.bfloat16, backend="cublas")
    assert torch.equal(_bits(first), _bits(expected)) and torch.equal(_bits(later), _bits(expected))
    assert wrong_calls == [1] and fp._serve is not direct
    assert fp.fast_path_state()["bmm_fp8_fast_path"] == "off"


def test_capture_serves_unverified_signatures_by_the_public_call(gen):
    import flashinfer

    A, B, sa, sb = bmm_fp8_inputs(16, 2, 512, 128, gen, device="cuda")
    flashinfer.bmm_fp8(A, B, sa, sb, torch.bfloat16, backend="cublas")  # warm flashinfer and cuBLASLt
    fp.decide()
    public_calls = []
    public = fp._direct.public_call
    fp._direct.public_call = lambda *args: (public_calls.append(1), public(*args))
    out = torch.empty(16, 2, 128, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()

    def capture():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            sk.bmm_fp8(A, B, sa, sb, torch.bfloat16, out, backend="flashinfer")
        return graph

    graphs = [capture()]  # not verified yet: the public call is captured
    assert public_calls == [1] and fp.fast_path_state()["bmm_fp8_fast_path"] == "untested"
    _bmm(A, B, sa, sb, torch.bfloat16)  # eager: verified (one more public call, to compare)
    assert public_calls == [1, 1] and fp.fast_path_state()["bmm_fp8_fast_path"] == "on"
    graphs.append(capture())  # verified: the fast path is captured
    assert public_calls == [1, 1]
    for graph in graphs:
        A.copy_(bmm_fp8_inputs(16, 2, 512, 128, gen, device="cuda")[0])
        out.fill_(float("nan"))
        graph.replay()
        expected = flashinfer.bmm_fp8(A, B, sa, sb, torch.bfloat16, backend="cublas")
        assert torch.equal(_bits(out), _bits(expected))


@pytest.mark.parametrize("m", range(1, 17))
@pytest.mark.parametrize("e,k,out", sorted(FLASHINFER_ROUTERS))
def test_router_kernels_through_the_op(gen, m, e, k, out):
    out_dtype = getattr(torch, out)
    h, W = randn((m, k), gen, device="cuda"), randn((e, k), gen, device="cuda")
    out = torch.full((m, e), float("nan"), dtype=out_dtype, device="cuda")
    _eligible("dsv3_router_gemm", out, h, W)
    sk.dsv3_router_gemm(h, W, out_dtype, out, backend="flashinfer")
    assert rel_err(out, router_ref(h, W)) <= TOL[out_dtype]


@pytest.mark.parametrize("m", [*range(1, 17), 24, 40, 64])  # the backend's window is M <= 64
@pytest.mark.parametrize("kn", [(7168, 2112), (2048, 512)])  # the DeepSeek-V3 fused-A shape, and another
def test_tinygemm_through_the_op(gen, m, kn):
    k, n = kn
    a, w = randn((m, k), gen, device="cuda"), randn((n, k), gen, device="cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    _eligible("dsv3_fused_a_gemm", out, a, w.t())
    sk.dsv3_fused_a_gemm(a, w.t(), out, backend="flashinfer")
    assert rel_err(out, fused_a_ref(a, w.t())) <= TOL[torch.bfloat16]


PINNED_CASES = [((7168, 2112), m) for m in [*range(1, 17), 17, 24, 31, 64]] + [
    (kn, m) for kn in ((2048, 512), (6144, 2624), (7104, 1040)) for m in (1, 9, 16, 33)]


@pytest.mark.parametrize("pdl", [True, False])
@pytest.mark.parametrize("kn,m", PINNED_CASES)
@pytest.mark.parametrize("variant", sorted(FLASHINFER_FUSED_A_PROGRAMS))
def test_pinned_tinygemm_program(gen, variant, kn, m, pdl):
    # The fused-A variants the routing table may name (flashinfer:<variant>), against float64,
    # for every M the backend admits, at the measured shape and at shapes a nearest-shape lookup
    # may hand them (K % 64, N % 16: the backend's check); skipped where the installed flashinfer
    # lacks the program.
    from slim_kernel.backends import flashinfer as fb

    k, n = kn
    if fb.fused_a_program(variant, k, pdl) is None:
        pytest.skip(f"the installed flashinfer has no {FLASHINFER_FUSED_A_PROGRAMS[variant]} program")
    a, w = randn((m, k), gen, device="cuda"), randn((n, k), gen, device="cuda")
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    run = fb.prepare_fused_a((out, a, w.t()), variant, pdl)
    run(out, a, w.t())
    torch.cuda.synchronize()
    assert rel_err(out, fused_a_ref(a, w.t())) <= TOL[torch.bfloat16]
    first = out.clone()
    run(out, a, w.t())
    assert torch.equal(out, first)  # repeats are bit-identical


TILE_SHAPES = [(n, k) for n, k in ((2112, 7168), (2624, 6144), (1056, 2560), (576, 2048), (3648, 7168))]


@pytest.mark.parametrize("m", [1, 8, 9, 13, 16, 24, 33, 64])
@pytest.mark.parametrize("nk", TILE_SHAPES)
def test_the_estimate_names_the_program_flashinfer_runs(nk, m):
    # What estimate.py places flashinfer's fused-A call with: the program tinygemm_bf16's own dispatch picks
    # for these tensors on this GPU (its enabled check on the real device and CUDA, its window table), or its
    # reference kernel where it picks none; a pinned program's tile is that program's.
    import flashinfer.gemm.routergemm as rg

    from slim_kernel.backends import flashinfer as fb
    from slim_kernel.names import FUSED_A

    n, k = nk
    assert fb.BACKEND.reader(FUSED_A, "sm_90") is fb.fused_a_tile
    tile = fb.fused_a_tile(m, n, k)
    assert fb.BACKEND.health() == []  # every private read worked on this release
    if not hasattr(rg, "_tinygemm2_wgmma_program"):  # before 0.7.4: one kernel serves every call
        assert tile == fb.REFERENCE_TILE
        return
    a, w = torch.zeros(m, k, dtype=torch.bfloat16, device="cuda"), torch.zeros(n, k, dtype=torch.bfloat16, device="cuda")
    program = rg._tinygemm2_wgmma_program(a, w, False, False)
    if program is None:
        assert tile == fb.REFERENCE_TILE
    else:
        assert tile.name == rg._tinygemm2_wgmma_tile(program)
        assert (tile.tokens, tile.rows) == rg._TINYGEMM2_WGMMA_TILES[tile.name]
        assert 0 < tile.smem <= 227 * 1024
    for variant, name in FLASHINFER_FUSED_A_PROGRAMS.items():
        pinned = fb.fused_a_tile(m, n, k, variant)
        assert pinned is None if fb.fused_a_program(variant, k, False) is None else pinned.name == name
