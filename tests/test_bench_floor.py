"""benchmark/bench_floor.py on the CPU: the streaming-read probe compiles for sm_90a with nvcc within the limits its
source declares (no spills), the sweep's arguments are checked, and the sweep keeps only what fits an SM."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slim_kernel.jit import cache
from slim_kernel.jit.arch import limits
from slim_kernel.jit.resources import check_limits
from slim_kernel.jit.sources import declared_limits
from slim_kernel.jit.spec import KernelInstance

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import bench_floor  # noqa: E402


def test_arguments_parse_and_reject(capsys):
    args = bench_floor.parse_args(["--json", "x.json", "--stages", "4,16,4", "--copy-kb", "2"])
    assert args.stages == (4, 16) and args.copy_kb == (2,) and args.stage_kb == (8, 16, 32)
    assert args.ctas_per_sm == (1, 2)
    for bad in (["--stages", "1"], ["--stages", "49"], ["--stage-kb", "8,x"], ["--copy-kb", ""],
                ["--ctas-per-sm", "0"], ["--stages", "-4"]):
        with pytest.raises(SystemExit):
            bench_floor.parse_args(["--json", "x.json", *bad])
        assert bad[0] in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_floor.parse_args([])  # --json is required
    assert "--json" in capsys.readouterr().err


def test_the_sweep_keeps_what_fits_an_sm():
    lim = limits("sm_90a")
    cfgs = bench_floor.configs(bench_floor.parse_args(["--json", "x"]), lim)
    assert cfgs and all(c["smem"] <= lim.smem_per_block for c in cfgs)
    assert all(c["ctas_per_sm"] * (c["smem"] + lim.smem_reserved_per_cta) <= lim.smem_per_sm for c in cfgs)
    got = {(c["stages"], c["stage_bytes"] >> 10, c["ctas_per_sm"]) for c in cfgs}
    assert (16, 8, 1) in got and (4, 32, 1) in got and (4, 16, 2) in got
    assert (16, 16, 1) not in got and (8, 16, 2) not in got  # 256 KiB rings; 2 x 129 KiB per SM
    odd = bench_floor.configs(bench_floor.parse_args(["--json", "x", "--stage-kb", "6", "--copy-kb", "4"]), lim)
    assert odd == []  # a copy must divide its stage


def test_cases_are_the_model_weights():
    got = {(n, k) for _, n, k in bench_floor.cases()}
    assert {(2112, 7168), (3648, 7168), (2624, 6144), (256, 7168), (384, 7168)} <= got


@pytest.mark.needs_compiler("nvcc")
@pytest.mark.parametrize("stages,stage_kb,copy_kb", [(4, 8, 1), (16, 8, 4), (4, 32, 32)])
def test_probe_compiles_for_sm90a_without_spills(stages, stage_kb, copy_kb, tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(tmp_path))
    cache.clear_memory()
    inst = KernelInstance.make(str(bench_floor.PROBE), "floor_probe", "plp", FP_STAGES=stages,
                               FP_STAGE=stage_kb * 1024, FP_COPY=copy_kb * 1024)
    try:
        entry = cache.get_entry(inst, "sm_90a", "nvcc")
    finally:
        cache.clear_memory()
    assert entry.cubin[:4] == b"\x7fELF" and entry.header["arch"] == "sm_90a"
    limits_declared = declared_limits(inst)
    assert limits_declared.get("max_spill_bytes") == 0
    assert entry.usage is not None and entry.usage.registers > 0
    assert check_limits(entry.usage, limits_declared) == []


@pytest.mark.parametrize("rows,k,grid", [(37, 24, 8), (16, 64, 3), (2, 8, 5)])
def test_host_fold_follows_the_probes_split(rows, k, grid):
    # floor_probe.cuh: CTA b reads 16-byte words [b * per, (b + 1) * per) (clipped), per = ceil(words / grid),
    # and stores the xor of their 32-bit words; fresh random bytes, a plain loop as the reference
    import torch

    w = torch.randn(rows, k).to(torch.bfloat16)
    words = w.reshape(-1).view(torch.int32).tolist()
    units = len(words) // 4
    per = -(-units // grid)
    want = []
    for b in range(grid):
        x = 0
        for v in words[4 * min(units, b * per):4 * min(units, (b + 1) * per)]:
            x ^= v
        want.append(x)
    got = bench_floor.expected_folds(w, grid).tolist()
    assert got == want and any(want)
