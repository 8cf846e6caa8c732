"""The benchmark helpers that need no GPU: profile_gemm's case specs, pm_series' reading of an ncu
PM-sampling raw page, the results' readers and the decode-step summary's floor column."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import pm_series  # noqa: E402
import profile_gemm  # noqa: E402


def test_profile_cases_parse_and_reject():
    from slim_kernel import models

    assert profile_gemm.parse_case("fused_a@1,8,16") == (models.fused_a(2112, 7168), [1, 8, 16])
    assert profile_gemm.parse_case("fused_a:3648,7168@4") == (models.fused_a(3648, 7168), [4])
    assert profile_gemm.parse_case("router:384@4,8") == (models.router(384, 7168, "float32"), [4, 8])
    assert profile_gemm.parse_case("router:256,6144,bf16@9-11") == (models.router(256, 6144, "bfloat16"), [9, 10, 11])
    for bad, match in [("router@1", "expected"), ("fused_a:3@1", "N,K"), ("router:x@1", "E,K"),
                       ("router:384,7168,half@1", "float32 or bfloat16"), ("bmm@1", "expected")]:
        with pytest.raises(ValueError, match=match):
            profile_gemm.parse_case(bad)


def _pm_page(path: Path, dram: str, failed: bool = False) -> None:
    head = ["ID", "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg", "Kernel Name",
            *pm_series.SERIES.values(), "gpu__time_duration.sum", "profiler__pmsampler_interval_time"]
    row = ["0", '12  "<default domain>:dsv3_router_gemm M=8 jit:direct_c8:none:none" ', "dsv3_router_gemm_kernel",
           dram, "(0; 1; 2; 3; 4; 5; 6; 7; 8)", "128 (0; 0; 0; 128; 0; 0; 0; 0; 0)", "6.43", "1.50 (1.50)"]
    # a result whose replay failed (the driver's LaunchFailed under --graph-profiling graph)
    broken = ["1", '"<default domain>:M=10 after pdl:none"', "graph", "no data", "no data", "no data", "nan", "no data"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerows([head, [""] * len(head), row] + ([broken] if failed else []))


@pytest.mark.parametrize("failed", [False, True], ids=["clean", "with-a-failed-result"])
def test_pm_series_cuts_each_kernel_to_its_samples(tmp_path, capsys, failed):
    _pm_page(tmp_path / "pm.csv", "(0; 0; 0; 0.2; 5; 73; 0.4; 0; 0)", failed)
    assert pm_series.main(str(tmp_path / "pm.csv")) == 0
    captured = capsys.readouterr()
    assert ("skipped" in captured.err and "M=10 after pdl" in captured.err) == failed
    out = json.loads(captured.out)
    (k,) = out["kernels"]
    assert k["nvtx"] == "dsv3_router_gemm M=8 jit:direct_c8" and k["kernel"] == "dsv3_router_gemm_kernel"
    assert (k["duration_us"], k["interval_us"], k["samples_from"]) == (6.43, 1.5, 2)
    assert k["dram_read_pct"] == [0.0, 0.2, 5.0, 73.0, 0.4, 0.0]  # two samples each side of the busy ones
    assert k["l2_throughput_pct"] == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0] and k["ctas_launched"][1] == 128


def test_pm_series_refuses_a_page_without_the_series(tmp_path):
    (tmp_path / "ncu.csv").write_text('"ID","Kernel Name"\n"",""\n"0","k"\n')
    with pytest.raises(ValueError, match="not a PM-sampling raw page"):
        pm_series.main(str(tmp_path / "ncu.csv"))


def test_carveout_ab_times_the_picks_whose_carveout_the_room_changes():
    import carveout_ab as ab

    from slim_kernel.jit import catalogue as cat
    from slim_kernel.names import FUSED_A, ROUTER

    table = json.loads((Path(ab.ROOT) / "python/slim_kernel/tables/routing_sm90.json").read_text())
    todo = ab.points(table, "0.7.4", 32768, 132, 228 * 1024)
    assert set(ab.GLM5) <= set(todo)
    assert todo[(ROUTER, (256, 6144, "float32"), 10)] >= {"jit:narrow_r2t384k6c104"}
    for (op, (n, k, _), _m), names in todo.items():
        for name in names:  # cluster launches keep the driver's carveout: never an A/B point of their own
            assert cat.VARIANTS[op][name[4:]].geometry(n, k, 132)[2] is None or (op, n) in ((ROUTER, 256), (FUSED_A, 2624))
    assert len(ab.points(table, "0.7.4", 1, 132, 228 * 1024)) < len(todo)  # less room, fewer changes
    assert ab.capacity(31744 + 1024) == 32 and ab.capacity(32769) == 64 and ab.capacity(300 * 1024) == 228


def test_warm_flashinfer_lists_its_steps_before_slim_kernel_is_installed(tmp_path):
    # gpu_run.sh lists the steps before it installs slim-kernel: a bare machine has none, and the list must not be empty
    import os
    import subprocess

    fake = tmp_path / "flashinfer"
    fake.mkdir()
    for name in ("__init__.py", "gemm.py", "norm.py"):
        (fake / name).write_text("")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp_path)}
    script = Path(__file__).resolve().parents[1] / "benchmark" / "warm_flashinfer.py"
    proc = subprocess.run([sys.executable, str(script), "--list"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    steps = proc.stdout.splitlines()
    assert proc.returncode == 0 and "rmsnorm" in steps, proc.stdout + proc.stderr
    assert "tinygemm_n2624_k6144_m1_pdl" in steps and not any("unavailable" in s for s in steps)


@pytest.mark.parametrize("op,n,k,expected", [
    ("dsv3_router_gemm", 256, 7168, {"sglang:tiny_gemm", "sglang:router"}),
    ("dsv3_router_gemm", 384, 6144, {"sglang:tiny_gemm", "sglang:router"}),
    ("dsv3_router_gemm", 896, 7168, {"sglang:tiny_gemm"}),  # sglang's router does not build for 896 experts
    ("dsv3_router_gemm", 128, 7168, {"sglang:tiny_gemm"}),
    ("dsv3_fused_a_gemm", 2624, 6144, {"sglang:tiny_gemm", "sglang:fused_a"}),
])
def test_sglang_anchors_only_where_sglang_builds(op, n, k, expected):
    import types

    import anchors
    import torch

    built = []
    tiny = types.SimpleNamespace(can_use_tiny_gemm=lambda *a: True)
    router = types.SimpleNamespace(dsv3_router_gemm_module=lambda *a: built.append(a))
    fused_a = types.SimpleNamespace(dsv3_fused_a_gemm_module=lambda *a: built.append(a))
    anc = anchors.Anchors.__new__(anchors.Anchors)
    anc.notes, anc.fi_gemm = [], None
    anc.sgl = (tiny, router, fused_a, lambda jobs: [job() for job in jobs])
    shape = types.SimpleNamespace(op=op, n=n, k=k, out="float32" if op == "dsv3_router_gemm" else "bfloat16")
    impls = anc.for_shape(shape, types.SimpleNamespace(m=4, out_dtype=getattr(torch, shape.out)))
    assert {name for name in impls if name.startswith("sglang:")} == expected
    tiny.can_use_tiny_gemm = lambda *a: False  # the warm-up builds the router or fused-A module only where it serves
    anc.warm_sglang([shape])
    assert len(built) == (expected != {"sglang:tiny_gemm"}) and not anc.notes


def test_timeline_pairs_each_gemm_with_its_producer():
    import timeline

    # P0 opens the graph (no pair); P1-G1 (launched 0.5 early, next producer resident 0.2 before its end),
    # P2-G2 as two kernels (a GEMM may launch more than one), then P3
    trace = [("P", 0.0, 1.0), ("P", 2.0, 3.0), ("G", 2.5, 5.0), ("P", 4.8, 6.0), ("Ga", 5.5, 7.0), ("Gb", 7.0, 8.0),
             ("P", 8.1, 9.0)]
    stats = timeline.pair_stats(trace, lambda name: name == "P")
    assert stats == {"early": 0.5, "tail": 2.0, "next_early": 0.05, "next_past": 1.0, "step": 3.0}
    alone = timeline.pair_stats([("P", 0.0, 1.0), ("P", 1.5, 2.5), ("P", 3.5, 4.0)], lambda name: True)
    assert alone == {"step": 1.5}


def test_results_read_plain_or_gzip_and_score_estimate_merges_several(tmp_path, capsys, monkeypatch):
    """The committed runs are stored as NAME.json.gz: make_routing and score_estimate take NAME.json for it, and
    several runs scored together read as the one run they merge into."""
    import gzip

    import make_routing
    import score_estimate

    committed = make_routing.RESULTS_DIR / "bench_gemm_fi074_heldout6.json"
    assert not committed.exists() and committed.with_name(committed.name + ".gz").exists()
    run = make_routing.read_json(committed)
    assert run["versions"]["flashinfer"] == "0.7.4" and len(run["rows"]) == 108
    plain, packed = tmp_path / "run.json", tmp_path / "packed.json.gz"
    plain.write_text(json.dumps(run))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert make_routing.read_json(plain) == make_routing.read_json(packed) == run
    with pytest.raises(FileNotFoundError):
        make_routing.read_json(tmp_path / "absent.json")

    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps({**run, "rows": run["rows"][:60]}))
    second.write_text(json.dumps({**run, "rows": run["rows"][60:]}))
    table = str(make_routing.TABLE)
    outputs = []
    for bench in ([str(committed)], [str(first), str(second)], [str(first)]):
        monkeypatch.setattr(sys, "argv", ["score_estimate.py", *bench, table])
        assert score_estimate.main() == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[2] != outputs[0]  # the halves merge; one half alone scores less
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**run, "versions": {**run["versions"], "flashinfer": "0.7.2.post1"}}))
    monkeypatch.setattr(sys, "argv", ["score_estimate.py", str(first), str(other), table, "--flashinfer", "0.7.3"])
    with pytest.raises(SystemExit):  # runs of two versions, neither the one asked for
        score_estimate.main()


def _fused_a_run(copy_gbps: float, read_gbps: float, us: float) -> dict:
    """A bench JSON of one fused-A 2112 x 7168 point, made as bench_gemm.py makes it."""
    from dataclasses import asdict

    import harness

    report = harness.Report(command="synthetic", device="dry-run", torch="-", hbm_read_GBps=read_gbps,
                            launch_floor_us=0.9, copy_GBps=copy_gbps, sms=132)
    report.versions["flashinfer"] = "0.7.4"
    row = report.add(harness.Row("dsv3_fused_a_gemm", {"n": 2112, "k": 7168, "m": 4}, "cold", pattern="decode",
                                 producer="plain", bytes_read=2112 * 7168 * 2))
    row.us = {"jit:stream_w4": us, "anchor:flashinfer": us * 1.05, "default": us}
    row.choice = {"default": "jit:stream_w4 (shipped)"}
    return json.loads(json.dumps(asdict(report)))


def test_the_summary_floor_is_the_weight_bytes_over_the_runs_copy_bandwidth():
    import random

    import make_routing

    rng = random.Random(50)
    for _ in range(5):
        copy, read, us = rng.uniform(2500, 4500), rng.uniform(2500, 4500), rng.uniform(5, 15)
        (row,) = make_routing.summary_rows(_fused_a_run(copy, read, us))
        floor = 2112 * 7168 * 2 / (copy * 1e9) * 1e6
        assert row["floor_source"] == "copy"
        assert row["floor_us"] == pytest.approx(floor, abs=1e-3)  # not the read bandwidth's: copy != read here
        assert row["floor_ratio"] == pytest.approx(us / floor, abs=2e-3)
    (row,) = make_routing.summary_rows(_fused_a_run(4000.0, 4200.0, 9.0))
    cell = "9.00 / 9.45 (0.95x); floor 7.57 (1.19x)"
    assert f"| {cell} | - | - | - | - | 1 / 0 / 0 | copy |" in make_routing.summary_markdown([row])


def test_a_run_without_the_copy_bandwidth_reads_its_floor_from_the_read_bandwidth():
    import make_routing

    run = _fused_a_run(4000.0, 4200.0, 9.0)
    del run["copy_GBps"], run["rows"][0]["dram_floor_us"]  # as runs made before the copy was measured
    (row,) = make_routing.summary_rows(run)
    assert row["floor_source"] == "read" and row["floor_us"] == pytest.approx(2112 * 7168 * 2 / 4200e3, abs=1e-3)
    assert make_routing.summary_markdown([row]).endswith("| 1 / 0 / 0 | read |")
    unmeasured = _fused_a_run(0.0, 4200.0, 9.0)  # a report that never measured the copy: the same
    assert make_routing.summary_rows(unmeasured) == [row]
    del run["rows"][0]["hbm_floor_us"]  # a row that carries no floor: none in its summary row
    (bare,) = make_routing.summary_rows(run)
    assert not any(k.startswith("floor") for k in bare)
    assert "; floor" not in make_routing.summary_markdown([bare]) and make_routing.summary_markdown([bare]).endswith(
        "| 9.00 / 9.45 (0.95x) | - | - | - | - | 1 / 0 / 0 | - |")

    committed = make_routing.read_json(make_routing.RESULTS_DIR / "bench_gemm_fi074_heldout6.json")
    rows = make_routing.summary_rows(committed)
    assert rows and {r["floor_source"] for r in rows} == {"read"}
    gbps = committed["hbm_read_GBps"]
    for r in rows:
        weights = r["shape"].get("n", r["shape"].get("e")) * r["shape"]["k"] * 2
        assert r["floor_us"] == pytest.approx(weights / gbps * 1e-3, abs=1e-3)


@pytest.mark.gpu
def test_copy_bandwidth_is_a_dram_bandwidth_near_the_read_one():
    """Bytes read + written by a 1 GiB device copy per second: on an HBM GPU within a few tens of percent of what a
    large read reaches (counting the read bytes alone would read about half)."""
    import harness

    copy, read = harness.copy_bandwidth(), harness.hbm_read_bandwidth()
    assert 0.75 * read < copy < 1.15 * read, (copy / 1e9, read / 1e9)


def test_skip_variants_reads_the_smoke_tests_bad_file(tmp_path):
    import bench_gemm

    bad = tmp_path / "bad.txt"
    bad.write_text("dsv3_router_gemm:sliced_r2a14\ndsv3_fused_a_gemm:stream_w4p2\ndsv3_router_gemm:narrow_r2c72\n")
    assert bench_gemm.skipped_variants(str(bad)) == {
        "dsv3_router_gemm": frozenset({"jit:sliced_r2a14", "jit:narrow_r2c72"}),
        "dsv3_fused_a_gemm": frozenset({"jit:stream_w4p2"})}
    assert bench_gemm.skipped_variants(None) == {}
    bad.write_text("")
    assert bench_gemm.skipped_variants(str(bad)) == {}
    bad.write_text("sliced_r2a14\n")
    with pytest.raises(SystemExit, match="want op:name"):
        bench_gemm.skipped_variants(str(bad))
