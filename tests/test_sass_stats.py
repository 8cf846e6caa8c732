"""benchmark/sass_stats.py (CPU): per-instance registers, spills and SASS counts from a real compile."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slim_kernel.jit import cache
from slim_kernel.jit import catalogue as cat
from slim_kernel.names import ROUTER

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


# Every configuration that loads through registers: one round's weight loads per thread before the
# PDL wait (ACQBULK), every activation load after it. ptxas keeps that order only for coherent loads
# (kernels/ptx.cuh); with ld.global.nc it put the wait before the weights (narrow: 0 loads before it)
# or after the activations (direct: 21 at M=4, narrow_r7: 11).
REGISTER_LOADERS = [name for name, cfg in cat.VARIANTS[ROUTER].items() if cfg.kernel in ("narrow", "direct")]


@pytest.mark.needs_compiler("nvrtc")
@pytest.mark.parametrize("variant", REGISTER_LOADERS)
def test_weights_load_before_the_pdl_wait_and_activations_after(variant, tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path))
    cache.clear_memory()
    cfg = cat.VARIANTS[ROUTER][variant]
    weights = cfg.rows * cfg.cpt if cfg.kernel == "narrow" else 2 * cfg.bpw  # per thread and round
    try:
        for m in sorted({1, cfg.max_m()}):
            _, ops = sass_stats.instance_sass(ROUTER, cfg, m, "float32", "nvrtc")
            assert ops.count("ACQBULK") == 1, f"{variant} M={m}: {ops.count('ACQBULK')} PDL waits"
            before = ops[:ops.index("ACQBULK")].count("LDG")
            assert before == weights, f"{variant} M={m}: {before} global loads before the PDL wait, want {weights}"
    finally:
        cache.clear_memory()
