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


def test_pdl_candidate_is_the_public_call_launched_with_pdl(fake_flashinfer):
    """``flashinfer:pdl``: offered for fused-A after a plain producer only, run as the public call with PDL
    while the knob allows PDL, and placed on the device as the public call is."""
    from slim_kernel import knobs

    fb, calls, _ = fake_flashinfer
    a = torch.randn(5, 7168, dtype=torch.bfloat16)
    w = torch.randn(48, 7168, dtype=torch.bfloat16)
    out = torch.full((5, 48), float("nan"), dtype=torch.bfloat16)
    fb.prepare_fused_a((out, a, w.t()), fb.PDL_VARIANT, False)(out, a, w.t())
    assert calls == [("public", True)]
    ref = a.double() @ w.double().t()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 5e-3
    point = types.SimpleNamespace(shape=types.SimpleNamespace(k=7168))
    target = lambda args, variant, pdl: (variant, pdl)  # noqa: E731
    plain = fb.BACKEND.tune_candidates("dsv3_fused_a_gemm", target, None, False, True, point)
    assert plain["flashinfer:pdl"] == ("pdl", False) and plain["flashinfer"] == (None, False)
    assert "flashinfer:pdl" not in fb.BACKEND.tune_candidates("dsv3_fused_a_gemm", target, None, True, True, point)
    assert "flashinfer:pdl" not in fb.BACKEND.tune_candidates("dsv3_router_gemm", target, None, False, True, point)
    assert fb.BACKEND.offers("dsv3_fused_a_gemm", "pdl", 5, (48, 7168))
    assert not fb.BACKEND.offers("dsv3_router_gemm", "pdl", 5, (256, 7168))
    assert fb.BACKEND.margin("dsv3_fused_a_gemm", "pdl", None) == fb.BACKEND.margin("dsv3_fused_a_gemm", None, None)
    before = knobs.pdl_setting()
    knobs.set_pdl(False)
    try:
        calls.clear()
        fb.prepare_fused_a((out, a, w.t()), fb.PDL_VARIANT, False)(out, a, w.t())
        assert calls == [("public", False)]  # PDL switched off: the same call without it
        assert "flashinfer:pdl" not in fb.BACKEND.tune_candidates("dsv3_fused_a_gemm", target, None, False, True, point)
    finally:
        knobs.set_pdl(before)


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


def test_fused_a_tile_reads_the_installed_dispatch(fake_flashinfer, monkeypatch):
    """The estimate's view of flashinfer's fused-A call: the program its window table picks (tile, shared memory,
    cluster), the reference kernel where it picks none or before 0.7.4, and None where the layout is not readable."""
    fb, _, programs = fake_flashinfer
    import flashinfer.gemm.routergemm as rg

    record = types.SimpleNamespace
    programs.PACKED_U4_IL_BOX3D_NOBIAS = record(dynamic_smem_bytes=199680)
    programs.PACKED_S8_IL_BOX3D_NOBIAS = record(dynamic_smem_bytes=101376)
    programs.CLUSTER_S8U8_C4_NOBIAS = record(dynamic_smem_bytes=199168)
    tiles = {"PACKED_U4_IL": (8, 16), "PACKED_S8_IL": (8, 16), "CLUSTER_S8U8": (8, 16)}
    picks = {1: "PACKED_U4_IL_BOX3D_NOBIAS", 2: "CLUSTER_S8U8_C4_NOBIAS", 3: None}
    for name, value in {"_TINYGEMM2_WGMMA_TILES": tiles, "_WGMMA_CLUSTER_TILES": ("CLUSTER_S8U8",),
                        "_tinygemm2_wgmma_tile": lambda p: max((t for t in tiles if p.startswith(t)), key=len),
                        "_tinygemm2_wgmma_identifier": lambda m, n, k, bias, pdl: picks[m],
                        "_tinygemm2_wgmma_enabled": lambda disabled, cc: disabled != "1",
                        "get_tinygemm2_module": lambda: None}.items():
        monkeypatch.setattr(rg, name, value, raising=False)
    fb.fused_a_tile.cache_clear()
    assert fb.fused_a_tile(1, 2112, 7168) == fb.FusedATile("PACKED_U4_IL", 8, 16, 199680, 1)
    assert fb.fused_a_tile(2, 256, 7168) == fb.FusedATile("CLUSTER_S8U8", 8, 16, 199168, 4)  # a cluster of 4 per tile
    assert fb.fused_a_tile(3, 2112, 7168) == fb.REFERENCE_TILE  # no window admits it: the reference kernel
    assert fb.fused_a_tile(1, 2112, 7168, "s8il") == fb.FusedATile("PACKED_S8_IL", 8, 16, 101376, 1)
    with pytest.warns(RuntimeWarning, match="tile table of program ACCUMULATORS_CN16_NOBIAS cannot be read"):
        assert fb.fused_a_tile(1, 2112, 7168, "cn16") is None  # a program whose tile its table does not name
    assert any("ACCUMULATORS_CN16_NOBIAS" in line for line in fb.BACKEND.health())  # what `info` lists
    monkeypatch.setenv("FLASHINFER_DISABLE_TINYGEMM2_WGMMA", "1")
    fb.fused_a_tile.cache_clear()
    assert fb.fused_a_tile(1, 2112, 7168) == fb.REFERENCE_TILE  # its switch is off: the reference kernel serves
    monkeypatch.delattr(rg, "_tinygemm2_wgmma_identifier")  # a release before the generated programs
    fb.fused_a_tile.cache_clear()
    assert fb.fused_a_tile(1, 2112, 7168) == fb.REFERENCE_TILE and fb.fused_a_tile(1, 2112, 7168, "s8il") is None
    monkeypatch.delattr(rg, "get_tinygemm2_module")  # a layout this does not know
    fb.fused_a_tile.cache_clear()
    with pytest.warns(RuntimeWarning, match="fused-A dispatch cannot be read"):
        assert fb.fused_a_tile(1, 2112, 7168) is None
