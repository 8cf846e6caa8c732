"""The kernel catalogue (CPU): configs, rules, instances, launch geometry, and the shared-memory
formulas pinned to the C++ ones (a host program compiled by nvcc prints the .cuh constexprs)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from slim_kernel.backend import Geometry
from slim_kernel.backends import jit as jb
from slim_kernel.jit import catalogue as cat
from slim_kernel.jit import routed
from slim_kernel.jit import rules as tile_rules
from slim_kernel.names import FUSED_A, ROUTER

KERNELS = Path(cat.__file__).resolve().parent / "kernels"


def test_every_variant_serves_its_ops_up_to_its_window():
    for op, variants in cat.VARIANTS.items():
        assert cat.FALLBACK_VARIANT in variants
        fallback = variants[cat.FALLBACK_VARIANT]
        assert fallback.max_m() == cat.MAX_M, "the fallback must serve the whole JIT window"
        for name, cfg in variants.items():
            for m in range(1, cfg.max_m() + 1):
                assert cat.variant_serves(cfg, op, m), (op, name, m)
                grid, block, cluster = cfg.geometry(2112, 7168, 132)
                assert block[0] % 32 == 0 and block[0] <= 1024
                if cluster:
                    assert grid[1] == cluster[1] <= cat.MAX_SPLIT


def test_instances_are_unique_and_bucketed():
    pairs = cat.all_instances()
    assert len(pairs) == len(set(pairs))
    nts = {dict(i.defines).get("SK_NT") for op, i in pairs if dict(i.defines)["SK_FAMILY"] != 1}
    assert nts == {1, 2, 4, 8}
    mts = {dict(i.defines)["SK_MT"] for op, i in pairs if dict(i.defines)["SK_FAMILY"] == 1}
    most = max(cfg.tokens for cfg in cat.VARIANTS[ROUTER].values() if isinstance(cfg, cat.Narrow))
    assert mts == set(range(1, most + 1))  # exact token counts, up to the largest M a narrow variant serves
    narrow = cat.Narrow(rows=2, tokens=16)
    assert [dict(narrow.instance(ROUTER, m, "float32").defines)["SK_MT"] for m in (1, 3, 5, 8, 9, 16)] == [1, 3, 5, 8, 9, 16]
    assert {op for op, _ in pairs} == {ROUTER, FUSED_A}
    assert {op for op, i in pairs if dict(i.defines)["SK_FAMILY"] == 1} == {ROUTER, FUSED_A}
    assert {op for op, i in pairs if dict(i.defines)["SK_FAMILY"] == 2} == {ROUTER}
    assert {op for op, i in pairs if dict(i.defines)["SK_FAMILY"] == 3} == {FUSED_A}
    assert {op for op, i in pairs if dict(i.defines)["SK_FAMILY"] == 4} == {ROUTER}


def test_narrow_straight_line_instance_only_for_its_shape():
    exact = cat.Narrow(rows=2, tokens=16, exactk=7168)

    def has_exact(m, shape):
        return "SK_EXACTK" in dict(exact.instance(ROUTER, m, "float32", shape).defines)

    # K fitted (exactk, or a smaller K of whole warps of chunks) and E a multiple of rows; None = the tuned shape
    assert all(has_exact(m, None) for m in (1, 5, 8, 9, 16))
    assert has_exact(5, (256, 7168)) and has_exact(5, (384, 7168)) and has_exact(12, (256, 7168))
    assert has_exact(5, (256, 4096))
    assert not has_exact(5, (256, 4104)) and not has_exact(5, (255, 7168))
    generic = exact.instance(ROUTER, 5, "float32", (256, 4104))
    assert generic == cat.Narrow(rows=2, tokens=16).instance(ROUTER, 5, "float32")  # the plain generic instance


def test_generic_body_window_is_per_shape():
    """generic_tokens: the generic body (any other shape) serves fewer M than the straight-line one;
    selection, instances() and the instance itself agree on it, and a call past it falls back."""
    cfg = cat.Narrow(rows=3, cpt=1, threads=896, tokens=9, generic_tokens=6, exactk=7168)
    assert cfg.max_m() == cfg.max_m((384, 7168)) == 9
    assert cfg.max_m((256, 7168)) == cfg.max_m((384, 4104)) == cfg.max_m(cat.ANY_SHAPE) == 6
    assert cfg.max_m((384, 4096)) == 9  # fitted: 512 threads
    assert cat.variant_serves(cfg, ROUTER, 9, (384, 7168)) and not cat.variant_serves(cfg, ROUTER, 7, (256, 7168))
    with pytest.raises(ValueError, match="M <= 6"):
        cfg.instance(ROUTER, 7, "float32", (256, 7168))
    listed = cat.instances(ROUTER, cfg)
    assert cfg.instance(ROUTER, 9, "float32") in listed and cfg.instance(ROUTER, 6, "float32", cat.ANY_SHAPE) in listed
    assert not any("SK_EXACTK" not in dict(i.defines) and dict(i.defines)["SK_MT"] > 6 for i in listed)
    for bad in (dict(generic_tokens=10), dict(generic_tokens=-1), dict(exactk=0, generic_tokens=2)):
        with pytest.raises(ValueError, match="generic_tokens"):
            cat.Narrow(**{**dict(rows=3, tokens=9, exactk=7168), **bad})
    name = next(n for n, c in cat.VARIANTS[ROUTER].items() if getattr(c, "generic_tokens", 0))
    real = cat.VARIANTS[ROUTER][name]
    m, other = real.generic_tokens + 1, (real.rows * 64 + 1, real.exactk)
    assert routed.config_for(ROUTER, m, name)[0] == name
    assert routed.config_for(ROUTER, m, name, other)[0] == cat.FALLBACK_VARIANT


def test_catalogue_lists_both_bodies_and_caps_only_the_straight_line_one():
    """precompile and the AOT baseline build what a call can launch: for an exact-K narrow
    configuration that is the straight-line instance and, for other shapes, the generic one."""
    capped = cat.Narrow(rows=2, tokens=7, regs=72, exactk=7168)
    straight = dict(capped.instance(ROUTER, 6, "float32").defines)
    generic = dict(capped.instance(ROUTER, 6, "float32", cat.ANY_SHAPE).defines)
    assert straight["SK_MAXNREG"] == 72 and straight["SK_EXACTK"] == 7168
    assert "SK_MAXNREG" not in generic and "SK_EXACTK" not in generic  # the generic body spills under 72
    assert dict(cat.Narrow(rows=2, regs=72).instance(ROUTER, 6, "float32").defines)["SK_MAXNREG"] == 72
    listed = {i for op, i in cat.all_instances() if op == ROUTER}
    for name, cfg in cat.VARIANTS[ROUTER].items():
        if getattr(cfg, "exactk", 0):
            for m in range(1, cfg.max_m() + 1):
                for shape in (None, cat.ANY_SHAPE):
                    if m <= cfg.max_m(shape):
                        assert cfg.instance(ROUTER, m, "bfloat16", shape) in listed, (name, m, shape)
    assert not cat.Narrow(rows=2).exact_for(None)


def test_one_round_narrow_bodies_are_fitted_to_smaller_k():
    wide = cat.VARIANTS[ROUTER]["narrow_r2t896"]  # 896 threads x 1 chunk: K = 7168 in one round
    defines = dict(wide.instance(ROUTER, 3, "float32", (512, 4096)).defines)
    assert defines["SK_EXACTK"] == 4096 and defines["SK_THREADS"] == 512  # every lane loads one chunk
    assert wide.geometry(512, 4096, 132) == ((256, 1, 1), (512, 1, 1), None)
    assert wide.smem(3, (512, 4096)) == 2 * 3 * 512 * 4 < wide.smem(3) == 2 * 3 * 896 * 4
    assert wide.instance(ROUTER, 3, "float32", (512, 7168)) == wide.instance(ROUTER, 3, "float32")
    # the K=6144 configuration's own instance is the K=7168 one's fitted to 6144
    assert wide.instance(ROUTER, 5, "float32", (256, 6144)) == \
        cat.VARIANTS[ROUTER]["narrow_r2t768k6"].instance(ROUTER, 5, "float32", (256, 6144))
    for k in (4104, 8192, 0):  # not a whole number of warps of chunks, past the block, no K: generic body
        assert wide.fitted_threads(k) == 0 and wide.block((512, k)) == 896
        assert "SK_EXACTK" not in dict(wide.instance(ROUTER, 3, "float32", (512, k)).defines)
    assert not wide.exact_for((511, 4096))  # N not a multiple of the rows
    assert cat.VARIANTS[ROUTER]["narrow_r7"].fitted_threads(4096) == 0  # K = 7168 in two rounds: K alone
    assert cat.VARIANTS[ROUTER]["narrow_r2k6"].fitted_threads(7168) == 0  # never past its own block
    # one kernel, two names: tune times it once (first_alike), where both serve and only there
    assert cat.first_alike(ROUTER, 5, "float32", (256, 6144), 132)["narrow_r2t768k6"] == "narrow_r2t896"
    at_7168 = cat.first_alike(ROUTER, 5, "float32", (256, 7168), 132)
    assert at_7168["narrow_r2t768k6"] == "narrow_r2t768k6" and at_7168["narrow_r2t896"] == "narrow_r2t896"
    # at K = 7168 the K = 6144 pair runs one generic body (the cap is the straight-line body's): alike too
    assert {name: first for name, first in at_7168.items() if first != name} == {
        "narrow_r2t384k6c104": "narrow_r2t384k6", "narrow_r2t384k6c128": "narrow_r2t384k6"}
    assert cat.first_alike(ROUTER, 12, "float32", (256, 6144), 132)["narrow_r2t768k6"] == "narrow_r2t768k6"
    assert "narrow_r2t896" not in cat.first_alike(ROUTER, 12, "float32", (256, 6144), 132)  # M past its window
    # the window follows the body: generic_tokens where the shape gets the generic one
    r4 = cat.VARIANTS[ROUTER]["narrow_r4t896"]
    assert r4.max_m((512, 4096)) == 16 and r4.max_m((512, 4104)) == r4.generic_tokens == 4


def test_geometry():
    assert cat.Skinny(rt=4, warps=4).geometry(2112, 7168, 132)[0] == (33, 4, 1)
    assert cat.Skinny(rt=1, warps=4).geometry(256, 7168, 132) == ((16, 8, 1), (128, 1, 1), (1, 8, 1))
    assert cat.Narrow(rows=3).geometry(384, 7168, 132) == ((128, 1, 1), (448, 1, 1), None)
    assert cat.Stream().geometry(2112, 7168, 132) == ((132, 1, 1), (256, 1, 1), None)
    assert cat.Stream(rt=2).geometry(2624, 6144, 132) == ((82, 1, 1), (256, 1, 1), None)
    assert cat.Stream(stages=16).stages_for(1) == 16 > cat.Stream(stages=16).stages_for(9) >= 2
    assert cat.Stream().max_m() == 32 and not cat.variant_serves(cat.Stream(), FUSED_A, 33)
    assert cat.Skinny(stages=16, warps=8).stages_for(9) < 16 <= cat.Skinny(stages=16, warps=8).stages_for(1) + 1
    # direct: 16-row tiles, K split over a cluster of `split` (never more ranks than 32-k blocks)
    assert cat.Direct(split=8).geometry(384, 7168, 132) == ((24, 8, 1), (128, 1, 1), (1, 8, 1))
    assert cat.Direct(warps=2, split=16).geometry(250, 7168, 132) == ((16, 16, 1), (64, 1, 1), (1, 16, 1))
    assert cat.Direct(split=8).geometry(256, 64, 132) == ((16, 2, 1), (128, 1, 1), (1, 2, 1))
    assert cat.Direct(split=8).geometry(256, 24, 132) == ((16, 1, 1), (128, 1, 1), None)
    assert cat.Ring(tk=128, warps=4, loaders=1, split=8).geometry(384, 7168, 132) == ((24, 8, 1), (192, 1, 1), (1, 8, 1))
    assert cat.Ring(tk=128, split=8).geometry(256, 256, 132)[2] == (1, 2, 1)  # never more ranks than stages
    # sliced: a CTA per 8 rows over the whole K, no cluster
    assert cat.Sliced(warps=14).geometry(256, 7168, 132) == ((32, 1, 1), (448, 1, 1), None)
    assert cat.Sliced(warps=16).geometry(900, 7168, 132) == ((113, 1, 1), (512, 1, 1), None)


def test_direct_instances_bucket_tokens_and_refuse_past_16():
    d = cat.Direct(warps=4, bpw=7, split=8)
    one, two = (dict(d.instance(ROUTER, m, "float32").defines) for m in (8, 9))
    assert (one["SK_FAMILY"], one["SK_NT"], one["SK_CW"], one["SK_BPW"]) == (4, 1, 4, 7) and two["SK_NT"] == 2
    assert d.instance(ROUTER, 1, "bfloat16") == d.instance(ROUTER, 8, "bfloat16") != d.instance(ROUTER, 8, "float32")
    assert d.max_m() == 16 and not cat.variant_serves(d, ROUTER, 17) and not cat.variant_serves(d, FUSED_A, 1)
    with pytest.raises(ValueError, match="serves M <= 16"):
        d.instance(ROUTER, 17, "float32")
    assert d.smem(8) < d.smem(9) == (4 + 1) * 2 * 128 * 4


def test_rules_parse_and_reject():
    rules = tile_rules.parse_rules("8:kernel=narrow,rows=3;64:rt=1,stages=8", ROUTER)
    assert rules[0] == (8, cat.Narrow(rows=3)) and rules[1] == (64, cat.Skinny(rt=1, stages=8))
    assert tile_rules.rule_for(rules, 9) == cat.Skinny(rt=1, stages=8)
    for bad, match in [("rt=0", "rt 1..8"), ("8:rt=1", "cover M up to"), ("foo=1", "keys of kernel=skinny"),
                       ("kernel=narrow,tokens=8", "serves M <= 8"), ("kernel=narrow,tokens=17", "tokens 1..16"),
                       ("kernel=narrow,exactk=7164", "exactk 0 or a positive multiple of 8"),
                       ("kernel=narrow,plain=2", "plain and late 0 or 1"),
                       ("kernel=narrow,late=2", "plain and late 0 or 1"), ("kernel=narrow,regs=8", "regs 0 or 24..255"),
                       ("kernel=direct,warps=9", r"Direct\(warps=9.*need warps 1..8"),
                       ("kernel=direct,bpw=0", r"bpw=0.*bpw 1..16"), ("kernel=direct,split=17", r"split=17.*split 1..16"),
                       ("32:kernel=direct;64:rt=1", "serves M <= 16"),
                       ("kernel=bogus", "kernel must be one of"), ("rt=x", "want an integer"), ("x:rt=1", "MAXM")]:
        with pytest.raises(ValueError, match=match):
            tile_rules.parse_rules(bad, ROUTER)


def test_env_rules_are_checked_when_a_call_is_planned(monkeypatch):
    monkeypatch.setenv(jb.env_var(ROUTER), "kernel=narrow")
    routed._RULES.pop(ROUTER, None)
    with pytest.raises(ValueError, match="SLIM_KERNEL_JIT_CONFIG_DSV3_ROUTER_GEMM"):
        jb.rules(ROUTER)
    monkeypatch.setenv(jb.env_var(ROUTER), "8:kernel=narrow,rows=1;64:rt=2")
    routed._RULES.pop(ROUTER, None)
    assert jb.config_for(ROUTER, 3, "skinny") == ("rules", cat.Narrow(rows=1))
    routed._RULES.pop(ROUTER, None)
    monkeypatch.delenv(jb.env_var(ROUTER))
    assert jb.config_for(ROUTER, 3, "narrow_r2kc") == ("narrow_r2kc", cat.VARIANTS[ROUTER]["narrow_r2kc"])
    assert jb.config_for(ROUTER, 20, "narrow_r2kc")[0] == cat.FALLBACK_VARIANT  # narrow cannot serve M=20
    assert jb.config_for(ROUTER, 3, "gone")[0] == cat.FALLBACK_VARIANT


def _nvcc() -> str | None:
    return os.environ.get("NVCC") or shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found")
def test_smem_formulas_match_the_kernels(tmp_path):
    # The host mirrors in catalogue.py must equal the .cuh constexprs the kernels check at entry.
    cases = []
    for op, variants in cat.VARIANTS.items():
        for cfg in variants.values():
            for m in (1, 2, 5, 9, 17, 40):
                if m > cfg.max_m():
                    continue
                d = dict(cfg.instance(op, m, cat.OUT_DTYPES[op][0]).defines)
                if isinstance(cfg, cat.Skinny):
                    expr = f"slim::skinny_smem_bytes({d['SK_RT']}, {d['SK_NT']}, {d['SK_STAGES']}, {cfg.warps})"
                elif isinstance(cfg, cat.Ring):
                    expr = f"slim::ring_smem_bytes({d['SK_NT']}, {d['SK_TK']}, {d['SK_STAGES']}, {d['SK_CW']})"
                elif isinstance(cfg, cat.Direct):
                    expr = f"slim::direct_smem_bytes({d['SK_NT']}, {d['SK_CW']})"
                elif isinstance(cfg, cat.Stream):
                    expr = (f"slim::stream_smem_bytes({d['SK_NT']}, {d['SK_STAGES']}, {d['SK_PIECES']}, "
                            f"{d.get('SK_RT', 1)})")
                elif isinstance(cfg, cat.Sliced):
                    expr = f"slim::sliced_smem_bytes({d['SK_NT']}, {d['SK_CW']})"
                else:
                    expr = f"slim::narrow_smem_bytes({d['SK_ROWS']}, {d['SK_MT']}, {d['SK_THREADS']})"
                cases.append((expr, cfg.smem(m)))
    src = tmp_path / "formulas.cu"
    body = "\n".join(f'    printf("%d\\n", {expr});' for expr, _ in cases)
    src.write_text('#include <cstdio>\n#include "skinny_gemm.cuh"\n#include "narrow_gemm.cuh"\n#include "ring_gemm.cuh"\n'
                   '#include "direct_gemm.cuh"\n#include "stream_gemm.cuh"\n#include "sliced_gemm.cuh"\n'
                   f'int main() {{\n{body}\n    return 0;\n}}\n')
    exe = tmp_path / "formulas"
    proc = subprocess.run([_nvcc(), "-std=c++17", "-I", str(KERNELS), str(src), "-o", str(exe)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    printed = [int(x) for x in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()]
    assert printed == [want for _, want in cases]


def test_fast_eligibility_check_agrees_with_the_detailed_one():
    # The hot-path check must accept exactly what the detailed (reason-giving) check accepts.
    big = torch.randn(70, 7300).to(torch.bfloat16)
    seen = 0
    for m in (1, 3, 16, 64, 65):
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
    assert "outside" in jb.router_check(torch.empty(65, 256), big[:65, :7168], torch.randn(256, 7168).bfloat16())


def test_fused_a_has_the_narrow_bodies_k_fitted():
    r2 = cat.VARIANTS[FUSED_A]["narrow_r2t896"]
    assert cat.variant_serves(r2, FUSED_A, 10) and not cat.variant_serves(r2, FUSED_A, 11)
    inst = dict(r2.instance(FUSED_A, 5, "bfloat16", (576, 2048)).defines)
    assert inst["SK_FAMILY"] == 1 and inst["SK_EXACTK"] == 2048 and inst["SK_THREADS"] == 256  # K / 8 threads
    assert "SK_OUT_BF16" not in inst  # fused-A's output is bf16 by its source
    assert r2.geometry(576, 2048, 132) == ((288, 1, 1), (256, 1, 1), None)
    with pytest.raises(ValueError, match="float32"):
        r2.instance(FUSED_A, 5, "float32", (576, 2048))


@pytest.mark.parametrize("rows,cpt,m,nvcc", [(1, 1, 5, 40), (2, 1, 5, 48), (4, 1, 1, 48), (8, 1, 4, 96),
                                             (2, 2, 8, 104), (1, 4, 4, 108)])
def test_narrow_register_model_tracks_nvcc(rows, cpt, m, nvcc):
    # nvcc 13.0's sm_90a counts of straight-line bodies fitted to K=2048 (threads = K / (8 cpt): no block bound bites)
    cfg = cat.Narrow(rows=rows, cpt=cpt, threads=896 // cpt, tokens=16, exactk=7168)
    got = cfg.registers(m, (840, 2048))
    assert got % 8 == 0 and nvcc <= got <= 1.25 * nvcc  # never fewer: CTAs per SM are never overestimated


def test_narrow_registers_stop_at_the_block_bound_and_the_cap():
    wide = cat.VARIANTS[ROUTER]["narrow_r4t896"]  # 896 threads at K = 7168: one CTA per SM, 72 registers at most
    assert wide.registers(16, (840, 7168)) == 72 and wide.registers(1, (840, 7168)) < 72
    capped = cat.VARIANTS[ROUTER]["narrow_r2k6c"]  # 384 threads under a 104-register cap
    assert capped.registers(12, (256, 6144)) == 104
    assert capped.registers(12, (256, 6000)) > 104  # the generic body is uncapped (Narrow.instance)


def test_the_estimate_places_narrow_ctas_by_their_registers():

    # M=5, two rows per CTA (48 registers): 320 threads fit 4 CTAs per SM, one wave of 528 at 1056x2560;
    # 384 threads fit 3, so 1088x3072's 544 CTAs take two (1.19x the best anchor there, 0.92x at 1056x2560)
    assert Geometry().grid(FUSED_A, "jit:narrow_r2t896", 1056, 2560, 5, 132) == (528, 528)
    assert Geometry().grid(FUSED_A, "jit:narrow_r2t896", 1088, 3072, 5, 132) == (544, 396)


def test_per_arch_limits_come_from_one_table():
    from slim_kernel.jit.arch import LIMITS, limits

    assert limits("sm_90a").smem_per_block == cat.MAX_SMEM == 227 * 1024 and limits("9.0").sms == 132
    assert limits("sm_100a").sms == 148
    assert limits("sm_120a").smem_per_block == 99 * 1024 and limits("12.0a").threads_per_sm == 1536
    # an architecture not in the table gets the most restrictive limits there, never sm_90's by default
    assert limits("sm_110a") == min(LIMITS.values(), key=lambda lim: lim.smem_per_block) == limits("sm_120")
    # configurations that need more than sm_120's 99 KiB per CTA exist: the JIT backend declines them there
    assert any(cfg.smem(16) > limits("sm_120").smem_per_block
               for op in cat.VARIANTS for cfg in cat.VARIANTS[op].values() if cat.variant_serves(cfg, op, 16))


def test_variant_names_follow_one_rule_and_old_names_stay_aliases():
    import re

    rule = re.compile(r"(skinny|narrow|ring|direct|stream|sliced)(_([rtnkcsawp]\d+|[gl])+)?")
    for op, named in cat.VARIANTS.items():
        for name in named:
            assert rule.fullmatch(name), f"{op} {name}"
        for old, new in cat.ALIASES[op].items():
            assert old not in dict(named) and new in dict(named)  # aliases are not listed, only found
            assert named[old] is named[new] and named.get(old) is named[new] and old in named
    # an old name in a routing table or a tool binds the same configuration
    assert jb.config_for(ROUTER, 10, "direct_c8")[1] is cat.VARIANTS[ROUTER]["direct_s8"]
    assert cat.VARIANTS[FUSED_A]["stream_r2"].rt == 2 and cat.VARIANTS[ROUTER]["narrow_r2k6c"].regs == 104


def test_family_ids_have_one_home_the_entry_points_agree():
    import re

    ids = {cls.kernel: cls.family for cls in cat.FAMILIES.values()}
    assert sorted(ids.values()) == list(range(len(ids)))
    for op, (source, _) in cat.SOURCES.items():
        text = (Path(cat.__file__).parent / "kernels" / source).read_text()
        listed = dict((name, int(i)) for i, name in re.findall(r"(\d) (skinny|narrow|ring|direct|stream|sliced)",
                                                                  text.split("SK_FAMILY", 2)[2].splitlines()[0]))
        assert listed and all(ids[name] == i for name, i in listed.items()), (source, listed)
        served = {cfg.kernel for cfg in cat.VARIANTS[op].values()}
        assert served <= set(listed), (source, served)
