"""The AOT size baseline computes what the shipped paths compute (GPU, ``-m gpu``).

Needs the baseline installed (skipped otherwise), built on the GPU machine with

    SLIM_KERNEL_AOT_BASELINE=ON SLIM_KERNEL_AOT_ARCHS=90a python3 -m pip install --no-build-isolation --no-deps .

dsv3_router_gemm / dsv3_fused_a_gemm: for each shape and every catalogue configuration
(slim_kernel/jit/catalogue.py VARIANTS), its instance and launch geometry are launched through the
JIT runtime and through slim_kernel._aot_baseline with the same arguments; the outputs must be
bit-identical to each other and to the JIT backend's prepared launch, and close to a float64 reference. bmm_fp8: bit-identical to
flashinfer.bmm_fp8(backend="cublas") when flashinfer is installed, else within tolerance of float64.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from slim_kernel.backends import jit as jb
from slim_kernel.jit import catalogue as cat
from slim_kernel.jit import get_kernel
from slim_kernel.names import FUSED_A, ROUTER

from _inputs import TOL, bmm_fp8_inputs, bmm_fp8_ref, randn, rel_err

aot = pytest.importorskip("slim_kernel._aot_baseline", reason="the AOT baseline is not installed "
                          "(SLIM_KERNEL_AOT_BASELINE=ON pip install --no-build-isolation --no-deps .)")

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
K = 7168
HAS_FLASHINFER = importlib.util.find_spec("flashinfer") is not None


def _workspace_bytes() -> int:
    """flashinfer's cuBLASLt workspace size: the heuristic's choice (hence the bits) depends on it."""
    if HAS_FLASHINFER:
        from flashinfer.gemm import gemm_base

        return int(getattr(gemm_base, "DEFAULT_WORKSPACE_SIZE", 40 * 1024 * 1024))
    return 40 * 1024 * 1024  # flashinfer 0.7.x


def _device_arch() -> str | None:
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}a" if major >= 9 else f"{major}{minor}"


def _skip_reason() -> str | None:
    arch = _device_arch()
    if arch is None:
        return "needs a CUDA GPU"
    if arch not in aot.ARCHS.split(","):
        return f"the baseline was built for {aot.ARCHS}, this device is sm_{arch} (set SLIM_KERNEL_AOT_ARCHS)"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")]


def _key(instance) -> str:  # the lookup key of csrc/aot_baseline/manifest.py
    return ",".join(f"{name}={value}" for name, value in instance.defines)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(_bits(a), _bits(b))


def _launch_both(op, cfg, out_jit, out_aot, act, w_ptr, ld_w, n, pdl):
    """Launch ``cfg``'s instance and geometry through the JIT runtime and through the AOT module."""
    m, k = act.shape
    dev = act.device.index
    dtype = str(out_jit.dtype).removeprefix("torch.")
    inst = cfg.instance(op, m, dtype, (n, k))  # the shape picks a narrow configuration's body (exact_for)
    key = _key(inst)
    assert (op, key) in {(o, kk) for o, kk, _ in aot.instances()}, \
        f"{op} [{key}] is not in the baseline: rebuild it from these sources"
    grid, block, cluster = cfg.geometry(n, k, torch.cuda.get_device_properties(dev).multi_processor_count)
    smem = cfg.smem(m, (n, k))
    stream = torch.cuda.current_stream(dev).cuda_stream
    common = (m, n, k, act.stride(0) if m > 1 else k, ld_w)
    get_kernel(inst, dev).launch(grid, block, (act.data_ptr(), w_ptr, out_jit.data_ptr(), *common, out_jit.stride(0)),
                                 stream=stream, smem=smem, pdl=pdl, cluster=cluster)
    getattr(aot, op)(key, (act.data_ptr(), w_ptr, out_aot.data_ptr(), *common, out_aot.stride(0)), grid,
                     block, smem, cluster, pdl, stream, dev)
    torch.cuda.synchronize(dev)
    return f"[{key}] grid {grid} cluster {cluster} pdl={pdl}"


@pytest.fixture
def pdl_knob():
    from slim_kernel import knobs

    old = knobs.pdl_setting()
    yield knobs.set_pdl
    knobs.set_pdl(old)


def _nan(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


@pytest.mark.parametrize("m", [1, 2, 5, 8, 9, 16, 40])
@pytest.mark.parametrize("e", [256, 384])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "nopdl"])
@pytest.mark.parametrize("variant", list(cat.VARIANTS[ROUTER]))
def test_router_aot_matches_jit_bitwise(gen, m, e, out_dtype, pdl, variant, pdl_knob):
    cfg = cat.VARIANTS[ROUTER][variant]
    if m > cfg.max_m((e, K)):
        pytest.skip(f"{variant} serves M <= {cfg.max_m((e, K))} at E={e}")
    h, w = randn((m, K), gen, device="cuda"), randn((e, K), gen, device="cuda")
    out_jit, out_aot, out_op = _nan((m, e), out_dtype), _nan((m, e), out_dtype), _nan((m, e), out_dtype)
    launched = _launch_both(ROUTER, cfg, out_jit, out_aot, h, w.data_ptr(), w.stride(0), e, pdl)
    pdl_knob(pdl)
    jb.prepare_router((out_op, h, w), variant)(out_op, h, w)  # the JIT backend's own launch
    torch.cuda.synchronize()
    what = f"router[{variant}] M={m} E={e} {out_dtype} {launched}"
    assert _same_bits(out_aot, out_jit), f"{what}: AOT and JIT outputs differ"
    assert _same_bits(out_op, out_jit), f"{what}: the JIT backend's launch differs from the instance launch"
    assert rel_err(out_aot, h.double() @ w.double().t()) <= TOL[out_dtype], what


