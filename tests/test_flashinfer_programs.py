"""The flashinfer backend's pinned fused-A programs (CPU, a stand-in flashinfer in sys.modules):
program names, the launch through flashinfer's op, the public call where a release lacks one."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from slim_kernel.names import FLASHINFER_FUSED_A_PROGRAMS


@pytest.fixture
def fake_flashinfer(monkeypatch):
    """flashinfer with tinygemm_bf16, the router kernels, the wgmma op and two generated programs."""
    calls = []

    def tinygemm_bf16(x, w, out, use_pdl=False):
        calls.append(("public", use_pdl))
        out.copy_((x.float() @ w.float().t()).to(out.dtype))

    def wgmma_op(program, x, w, bias, out):
        assert bias is None and x.is_contiguous() and w.is_contiguous()
        calls.append(("program", program))
        out.copy_((x.float() @ w.float().t()).to(out.dtype))

    gemm = types.ModuleType("flashinfer.gemm")
    gemm.tinygemm_bf16 = tinygemm_bf16
    for name in ("mm_M1_16_K7168_N256", "mm_M1_16_K7168_N256_bf16", "mm_M1_16_K7168_N384", "mm_M1_16_K7168_N384_bf16"):
        setattr(gemm, name, lambda *a, **k: None)
    routergemm = types.ModuleType("flashinfer.gemm.routergemm")
    routergemm.get_tinygemm2_wgmma_op = lambda: wgmma_op
    programs = types.ModuleType("flashinfer.jit.cake_tinygemm2_wgmma")
    programs.PACKED_S8_IL_BOX3D_NOBIAS = object()
    programs.PACKED_S8_IL_BOX3D_NOBIAS_PDL = object()
    programs.ACCUMULATORS_CN16_NOBIAS = object()  # no 3-D-box build of this tile
    jit = types.ModuleType("flashinfer.jit")
    jit.cake_tinygemm2_wgmma = programs
    root = types.ModuleType("flashinfer")
    root.gemm, root.jit = gemm, jit
    gemm.routergemm = routergemm
    for name, mod in {"flashinfer": root, "flashinfer.gemm": gemm, "flashinfer.gemm.routergemm": routergemm,
                      "flashinfer.jit": jit, "flashinfer.jit.cake_tinygemm2_wgmma": programs}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "slim_kernel.backends.flashinfer", raising=False)
    import slim_kernel.backends.flashinfer as fb

    yield fb, calls, programs
    sys.modules.pop("slim_kernel.backends.flashinfer", None)


def test_program_names_follow_flashinfers_naming(fake_flashinfer):
    fb, _, _ = fake_flashinfer
    assert set(FLASHINFER_FUSED_A_PROGRAMS) == {"s8il", "cn16"}
    assert fb.fused_a_program("s8il", 7168, True) == "PACKED_S8_IL_BOX3D_NOBIAS_PDL"
    assert fb.fused_a_program("s8il", 7168, False) == "PACKED_S8_IL_BOX3D_NOBIAS"
    assert fb.fused_a_program("s8il", 7000, False) is None  # no 3-D boxes at this K, no 2-D build here
    assert fb.fused_a_program("cn16", 7168, False) == "ACCUMULATORS_CN16_NOBIAS"
    assert fb.fused_a_program("cn16", 7168, True) is None
    with pytest.raises(ValueError, match="unknown flashinfer fused-A variant 'u4'"):
        fb.fused_a_program("u4", 7168, False)


@pytest.mark.parametrize("pdl", [True, False])
def test_pinned_program_launches_through_flashinfers_op(fake_flashinfer, pdl):
    fb, calls, _ = fake_flashinfer
    a = torch.randn(9, 7168, dtype=torch.bfloat16)
    w = torch.randn(64, 7168, dtype=torch.bfloat16)
    out = torch.full((9, 64), float("nan"), dtype=torch.bfloat16)
    run = fb.prepare_fused_a((out, a, w.t()), "s8il", pdl)
    run(out, a, w.t())
    assert calls == [("program", "PACKED_S8_IL_BOX3D_NOBIAS" + ("_PDL" if pdl else ""))]
    ref = a.double() @ w.double().t()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 5e-3


def test_missing_program_serves_the_public_call(fake_flashinfer):
    fb, calls, programs = fake_flashinfer
    del programs.PACKED_S8_IL_BOX3D_NOBIAS_PDL  # a release without it
    a = torch.randn(3, 7168, dtype=torch.bfloat16)
    w = torch.randn(32, 7168, dtype=torch.bfloat16)
    out = torch.empty(3, 32, dtype=torch.bfloat16)
    fb.prepare_fused_a((out, a, w.t()), "s8il", True)(out, a, w.t())
    fb.prepare_fused_a((out, a, w.t()), None, False)(out, a, w.t())
    assert calls == [("public", True), ("public", False)]


def test_first_use_builds_name_each_module_once(fake_flashinfer, monkeypatch):
    """tune builds these side by side: the PDL producer's RMSNorm and the router module once, and per fused-A call
    the program tinygemm_bf16 picks plus every pinned program, in both launch contexts, each once."""
    fb, _, programs = fake_flashinfer
    import flashinfer.gemm.routergemm as routergemm

    monkeypatch.setattr(routergemm, "_tinygemm2_wgmma_identifier",
                        lambda m, n, k, bias, pdl: f"PICK_M{min(m, 8)}" + ("_PDL" if pdl else ""), raising=False)
    calls = [("dsv3_router_gemm", m, 256, 7168) for m in (1, 2)] + [("dsv3_router_gemm", 1, 384, 7168)]
    calls += [("dsv3_fused_a_gemm", m, 2112, 7168) for m in (1, 9, 16)]
    loaders = fb.first_use_builds(calls, torch.device("cpu"))
    assert sorted(loaders) == sorted(["norm", "router", "PICK_M1", "PICK_M1_PDL", "PICK_M8", "PICK_M8_PDL",
                                      "PACKED_S8_IL_BOX3D_NOBIAS", "PACKED_S8_IL_BOX3D_NOBIAS_PDL",
                                      "ACCUMULATORS_CN16_NOBIAS"])
    assert all(callable(load) for load in loaders.values())
    # a router flashinfer does not ship, and a release without the private picker: nothing to name
    monkeypatch.delattr(routergemm, "_tinygemm2_wgmma_identifier")
    assert fb.first_use_builds([("dsv3_router_gemm", 1, 160, 5120)], torch.device("cpu")).keys() == {"norm"}
    assert fb.first_use_builds([], torch.device("cpu")) == {}
    assert "PICK_M1" not in fb.first_use_builds([("dsv3_fused_a_gemm", 1, 2112, 7168)], torch.device("cpu"))
