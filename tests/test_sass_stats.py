"""benchmark/sass_stats.py (CPU): per-instance registers, spills and SASS counts from a real compile."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slim_kernel.jit import cache
from slim_kernel.jit import catalogue as cat

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import sass_stats  # noqa: E402


@pytest.mark.needs_compiler("nvrtc")
def test_counts_follow_the_instance(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path))
    cache.clear_memory()
    try:
        rows = sass_stats.instance_rows("dsv3_router_gemm", ["narrow_r1kc"], [1, 3, 99], "float32", "nvrtc")
    finally:
        cache.clear_memory()
    assert [r[0] for r in rows] == ["narrow_r1kc M=1", "narrow_r1kc M=3"]  # M=99 is not served: no row
    (_, regs1, spill1, total1, ffma1, *_), (_, regs3, _, total3, ffma3, *_) = rows
    assert regs1 > 0 and spill1 == 0 and total1 > ffma1 > 0
    # one weight row, 8 elements per 16-byte chunk, 2 chunks per thread: 16 FMAs per token in each body
    assert ffma3 > ffma1 and (ffma3 - ffma1) % (2 * 16) == 0 and total3 > total1 and regs3 >= regs1


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        sass_stats.main(["--ms", "1,x"])
    assert "--ms" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sass_stats.main(["--op", "dsv3_fused_a_gemm", "--out-dtype", "float32"])
    assert "--out-dtype" in capsys.readouterr().err


# Every configuration whose weight and activation loads share a thread: the weight loads of one round
# (narrow, direct, sliced: into registers) or of the ring's first STAGES-1 blocks (skinny: cp.async) before the
# PDL wait (ACQBULK), every activation load after it. ptxas keeps that order for coherent loads and
# cp.async, not for ld.global.nc (kernels/ptx.cuh): with .nc it put the wait before the weights (narrow:
# 0 loads before it) or after the activations (direct_c8: 21 at M=4, narrow_r7: 11). ring and stream
# load weights and activations from different warps (one branch waits, the other does not).
SHARED_LOADERS = [(op, name) for op in cat.VARIANTS for name, cfg in cat.VARIANTS[op].items()
                  if cfg.kernel in ("narrow", "direct", "skinny", "sliced")]


def _weight_loads_before_wait(cfg, m: int) -> tuple[str, int]:
    """(SASS opcode, count) of one thread's weight loads that must precede the PDL wait."""
    if cfg.kernel == "narrow":
        return "LDG", cfg.rows * cfg.cpt
    if cfg.kernel == "direct":
        return "LDG", 2 * cfg.bpw
    if cfg.kernel == "sliced":
        return "LDG", cfg.bpw
    return "LDGSTS", (cfg.stages_for(m) - 1) * 2 * cfg.rt


@pytest.mark.needs_compiler("nvrtc")
@pytest.mark.parametrize("op,variant", SHARED_LOADERS)
def test_weights_load_before_the_pdl_wait_and_activations_after(op, variant, tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path))
    cache.clear_memory()
    cfg = cat.VARIANTS[op][variant]
    try:
        for m in sorted({1, cfg.max_m()}):
            _, ops = sass_stats.instance_sass(op, cfg, m, cat.OUT_DTYPES[op][0], "nvrtc")
            assert ops.count("ACQBULK") == 1, f"{variant} M={m}: {ops.count('ACQBULK')} PDL waits"
            opcode, weights = _weight_loads_before_wait(cfg, m)
            before = ops[:ops.index("ACQBULK")].count(opcode)
            assert before == weights, f"{variant} M={m}: {before} {opcode} before the PDL wait, want {weights}"
    finally:
        cache.clear_memory()
