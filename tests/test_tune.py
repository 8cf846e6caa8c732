"""Routing sources without a GPU: tuned tables (written, merged, refused), the estimate for unmeasured
shapes, `slim-kernel tune`'s arguments, the models' shapes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from slim_kernel import models, routing, tune
from slim_kernel.backend import Geometry
from slim_kernel.names import FUSED_A, ROUTER

H200 = routing.Device("NVIDIA H200", 132, "sm_90")


@pytest.fixture
def tuned_cache(tmp_path, monkeypatch):
    import functools

    monkeypatch.setenv("SLIM_KERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(routing, "flashinfer_version", functools.cache(lambda: "0.7.4"))
    routing.reload()
    yield tmp_path
    routing.reload()


def _entry(m=1, pdl=False, us=None, shape=None, op=ROUTER):
    return {"op": op, "shape": shape or {"e": 144, "k": 5120, "out": "float32"}, "m": m, "flashinfer": "0.7.4",
            "pdl": pdl, "us": us or {"jit:direct_c8": 3.0, "torch": 7.0}}


def _table(*entries):
    """A shipped-style table of ``entries`` (the estimate's training points in these tests)."""
    return routing.Table({"schema": 1, "arch": "sm_90", "entries": list(entries)}, "test")


def _header(device=H200, flashinfer="0.7.4"):
    return {"arch": device.arch, "device": device.name, "sms": device.sms, "flashinfer": flashinfer,
            "generated_by": "test"}


def test_models_and_shape_arguments():
    assert models.model_shapes("DeepSeek-R1") == models.MODELS["deepseek-v3"]
    assert {s.label() for s in models.model_shapes("kimi-k3")} == {
        "router E=896 K=7168 float32", "router E=896 K=7168 bfloat16", "fused-A N=3648 K=7168"}
    assert models.parse_router("160,5120") == models.router(160, 5120, "float32")
    assert models.parse_router("128,7168,bf16").key() == {"e": 128, "k": 7168, "out": "bfloat16"}
    assert models.parse_fused_a("2112,5120").key() == {"n": 2112, "k": 5120}
    for bad, match in [("160", "E,K"), ("a,5120", "E,K"), ("160,5120,half", "float32 or bfloat16"),
                       ("0,5120", "bad shape"), ("160,5121", "bad shape")]:
        with pytest.raises(ValueError, match=match):
            models.parse_router(bad)
    with pytest.raises(ValueError, match="unknown model 'llama'"):
        models.model_shapes("llama")
    assert tune.parse_ms("1-4,8") == [1, 2, 3, 4, 8]
    for bad in ("0-3", "65", "x", ""):
        with pytest.raises(ValueError, match="--ms"):
            tune.parse_ms(bad)


def test_tune_cli_refuses_bad_arguments_and_a_missing_gpu():
    run = lambda *a: subprocess.run([sys.executable, "-m", "slim_kernel", "tune", *a], capture_output=True,  # noqa: E731
                                    text=True, timeout=120)
    for args, needle in [((), "at least one"), (("--router", "1,x"), "--router"), (("--model", "nope"), "unknown"),
                         (("--model", "glm-5", "--ms", "99"), "--ms")]:
        proc = run(*args)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    import torch

    if not torch.cuda.is_available():
        proc = run("--model", "glm-5")
        assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr
        pre = subprocess.run([sys.executable, "-m", "slim_kernel", "precompile", "--tune", "--model", "glm-5",
                              "--arch", "9.0a"], capture_output=True, text=True, timeout=120)
        assert pre.returncode == 2 and "needs a CUDA GPU" in pre.stderr
    pre = subprocess.run([sys.executable, "-m", "slim_kernel", "precompile", "--tune", "--arch", "9.0a"],
                         capture_output=True, text=True, timeout=120)
    assert pre.returncode == 2 and "--tune needs the shapes" in pre.stderr


def test_tuned_table_is_written_atomically_merged_and_preferred(tuned_cache):
    path = routing.tuned_path(H200, "0.7.4")
    assert path.parent == tuned_cache / routing.TUNED_DIR and "nvidia-h200-132sm" in path.name
    tune.write_table(path, _header(), [_entry(1), _entry(2)])
    tune.write_table(path, _header(), [_entry(2, us={"jit:ring_c8": 2.0}), _entry(1, shape={"n": 1536, "k": 5120},
                                                                                 op=FUSED_A)])
    data = json.loads(path.read_text())
    assert len(data["entries"]) == 3 and not list(path.parent.glob(".tune-*"))  # merged, no temp file left
    routing.reload()
    dec = routing.lookup(ROUTER, {"e": 144, "k": 5120, "out": "float32"}, 2, False, H200)
    assert dec.source == "tuned" and dec.point.best("jit") == ("ring_c8", 2.0)
    # past the M it measured the tuned table says nothing: the shipped table or the estimate does
    assert routing.lookup(ROUTER, {"e": 144, "k": 5120, "out": "float32"}, 5, False, H200).source == "estimate"


@pytest.mark.parametrize("corrupt", [
    lambda d: d.update(schema=7),
    lambda d: d["entries"][0].update(m="1"),
    lambda d: d["entries"][0].update(m=500),
    lambda d: d["entries"][0]["us"].update({"torch": -1.0}),
    lambda d: d["entries"][0]["us"].update({"torch": float("inf")}),
    lambda d: d["entries"][0]["us"].update({"torch": 1e9}),
    lambda d: d["entries"][0].update(shape=[1, 2]),
    lambda d: d["entries"].append("x"),
    lambda d: d.update(device="NVIDIA H100"),  # measured on another device
    lambda d: d.update(flashinfer="0.7.2.post1"),  # under another flashinfer
], ids=["schema", "m-type", "m-range", "negative", "inf", "absurd", "shape-type", "entry-type", "device", "version"])
def test_a_bad_tuned_table_is_refused_with_a_warning_never_a_crash(tuned_cache, corrupt):
    path = routing.tuned_path(H200, "0.7.4")
    tune.write_table(path, _header(), [_entry(1)])
    data = json.loads(path.read_text())
    corrupt(data)
    path.write_text(json.dumps(data))
    routing.reload()
    with pytest.warns(RuntimeWarning, match="ignoring the tuned routing table"):
        assert routing.tuned_table(H200, "0.7.4") is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dec = routing.lookup(ROUTER, {"e": 144, "k": 5120, "out": "float32"}, 1, False, H200)
    assert dec is None or dec.source != "tuned"


def test_truncated_or_non_json_tuned_table_is_refused(tuned_cache):
    path = routing.tuned_path(H200, "0.7.4")
    path.parent.mkdir(parents=True)
    for text in ("{", "[]", "\\x00\\x01", '{"schema": 1}'):
        path.write_text(text)
        routing.reload()
        with pytest.warns(RuntimeWarning):
            assert routing.tuned_table(H200, "0.7.4") is None


def test_write_table_refuses_what_selection_would_refuse(tuned_cache):
    path = routing.tuned_path(H200, "0.7.4")
    tune.write_table(path, _header(), [_entry(1)])
    before = path.read_text()
    with pytest.raises(ValueError):
        tune.write_table(path, _header(), [_entry(1, us={"torch": float("nan")})])
    assert path.read_text() == before  # the previous table stays in force


def test_unmeasured_shapes_are_estimated_from_every_measured_shape_and_say_so(tuned_cache):
    shipped = routing.table("sm_90")
    shape = {"e": 144, "k": 5120, "out": "float32"}
    assert shipped.lookup(ROUTER, shape, 4, "0.7.4", False) is None  # no table has it: never another shape's point
    dec = routing.lookup(ROUTER, shape, 4, False, H200)
    assert dec.source == "estimate" and dec.estimated and "slim-kernel tune" in dec.match
    assert all(c.partition(":")[0] in ("jit", "flashinfer", "torch") for c, _ in dec.point.us)
    # another GPU of the same SM count: the shipped point, flagged as an estimate
    h100 = routing.Device("NVIDIA H100 80GB HBM3", 132, "sm_90")
    dec = routing.lookup(ROUTER, {"e": 256, "k": 7168, "out": "float32"}, 4, False, h100)
    assert dec.source == "shipped" and dec.estimated and "NVIDIA H200" in dec.match
    # another SM count (an H20's 78): re-derived for that grid, not the H200's numbers
    h20 = routing.Device("NVIDIA H20", 78, "sm_90")
    assert routing.lookup(ROUTER, {"e": 256, "k": 7168, "out": "float32"}, 4, False, h20).source == "estimate"


def test_estimate_weighs_measured_shapes_by_how_alike_the_candidates_grid_lands():
    from slim_kernel import estimate

    # two candidates, two measured shapes: "jit:direct_c8" wins at the shape whose grid is like the
    # query's, "torch" at the far one; the estimate follows the alike one
    tab = _table(
        _entry(8, us={"jit:direct_c8": 4.0, "torch": 6.0}, shape={"e": 256, "k": 7168, "out": "float32"}),
        _entry(8, us={"jit:direct_c8": 9.0, "torch": 3.0}, shape={"e": 16, "k": 512, "out": "float32"}))
    dec = estimate.estimate(ROUTER, {"e": 288, "k": 7168, "out": "float32"}, 8, False, H200, [tab], "0.7.4")
    assert dec.point.us[0][0] == "jit:direct_c8"
    # narrow's straight-line body (K = 7168 and the smaller K it is fitted to) never stands in for its generic one
    assert Geometry().body(ROUTER, "jit:narrow_r1kc", 256, 7168, 4) == "exact"
    assert Geometry().body(ROUTER, "jit:narrow_r1kc", 256, 6144, 4) == "exact"  # fitted: 384 threads
    assert Geometry().body(ROUTER, "jit:narrow_r1kc", 256, 6152, 4) == ""
    tab = _table(
        _entry(4, us={"jit:narrow_r1kc": 2.0, "torch": 6.0}, shape={"e": 256, "k": 7168, "out": "float32"}),
        _entry(4, us={"jit:narrow_r1kc": 2.5, "torch": 6.0}, shape={"e": 384, "k": 7168, "out": "float32"}))
    dec = estimate.estimate(ROUTER, {"e": 256, "k": 5128, "out": "float32"}, 4, False, H200, [tab], "0.7.4")
    assert [c for c, _ in dec.point.us] == ["torch"]


def test_a_shape_far_from_every_measured_one_is_still_estimated():
    from slim_kernel import estimate

    # every candidate's weight is far below MIN_WEIGHT here; they still rank by their regrets (the priority
    # order, which is what selection runs without an estimate, was 1.18-1.51x the best anchor at such a shape)
    tab = _table(
        _entry(8, us={"jit:stream_r2": 9.0, "flashinfer": 8.0, "torch": 12.0}, shape={"n": 3648, "k": 7168}, op=FUSED_A),
        _entry(8, us={"jit:stream_r2": 7.0, "flashinfer": 7.5, "torch": 10.0}, shape={"n": 2112, "k": 7168}, op=FUSED_A))
    here, there = (1056, 2560, 8), (2112, 7168, 8)
    for cand in ("jit:stream_r2", "flashinfer", "torch"):
        assert math.exp(-estimate.geometry_distance(FUSED_A, cand, here, there, 132, Geometry()) / estimate.TAU) < estimate.MIN_WEIGHT
    dec = estimate.estimate(FUSED_A, {"n": 1056, "k": 2560}, 8, False, H200, [tab], "0.7.4")
    assert dec is not None and dec.source == "estimate"
    assert [c for c, _ in dec.point.us][-1] == "torch"  # 1.36-1.43x its shapes' best: last wherever it is


def test_pinned_flashinfer_programs_have_their_own_grid():
    from slim_kernel import estimate
    from slim_kernel.backends import flashinfer as fb
    from slim_kernel.names import FLASHINFER_FUSED_A_PROGRAMS

    assert set(fb.PINNED_ROWS_PER_CTA) == set(FLASHINFER_FUSED_A_PROGRAMS)
    # ncu (run 80): PACKED_S8_IL runs 164 CTAs at N=2624 (16 rows each), ACCUMULATORS_CN16 41 (64 rows)
    assert Geometry().grid(FUSED_A, "flashinfer:s8il", 2624, 6144, 8, 132) == (164, 132)
    assert Geometry().grid(FUSED_A, "flashinfer:cn16", 2624, 6144, 8, 132) == (41, 132)
    # flashinfer's own choice stays opaque: one CTA per SM assumed
    assert Geometry().grid(FUSED_A, "flashinfer", 2624, 6144, 8, 132) == (132, 132)
    # so s8il measured at N=2112 (132 CTAs, one wave) says less about N=2624 (164 CTAs, two waves)
    # than the opaque call's measurement does
    pinned = estimate.geometry_distance(FUSED_A, "flashinfer:s8il", (2624, 6144, 8), (2112, 6144, 8), 132, Geometry())
    opaque = estimate.geometry_distance(FUSED_A, "flashinfer", (2624, 6144, 8), (2112, 6144, 8), 132, Geometry())
    assert pinned == estimate.WAVES_WEIGHT and opaque < 0.25  # one wave more; bytes per CTA and CTAs at a time alike


def test_idle_lanes_of_a_narrow_round_make_a_shape_less_alike():
    from slim_kernel import estimate
    from slim_kernel.jit.catalogue import VARIANTS

    rounds = VARIANTS[ROUTER]["narrow_r7"]  # 448 threads x 1 chunk: two rounds of K = 7168, no fitted body
    assert rounds.lane_fill(7168) == 1.0 and rounds.lane_fill(4096) == 512 / 896
    assert VARIANTS[ROUTER]["narrow_r2kc"].lane_fill(7168) == 1.0  # 448 x 2 chunks
    assert not hasattr(VARIANTS[ROUTER]["direct_c8"], "lane_fill")
    # the same grid (74 CTAs) at K 7168 and 4096: only the idle lanes tell them apart
    d = estimate.geometry_distance(ROUTER, "jit:narrow_r7", (518, 4096, 4), (518, 7168, 4), 132, Geometry())
    bytes_term = abs(math.log(4096 / 7168))
    assert d == pytest.approx(bytes_term + estimate.FILL_WEIGHT * abs(math.log(512 / 896)))
    # a one-round configuration is fitted to K 4096 (512 threads, every lane loaded): no idle lanes, but two CTAs
    # of 512 threads share an SM (48 registers), so its 256 CTAs run in one wave, not two
    wide = VARIANTS[ROUTER]["narrow_r2t896"]
    assert wide.lane_fill(4096) == 1.0 and wide.lane_fill(4104) == 513 / 896
    d = estimate.geometry_distance(ROUTER, "jit:narrow_r2t896", (512, 4096, 4), (512, 7168, 4), 132, Geometry())
    assert d == pytest.approx(bytes_term + estimate.WAVES_WEIGHT + abs(math.log(256 / 132)))


def test_score_estimate_scores_the_pick_that_selection_would_run(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import score_estimate

    shape = {"e": 256, "k": 7168, "out": "float32"}
    table = {"schema": 1, **_header(), "entries": [
        _entry(4, us={"jit:direct_c8": 4.0, "flashinfer": 3.0, "torch": 6.0}, shape=shape),
        _entry(4, us={"jit:direct_c8": 4.0, "torch": 6.0}, shape={"e": 384, "k": 7168, "out": "float32"})]}
    row = {"op": ROUTER, "producer": "plain", "unnamed": True, "shape": {"e": 288, "k": 7168, "out": "float32", "m": 4},
           # flashinfer ranks first but has no router for E=288: selection runs direct_c8 (4.4 us)
           "us": {"jit:direct_c8": 4.4, "torch": 6.6, "anchor:torch": 4.0, "default": 4.4}}
    (tmp_path / "t.json").write_text(json.dumps(table))
    (tmp_path / "b.json").write_text(json.dumps({"device": "NVIDIA H200", "sms": 132, "rows": [row]}))
    sys.argv = ["score_estimate.py", str(tmp_path / "b.json"), str(tmp_path / "t.json")]
    assert score_estimate.main() == 0
    out = capsys.readouterr().out
    assert "unnamed (plain): 0 of 1 points > 1.10x the best anchor, worst 1.10x; mean regret vs our best 1.000" in out
    # nothing in the table to estimate a fused-A shape from: scored as what the run's default (the priority order) ran
    fused = {"op": FUSED_A, "producer": "plain", "unnamed": True, "shape": {"n": 1056, "k": 2560, "m": 4},
             "us": {"jit:stream_r2": 4.0, "anchor:flashinfer": 4.0, "default": 4.8}}
    (tmp_path / "b.json").write_text(json.dumps({"device": "NVIDIA H200", "sms": 132, "rows": [fused]}))
    assert score_estimate.main() == 0
    assert "unnamed (plain): 1 of 1 points > 1.10x the best anchor, worst 1.20x" in capsys.readouterr().out


def test_info_json_explains_every_estimate(monkeypatch):
    import torch

    import slim_kernel.ops  # noqa: F401
    from slim_kernel import devices, info, registry

    monkeypatch.setattr(registry, "arch", lambda device: "sm_90")
    monkeypatch.setattr(registry, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(devices, "routing_device", lambda device: routing.Device("NVIDIA H20", 78, "sm_90"))
    rows = info._picks(torch.device("cuda", 0))
    shapes = {(r["op"], json.dumps(r["shape"], sort_keys=True)) for r in rows}
    assert shapes >= {(s.op, json.dumps(s.key(), sort_keys=True)) for s in models.all_shapes()}
    for r in rows:  # another SM count: every pick is an estimate, explained, with the tune command
        assert r["source"] in ("estimate", "priority") and r["estimate"] == (r["source"] == "estimate")
        assert r["why"] and r["tune"].startswith("slim-kernel tune --")


@pytest.fixture
def fake_measure(monkeypatch):
    """measure() on a fake point whose weights take 4 us at the fake device's peak DRAM bandwidth."""
    from slim_kernel import timing

    monkeypatch.setattr(timing, "peak_dram_bytes_per_s", lambda device: 256 * 6144 * 2 / 4e-6)

    class FakePoint:
        producers, shape, m, weights, device = {"plain": object(), "pdl": object()}, models.router(256, 6144, "float32"), 5, [0], None

        def __init__(self):
            self.checked = []

        def error(self, fn):
            self.checked.append(fn)
            return 1.0 if getattr(fn, "wrong", False) else 0.0

        def tolerance(self):
            return 1e-5

        def calls(self, fn):
            return fn

    def run(named, step, pdl=False):
        monkeypatch.setattr(tune, "candidates", lambda point, pdl: named)
        notes = []
        point = FakePoint()
        return tune.measure(point, pdl, notes, step), notes, point.checked

    return run


def test_a_reading_below_the_dram_floor_is_taken_again_and_never_kept(fake_measure):
    ok, late, never = (lambda *a: None), (lambda *a: None), (lambda *a: None)
    reads = {ok: iter([5.0] * 9), late: iter([2.0, 6.0, 6.0, 6.0, 6.0]), never: iter([1.0] * 9)}

    class FakeStep:
        producer_us = 1.5

        def time(self, fn):
            return next(reads[fn])

    times, notes, _ = fake_measure({"jit:a": ok, "jit:b": late, "torch": never}, FakeStep())
    assert times == {"jit:a": 5.0, "jit:b": 6.0}  # b's 2.0 read again; torch's 1.0 three times: left out
    assert len(notes) == 1 and "torch: kept reading below the DRAM floor (4.00 us" in notes[0]
    # after the PDL-aware producer the GEMM may overlap it: 3.0 us is above 4.0 - 1.5
    reads.update({ok: iter([3.0] * 9), late: iter([6.0] * 9), never: iter([2.0] * 9)})
    times, notes, _ = fake_measure({"jit:a": ok, "jit:b": late, "torch": never}, FakeStep(), pdl=True)
    assert times == {"jit:a": 3.0, "jit:b": 6.0} and "torch" in notes[0]


def test_measure_times_a_kernel_several_names_launch_once(fake_measure):
    """candidates() hands configurations that launch the same kernel one fn (catalogue.first_alike): it is
    checked and timed once, every name gets its time; a wrong one is refused under every name."""
    shared, other, wrong = (lambda *a: None), (lambda *a: None), (lambda *a: None)
    wrong.wrong = True
    timed = []

    class FakeStep:
        producer_us = 1.0

        def time(self, fn):
            timed.append(fn)
            return 5.0 if fn is shared else 6.0

    times, notes, checked = fake_measure(
        {"jit:a": shared, "jit:b": shared, "torch": other, "jit:c": wrong, "jit:d": wrong}, FakeStep())
    assert times == {"jit:a": 5.0, "jit:b": 5.0, "torch": 6.0}
    assert checked == [shared, other, wrong] and sorted(map(id, timed)) == sorted(map(id, [shared, other] * 3))
    assert len(notes) == 2 and all("not timed" in n for n in notes)


def test_the_benchmark_reads_anchors_and_the_default_as_tune_reads_candidates(monkeypatch):
    """An anchor's one lucky reading neither wins a ratio nor survives below the DRAM floor (4 us here):
    the fastest two anchors keep the median of three floor-checked readings, and so does the default
    (benchmark/bench_gemm.py reads both through tune.read_confirmed, as tune.measure reads candidates)."""
    from slim_kernel import timing

    monkeypatch.setattr(timing, "peak_dram_bytes_per_s", lambda device: 256 * 6144 * 2 / 4e-6)
    lucky, steady, slow, never, default = [(lambda *a: None) for _ in range(5)]
    reads = {lucky: iter([4.5, 6.0, 6.2]), steady: iter([5.0] * 3), slow: iter([9.0]), never: iter([1.0] * 9),
             default: iter([4.1, 5.5, 5.4])}

    class FakeStep:
        producer_us = 0.0

        def time(self, fn):
            return next(reads[fn])

    class FakePoint:
        shape, m, device = models.router(256, 6144, "float32"), 5, None

        def calls(self, fn):
            return fn

    notes = []
    anchors = {"lucky": lucky, "steady": steady, "slow": slow, "never": never}
    times = tune.read_confirmed(FakePoint(), FakeStep(), False, {f"anchor:{k}": fn for k, fn in anchors.items()}, notes)
    assert times == {"anchor:lucky": 6.0, "anchor:steady": 5.0, "anchor:slow": 9.0}
    assert len(notes) == 1 and "anchor:never: kept reading below the DRAM floor" in notes[0]
    assert tune.read_confirmed(FakePoint(), FakeStep(), False, {"default": default}, notes) == {"default": 5.4}


def test_a_lucky_reading_does_not_decide_a_pick():
    """The fastest two are read three times and keep their median; a candidate that falls back out of the
    top two after its confirmation hands the next one its confirmation; the slow ones keep one reading."""
    truth = {"lucky": 9.5, "steady": 9.4, "third": 9.45, "slow": 12.0}
    readings = {"lucky": [6.8], "steady": [9.4], "third": [9.45], "slow": [12.0]}
    retimed = []
    us = tune.confirmed(readings, lambda fn: retimed.append(fn) or truth[fn])
    assert min(us, key=us.get) == "steady" and us["lucky"] == 9.5
    assert sorted(retimed) == sorted(["lucky"] * 2 + ["steady"] * 2 + ["third"] * 2)
    assert len(readings["slow"]) == 1
    assert tune.confirmed({}, lambda fn: 1 / 0) == {}


def test_tune_reports_how_its_picks_compare_with_the_shipped_table():
    """The shipped table's own entries agree with it everywhere; one point where another candidate is now
    faster reports what the shipped pick costs there; shapes the shipped table lacks are not counted."""
    shipped = json.loads((Path(routing.__file__).parent / "tables" / "routing_sm90.json").read_text())
    entries = [dict(e, us=dict(e["us"])) for e in shipped["entries"][:40]]
    assert tune.against_shipped(entries, "sm_90").startswith("the same pick as the shipped table (NVIDIA H200) at 40 of 40")
    slowest = max(entries[3]["us"], key=entries[3]["us"].get)
    entries[3]["us"][slowest] = min(entries[3]["us"].values()) / 1.25
    report = tune.against_shipped(entries + [_entry()], "sm_90")
    assert "at 39 of 40 points; its pick at most 1.25x this one's (1 points over 1.02x)" in report
    assert tune.against_shipped([_entry()], "sm_90") is None and tune.against_shipped(entries, "sm_75") is None


def test_compare_tables_reports_both_directions_and_refuses_a_bad_table(tmp_path, capsys, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import compare_tables

    a = {"schema": 1, **_header(), "entries": [_entry(1), _entry(2, us={"jit:direct_c8": 3.0, "torch": 2.7})]}
    b = {"schema": 1, **_header(), "entries": [_entry(1), _entry(2), _entry(3)]}
    for name, data in (("a.json", a), ("b.json", b), ("bad.json", {**a, "schema": 9})):
        (tmp_path / name).write_text(json.dumps(data))
    monkeypatch.setattr(sys, "argv", ["compare_tables.py", str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    assert compare_tables.main() == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["a.json: the same pick as b.json at 1 of 2 points; its pick at most 1.11x this one's (1 points over 1.02x)",
                   "b.json: the same pick as a.json at 1 of 2 points; its pick at most 2.33x this one's (1 points over 1.02x)"]
    monkeypatch.setattr(sys, "argv", ["compare_tables.py", str(tmp_path / "a.json"), str(tmp_path / "bad.json")])
    assert compare_tables.main() == 2 and "bad.json" in capsys.readouterr().err


def test_the_decode_step_graph_opens_with_a_producer_and_holds_at_least_calls_gemms(monkeypatch):
    """No producer is its graph's first node (as in a model, so PDL's auto mode sees the PDL-aware producer's
    programmatic edge for every GEMM), both graphs hold >= CALLS calls however few weight copies rotate, and
    the per-call time is the pair graph's excess over the producers alone, per GEMM."""
    from slim_kernel import timing

    captured = []
    monkeypatch.setattr(timing, "capture", lambda seq: captured.append(list(seq)) or len(captured) - 1)
    monkeypatch.setattr(timing, "replay_ms", lambda graphs, reps: [[0.49 * 2 + 0.01], [0.49]])
    producer, copies = (lambda: None), [(lambda: None) for _ in range(6)]
    step = timing.DecodeStep(producer, len(copies))
    us = step.time(copies)
    alone, pairs = captured
    n = timing.CALLS
    assert alone == [producer] * (n + 1)
    assert pairs[0] is producer and pairs[1::2] == [producer] * n and len(pairs) == 2 * n + 1
    assert pairs[2::2] == [copies[i % 6] for i in range(n)]
    assert us == pytest.approx((0.99 - 0.49) * 1e3 / n) and step.producer_us == pytest.approx(490 / (n + 1))
    with pytest.raises(ValueError, match="weight copies"):
        step.time([(lambda: None)] * (n + 2))


def test_flashinfer_fused_a_call_is_placed_as_the_program_its_release_runs():
    from collections import namedtuple

    from slim_kernel import estimate

    tile = namedtuple("Tile", "name tokens rows smem cluster")
    one_per_sm, two_per_sm = tile("U4", 8, 16, 199680, 1), tile("S8", 8, 16, 101376, 1)

    def tiles(m, n, k, variant=None):  # a window table: U4 up to N=2112, S8 past it
        return two_per_sm if variant == "s8il" or n > 2112 else one_per_sm

    assert Geometry({"flashinfer": tiles}).grid(FUSED_A, "flashinfer", 2112, 7168, 8, 132) == (132, 132)
    assert Geometry({"flashinfer": tiles}).grid(FUSED_A, "flashinfer", 2112, 7168, 12, 132) == (264, 132)  # two token tiles: 2 waves
    assert Geometry({"flashinfer": tiles}).grid(FUSED_A, "flashinfer:s8il", 2624, 6144, 8, 132) == (164, 264)  # two CTAs per SM
    assert Geometry({"flashinfer": tiles}).body(FUSED_A, "flashinfer", 2624, 6144, 8) == "S8"
    assert Geometry().body(FUSED_A, "flashinfer", 2624, 6144, 8) == ""  # no tiles: one opaque body
    # flashinfer wins where it ran U4, loses where it ran S8; at N=1536 it runs U4: only the U4 point stands in
    tab = _table(
        _entry(8, us={"jit:stream_r2": 9.0, "flashinfer": 8.0}, shape={"n": 2112, "k": 7168}, op=FUSED_A),
        _entry(8, us={"jit:stream_r2": 9.0, "flashinfer": 12.0}, shape={"n": 2624, "k": 7168}, op=FUSED_A))
    dec = estimate.estimate(FUSED_A, {"n": 1536, "k": 7168}, 8, False, H200, [tab], "0.7.4", Geometry({"flashinfer": tiles}))
    assert dec.point.us[0][0] == "flashinfer"
    assert dict(dec.point.us)["flashinfer"] < dict(dec.point.us)["jit:stream_r2"] * 0.95
    assert "runs its U4 program here (96 CTAs, 132 at a time)" in dec.match  # what `info` shows
    # the programs of another release say nothing about the 0.7.4 points: opaque again, with its margin
    other = estimate.estimate(FUSED_A, {"n": 1536, "k": 7168}, 8, False, H200, [tab], "0.7.5", Geometry({"flashinfer": tiles}))
    assert other.point.us == estimate.estimate(FUSED_A, {"n": 1536, "k": 7168}, 8, False, H200, [tab], "0.7.5").point.us
    assert other.point.us[0][0] == "jit:stream_r2"


def test_a_point_in_another_number_of_waves_barely_counts():
    from collections import namedtuple

    from slim_kernel import estimate

    tile = namedtuple("Tile", "name tokens rows smem cluster")
    u4 = tile("U4", 8, 16, 199680, 1)  # one CTA per SM

    def tiles(m, n, k, variant=None):
        return u4

    # M=12 (two token tiles): U4 at 2112 x 4096 is 264 CTAs, two waves, and loses there; at 1056 x 2560 132, one wave,
    # and wins. At 896 x 4096 it is 112 CTAs, one wave: the one-wave point decides (run 133: U4 at 1.00x the best
    # anchor there, 1.2-1.4x at every N=2112 shape in two waves; with the waves term at 1/2, stream_w4 serves here)
    tab = _table(
        _entry(12, us={"jit:stream_w4": 10.0, "flashinfer": 13.0}, shape={"n": 2112, "k": 4096}, op=FUSED_A),
        _entry(12, us={"jit:stream_w4": 4.3, "flashinfer": 4.1}, shape={"n": 1056, "k": 2560}, op=FUSED_A))
    assert Geometry({"flashinfer": tiles}).grid(FUSED_A, "flashinfer", 896, 4096, 12, 132) == (112, 132)
    dec = estimate.estimate(FUSED_A, {"n": 896, "k": 4096}, 12, False, H200, [tab], "0.7.4", Geometry({"flashinfer": tiles}))
    assert dec.point.us[0][0] == "flashinfer"
    assert estimate.geometry_distance(FUSED_A, "flashinfer", (896, 4096, 12), (2112, 4096, 12), 132, Geometry({"flashinfer": tiles})) > 2


def test_a_candidate_known_only_from_unlike_grids_ranks_near_the_prior():
    from slim_kernel import estimate

    # narrow_r2k6c wins GLM-5's router (one wave of 128 CTAs) and nothing else measured it; at E=768 it runs three
    # waves, and its win there says little: torch, measured at the near E=640, serves (run 128: 1.24-1.35x before)
    tab = _table(
        _entry(12, us={"jit:narrow_r2k6c": 5.0, "torch": 10.0}, shape={"e": 256, "k": 6144, "out": "float32"}),
        _entry(12, us={"jit:skinny_c4": 10.2, "torch": 10.0}, shape={"e": 640, "k": 6144, "out": "float32"}))
    dec = estimate.estimate(ROUTER, {"e": 768, "k": 6144, "out": "float32"}, 12, False, H200, [tab], "0.7.4")
    us = dict(dec.point.us)
    assert dec.point.us[0][0] == "torch" and us.get("jit:narrow_r2k6c", math.inf) > us["torch"] * 1.05