@pytest.mark.parametrize("m", [1, 2, 4, 8, 9, 13, 16, 40])
@pytest.mark.parametrize("pdl", [True, False], ids=["pdl", "nopdl"])
@pytest.mark.parametrize("variant", list(cat.VARIANTS[FUSED_A]))
def test_fused_a_aot_matches_jit_bitwise(gen, m, pdl, variant, pdl_knob):
    n = 2112
    cfg = cat.VARIANTS[FUSED_A][variant]
    if m > cfg.max_m((n, K)):
        pytest.skip(f"{variant} serves M <= {cfg.max_m((n, K))}")
    a, w = randn((m, K), gen, device="cuda"), randn((n, K), gen, device="cuda")
    mat_b = w.t()  # (K, N) column-major
    out_jit, out_aot, out_op = (_nan((m, n), torch.bfloat16) for _ in range(3))
    launched = _launch_both(FUSED_A, cfg, out_jit, out_aot, a, mat_b.data_ptr(), mat_b.stride(1), n, pdl)
    pdl_knob(pdl)
    jb.prepare_fused_a((out_op, a, mat_b), variant)(out_op, a, mat_b)
    torch.cuda.synchronize()
    what = f"fused-A[{variant}] M={m} N={n} {launched}"
    assert _same_bits(out_aot, out_jit), f"{what}: AOT and JIT outputs differ"
    assert _same_bits(out_op, out_jit), f"{what}: the JIT backend's launch differs from the instance launch"
    assert rel_err(out_aot, a.double() @ mat_b.double()) <= TOL[torch.bfloat16], what


def test_unknown_instance_key_is_a_clear_error():
    out = torch.empty(1, 256, device="cuda")
    with pytest.raises(KeyError, match="no AOT instance with key 'SK_NT=99'"):
        aot.dsv3_router_gemm("SK_NT=99", (0, 0, out.data_ptr(), 1, 256, K, K, K, 256), (16, 1, 1), (128, 1, 1))


def _aot_bmm_fp8(A, B, sa, sb, out_dtype):
    b, m, k = A.shape
    n = B.shape[2]
    out = _nan((b, m, n), out_dtype)
    ws = torch.empty(_workspace_bytes(), dtype=torch.uint8, device="cuda")
    name = {E4M3: "float8_e4m3fn", E5M2: "float8_e5m2", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    aot.bmm_fp8(A.data_ptr(), B.data_ptr(), out.data_ptr(), sa.data_ptr(), sb.data_ptr(), ws.data_ptr(),
                ws.numel(), b, m, n, k, name[A.dtype], name[B.dtype], name[out_dtype], 0,
                torch.cuda.current_stream().cuda_stream, A.device.index)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("bmkn", [(16, 1, 128, 512), (16, 8, 512, 128), (16, 33, 128, 512), (1, 64, 256, 1024)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtypes", [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)], ids=["e4m3", "e4m3-e5m2", "e5m2-e4m3"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_bmm_fp8_aot_matches_flashinfer_cublas(gen, bmkn, dtypes, out_dtype):
    b, m, k, n = bmkn
    A, B, sa, sb = bmm_fp8_inputs(b, m, k, n, gen, *dtypes, device="cuda")
    if HAS_FLASHINFER:  # first, so the AOT module picks up the libcublasLt flashinfer loaded
        import flashinfer

        expected = flashinfer.bmm_fp8(A, B, sa, sb, out_dtype, backend="cublas")
    out = _aot_bmm_fp8(A, B, sa, sb, out_dtype)
    lib = aot.cublaslt()
    if HAS_FLASHINFER:
        assert _same_bits(out, expected), f"AOT bmm_fp8 differs from flashinfer cublas (libcublasLt {lib})"
    assert rel_err(out, bmm_fp8_ref(A, B, sa, sb)) <= 2e-2, lib  # fp8 inputs, 16-bit output


def test_bmm_fp8_rejects_two_e5m2_operands(gen):
    A, B, sa, sb = bmm_fp8_inputs(2, 4, 128, 128, gen, E5M2, E5M2, device="cuda")
    with pytest.raises(ValueError, match="cannot both be float8_e5m2"):
        _aot_bmm_fp8(A, B, sa, sb, torch.bfloat16)


def test_schemas_are_the_retired_registrations():
    assert aot.schemas()["dsv3_router_gemm"] == "dsv3_router_gemm(Tensor! output, Tensor mat_a, Tensor mat_b) -> ()"
    assert aot.schemas()["bmm_fp8"].startswith("bmm_fp8(Tensor A, Tensor B, Tensor! D,")
    assert {op for op, _, _ in aot.instances()} == {ROUTER, FUSED_A}
