"""Our JIT kernels for dsv3_router_gemm and dsv3_fused_a_gemm.

GPU tests (``-m gpu``, need an SM >= 9.0 device and the JIT runtime): the full shape matrix
against a float64 reference with poisoned outputs, bit-identical repeats, CUDA-graph capture
and replay, PDL on and off, row-strided activation views, tails and odd shapes, and every
tile configuration the benchmark may compare. CPU test: every kernel instance compiles for
sm_90a with nvcc within the limits its source declares (registers, no spills).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import slim_kernel
from slim_kernel.backends import jit as jb
from slim_kernel.registry import BackendUnavailableError

KERNELS = Path(jb.__file__).resolve().parent.parent / "jit" / "kernels"
FP32_TOL = 1e-5
BF16_TOL = 5e-3


def _cuda_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


def gpu(test):
    """GPU test: marked `gpu`, skipped without an SM >= 9.0 device."""
    return pytest.mark.gpu(pytest.mark.skipif(not _cuda_sm90(), reason="needs a CUDA device with SM >= 9.0")(test))


def _rand(*shape, gen=None):
    # Normal values; never zero-filled. bf16 inputs, so the float64 reference sees the same values.
    return torch.randn(*shape, generator=gen, device="cuda", dtype=torch.float32).to(torch.bfloat16)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _check(out: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert not torch.isnan(out).any(), f"{what}: output has NaNs (an element was not written)"
    tol = FP32_TOL if out.dtype == torch.float32 else BF16_TOL
    err = _rel_err(out, ref)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol}"


def _router(x, w, out_dtype, backend="jit"):
    out = torch.full((x.shape[0], w.shape[0]), float("nan"), device="cuda", dtype=out_dtype)
    slim_kernel.dsv3_router_gemm(x, w, out_dtype, output=out, backend=backend)
    return out


def _fused_a(a, b, backend="jit"):
    out = torch.full((a.shape[0], b.shape[1]), float("nan"), device="cuda", dtype=torch.bfloat16)
    slim_kernel.dsv3_fused_a_gemm(a, b, output=out, backend=backend)
    return out


def _ref(act, w_nk):
    return act.double() @ w_nk.double().t()


@pytest.fixture(params=[True, False], ids=["pdl", "nopdl"])
def pdl(request):
    old = jb.PDL
    jb.set_pdl(request.param)
    yield request.param
    jb.set_pdl(old)


@pytest.fixture
def restore_config():
    saved = dict(jb._RULES)
    yield
    for op, rules in saved.items():
        jb.set_config(op, rules)


# ---------------------------------------------------------------- GPU: full matrix

@gpu
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("k", [1024, 4096, 7168])
@pytest.mark.parametrize("e", [256, 384])
def test_router_matrix(e, k, out_dtype, pdl):
    gen = torch.Generator(device="cuda").manual_seed(e * 100003 + k)
    w = _rand(e, k, gen=gen)
    for m in range(1, 17):
        x = _rand(m, k, gen=gen)
        _check(_router(x, w, out_dtype), _ref(x, w), f"router M={m} E={e} K={k} {out_dtype}")


@gpu
@pytest.mark.parametrize("k", [1024, 4096, 7168])
@pytest.mark.parametrize("n", [2112, 2624])
def test_fused_a_matrix(n, k, pdl):
    gen = torch.Generator(device="cuda").manual_seed(n * 100003 + k)
    w = _rand(n, k, gen=gen)  # the (N, K) weight; the op takes its transpose (K, N) column-major
    for m in range(1, 17):
        a = _rand(m, k, gen=gen)
        _check(_fused_a(a, w.t()), _ref(a, w), f"fused_a M={m} N={n} K={k}")


# ---------------------------------------------------------------- GPU: properties

@gpu
@pytest.mark.parametrize("m", [1, 5, 8, 9, 16])
def test_repeated_runs_bit_identical(m, pdl):
    gen = torch.Generator(device="cuda").manual_seed(m)
    x, w = _rand(m, 7168, gen=gen), _rand(256, 7168, gen=gen)
    a, wf = _rand(m, 7168, gen=gen), _rand(2112, 7168, gen=gen)
    r0, f0 = _router(x, w, torch.float32), _fused_a(a, wf.t())
    for _ in range(20):
        assert torch.equal(_router(x, w, torch.float32), r0), "router: results differ between runs"
        assert torch.equal(_fused_a(a, wf.t()), f0), "fused_a: results differ between runs"


@gpu
@pytest.mark.parametrize("m", [1, 7, 16])
def test_cuda_graph_capture_and_replay(m, pdl):
    gen = torch.Generator(device="cuda").manual_seed(100 + m)
    x, w = _rand(m, 7168, gen=gen), _rand(384, 7168, gen=gen)
    a, wf = _rand(m, 7168, gen=gen), _rand(2112, 7168, gen=gen)
    r_out = torch.empty(m, 384, device="cuda", dtype=torch.float32)
    f_out = torch.empty(m, 2112, device="cuda", dtype=torch.bfloat16)

    def step():
        slim_kernel.dsv3_router_gemm(x, w, torch.float32, output=r_out, backend="jit")
        slim_kernel.dsv3_fused_a_gemm(a, wf.t(), output=f_out, backend="jit")

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up (compile, plan) outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):  # new inputs each replay, poisoned outputs
        x.copy_(_rand(m, 7168, gen=gen))
        a.copy_(_rand(m, 7168, gen=gen))
        r_out.fill_(float("nan"))
        f_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _check(r_out, _ref(x, w), f"graph router M={m}")
        _check(f_out, _ref(a, wf), f"graph fused_a M={m}")


@gpu
@pytest.mark.parametrize("m", [1, 3, 8, 12, 16])
def test_row_strided_views(m, pdl):
    gen = torch.Generator(device="cuda").manual_seed(200 + m)
    k = 7168
    buf = _rand(m + 3, k + 64, gen=gen)
    x = buf[2:2 + m, :k]  # row stride k + 64, 16-byte aligned: served by the JIT kernel, no copy
    assert m == 1 or not x.is_contiguous()  # one row is contiguous whatever its stride
    w, wf = _rand(256, k, gen=gen), _rand(2112, k, gen=gen)
    _check(_router(x, w, torch.float32), _ref(x, w), f"strided router M={m}")
    _check(_fused_a(x, wf.t()), _ref(x, wf), f"strided fused_a M={m}")
    # A view the kernel cannot read with 16-byte loads: pinned jit refuses, the default path is right.
    odd = buf[1:1 + m, 1:1 + k]
    with pytest.raises(BackendUnavailableError):
        _router(odd, w, torch.float32)
    _check(_router(odd, w, torch.float32, backend=None), _ref(odd, w), f"fallback router M={m}")
    _check(_fused_a(odd, wf.t(), backend=None), _ref(odd, wf), f"fallback fused_a M={m}")


@gpu
@pytest.mark.parametrize("m,n,k", [(1, 1, 8), (3, 7, 40), (9, 24, 1000), (16, 100, 7176), (16, 16, 264),
                                   (2, 520, 4104)])
def test_tails_and_odd_shapes(m, n, k, pdl):
    # K not a multiple of 32 (zero-filled tail), N/E not multiples of 16 (partial row tiles).
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 11 + k)
    x, w = _rand(m, k, gen=gen), _rand(n, k, gen=gen)
    for dt in (torch.float32, torch.bfloat16):
        _check(_router(x, w, dt), _ref(x, w), f"router M={m} E={n} K={k} {dt}")
    _check(_fused_a(x, w.t()), _ref(x, w), f"fused_a M={m} N={n} K={k}")


@gpu
def test_outside_window_falls_back():
    x, w = _rand(17, 1024), _rand(256, 1024)
    with pytest.raises(BackendUnavailableError):
        _router(x, w, torch.float32)
    _check(_router(x, w, torch.float32, backend=None), _ref(x, w), "router M=17 fallback")


# Tile configurations the benchmark compares (compile-time rt/stages, launch-time warps/split),
# including one CTA per row group (split=1, no cluster), odd cluster sizes and 1..8 warps.
CONFIGS = [
    "rt=1,stages=2,warps=2,split=1",
    "rt=1,stages=8,warps=4,split=8",
    "rt=2,stages=3,warps=8,split=2",
    "rt=4,stages=4,warps=4,split=4",
    "rt=4,stages=3,warps=8,split=0",
    "rt=3,stages=6,warps=5,split=7",
    "rt=1,stages=8,warps=4,split=8,push=1",
    "rt=4,stages=4,warps=4,split=4,push=1",
    "rt=2,stages=4,warps=3,split=5,push=1",
    "rt=1,stages=8,warps=2,split=16,push=1",
    "8:rt=1,stages=4,warps=8,split=1;16:rt=4,stages=4,warps=4,split=4",
    # bulk-copy kernel: tiny ring (wraps many times), wide stages, odd cluster sizes, 8 consumers
    "rt=1,stages=2,warps=1,split=1,bulk=1,kc=64",
    "rt=1,stages=3,warps=3,split=5,bulk=1,kc=128",
    "rt=1,stages=6,warps=8,split=0,bulk=1,kc=512",
    "rt=1,stages=12,warps=4,split=1,bulk=1,kc=256",
    "rt=2,stages=4,warps=4,split=2,bulk=1",
    "rt=2,stages=3,warps=2,split=1,bulk=1,kc=160",
    # direct activations (bulk=2): wrapping ring, odd clusters, rt=2, one consumer warp
    "rt=1,stages=2,warps=1,split=1,bulk=2,kc=64",
    "rt=1,stages=3,warps=8,split=0,bulk=2,kc=2048",
    "rt=2,stages=3,warps=3,split=3,bulk=2,kc=160",
    "8:rt=1,stages=4,warps=4,split=5,bulk=2,kc=512;16:rt=2,stages=3,warps=8,split=2,bulk=2,kc=1024",
    # rotated K walks (rot=1), both kernels
    "rt=1,stages=8,warps=8,split=1,rot=1",
    "rt=3,stages=4,warps=3,split=5,rot=1",
    "rt=1,stages=3,warps=4,split=0,bulk=1,kc=1024,rot=1",
    "rt=1,stages=3,warps=8,split=0,bulk=2,kc=2048,rot=1",
    "rt=2,stages=2,warps=3,split=3,bulk=2,kc=160,rot=1",
    "8:rt=1,stages=8,warps=4,split=2,bulk=1;16:rt=1,stages=4,warps=2,split=7,bulk=1,kc=96",
]


@gpu
@pytest.mark.parametrize("cfg", CONFIGS)
def test_tile_configs(cfg, restore_config):
    gen = torch.Generator(device="cuda").manual_seed(len(cfg))
    jb.set_config(jb.ROUTER, cfg)
    jb.set_config(jb.FUSED_A, cfg)
    w, wf = _rand(384, 4096, gen=gen), _rand(2112, 4096, gen=gen)
    for m in (1, 6, 8, 9, 16):
        x = _rand(m, 4096, gen=gen)
        _check(_router(x, w, torch.float32), _ref(x, w), f"[{cfg}] router M={m}")
        _check(_fused_a(x, wf.t()), _ref(x, wf), f"[{cfg}] fused_a M={m}")


# ---------------------------------------------------------------- CPU: compile within limits

_LIMITS = re.compile(r"//\s*slim:limits\s+(.*)")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")


def _declared_limits(source: str) -> dict[str, int]:
    match = _LIMITS.search((KERNELS / source).read_text())
    assert match, f"{source} declares no '// slim:limits ...' line"
    return {k: int(v) for k, v in (item.split("=") for item in match.group(1).split())}


def _nvcc() -> str | None:
    return os.environ.get("NVCC") or shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


def _variant_instances():
    """Default instances plus those of every config the GPU tests and benchmark use."""
    saved = dict(jb._RULES)
    try:
        seen = list(jb.all_instances())
        for cfg in CONFIGS:
            jb.set_config(jb.ROUTER, cfg)
            jb.set_config(jb.FUSED_A, cfg)
            seen += [i for i in jb.all_instances() if i not in seen]
        return seen
    finally:
        for op, rules in saved.items():
            jb.set_config(op, rules)


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found")
@pytest.mark.parametrize("inst", _variant_instances(), ids=lambda i: f"{i.entry}-" + "-".join(f"{k}{v}" for k, v in i.defines))
def test_instance_compiles_within_limits(inst, tmp_path):
    cmd = [_nvcc(), "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-std=c++17",
           *(f"-D{k}={v}" for k, v in inst.defines), "-I", str(KERNELS), "-x", "cu", str(KERNELS / inst.source),
           "-o", str(tmp_path / "k.cubin")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"nvcc failed:\n{report}"
    assert f"Compiling entry function '{inst.entry}'" in report, report
    limits = _declared_limits(inst.source)
    regs = int(_PTXAS_REGS.search(report).group(1))
    spill_st, spill_ld = map(int, _PTXAS_SPILL.search(report).groups())
    smem = sum(int(s) for s in _PTXAS_SMEM.findall(report))
    assert regs <= limits["max_registers"], f"{regs} registers > declared {limits['max_registers']}\n{report}"
    assert max(spill_st, spill_ld) <= limits["max_spill_bytes"], f"spills: {spill_st}/{spill_ld} bytes\n{report}"
    assert smem <= limits["max_smem_static"], f"static smem {smem} > declared {limits['max_smem_static']}"
    sass = _sass(tmp_path / "k.cubin")
    if sass is not None:  # tensor-core MMA and async copies really are in the machine code
        copy = "UBLKCP" if dict(inst.defines).get("SK_BULK") else "LDGSTS"
        assert "HMMA.16816.F32.BF16" in sass and copy in sass, sass[:2000]


def _sass(cubin: Path) -> str | None:
    """cuobjdump -sass of a cubin (toolkit or the nvidia-cuda-cuobjdump/nvdisasm wheels), or None."""
    dirs = [str(Path(_nvcc() or "/nonexistent").parent)]
    try:
        import nvidia

        dirs += [str(Path(p) / sub / "bin") for p in nvidia.__path__ for sub in ("cu13", "cuda_cuobjdump", "")]
    except ImportError:
        pass
    path = os.pathsep.join([*dirs, os.environ.get("PATH", "")])
    tool = shutil.which("cuobjdump", path=path)
    if tool is None or shutil.which("nvdisasm", path=path) is None:
        return None
    proc = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": path})
    return proc.stdout if proc.returncode == 0 else None


def test_launch_plans_fit_the_device_limits():
    # Every default rule must fit the shared memory of one SM and give a valid cluster.
    for rules in jb.DEFAULT_RULES.values():
        for _, cfg in rules:
            for nt in (1, 2):
                assert jb.smem_bytes(cfg, nt, 8) <= jb.MAX_SMEM
            for n in (256, 384, 2112, 2624, 7):
                grid, block, cluster = jb.launch_geometry(cfg, n, 7168, 132)
                assert block[0] % 32 == 0 and block[0] <= 1024
                if cluster:
                    assert grid[1] == cluster[1] <= jb.MAX_CLUSTER
    assert jb.launch_geometry(jb.GemmConfig(rt=4, warps=4), 2112, 7168, 132)[0] == (33, 4, 1)
    assert jb.launch_geometry(jb.GemmConfig(rt=1, warps=4), 256, 7168, 132)[0] == (16, 8, 1)


def test_config_rules_parse_and_reject():
    rules = jb.parse_rules("8:rt=1,split=1;16:rt=4,warps=8")
    assert rules[0] == (8, jb.GemmConfig(rt=1, split=1)) and rules[1][1].warps == 8
    for bad in ("rt=0", "8:rt=1", "foo=1", "warps=9", "split=17"):
        with pytest.raises(ValueError):
            jb.parse_rules(bad)
    nts = {dict(i.defines)["SK_NT"] for i in jb.all_instances()}
    assert nts == {1, 2}


def test_bench_gemm_dry_run(tmp_path):
    # The benchmark's report plumbing (phases, JSON, PNG, tables) on CPU with fake timings.
    pytest.importorskip("matplotlib")
    bench = Path(__file__).resolve().parent.parent / "benchmark" / "bench_gemm.py"
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    proc = subprocess.run([sys.executable, str(bench), "--dry-run", "--quick", "--json", str(out_json),
                           "--png", str(out_png)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(KERNELS.parent.parent.parent), os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import json

    data = json.loads(out_json.read_text())
    assert {r["cache"] for r in data["rows"]} == {"cold", "hot"}
    assert any(k.startswith("jit[") for r in data["rows"] for k in r["us"])
    assert out_png.stat().st_size > 10_000
    assert "us per call" in proc.stdout


def test_fast_eligibility_check_agrees_with_the_detailed_one():
    # The hot-path check must accept exactly what the detailed (reason-giving) check accepts.
    big = torch.randn(20, 7300).to(torch.bfloat16)
    seen = 0
    for m in (1, 3, 16, 17):
        for k in (8, 7000, 7004, 7168):
            for offset in (0, 1, 8):
                for row_stride in (7168, 7176, 7300):
                    if offset + (m - 1) * row_stride + k > big.numel():
                        continue
                    act = big.as_strided((m, k), (row_stride, 1), offset)
                    w = torch.randn(256, k).to(torch.bfloat16)
                    out = torch.empty(m, 256)
                    wt = torch.randn(256, k).to(torch.bfloat16).t()
                    outb = torch.empty(m, 256, dtype=torch.bfloat16)
                    detailed_r = jb._common_reason(out, act, 256) or jb._operand_reason(
                        "w", w, 256, k, w.stride(0), w.stride(1))
                    detailed_f = jb._common_reason(outb, act, 256) or jb._operand_reason(
                        "w", wt, 256, k, wt.stride(1), wt.stride(0))
                    assert (jb.router_check(out, act, w) is None) == (detailed_r is None), (m, k, offset, row_stride)
                    assert (jb.fused_a_check(outb, act, wt) is None) == (detailed_f is None)
                    seen += detailed_r is None
    assert seen > 10
    assert "outside" in jb.router_check(torch.empty(17, 256), big[:17, :7168], torch.randn(256, 7168).bfloat16())
