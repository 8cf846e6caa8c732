"""The estimate for shapes no table measured (CPU): grids through the backend interface, the weights of
measured shapes by how alike a candidate's grid lands, and its scoring tool."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from _tables import H200, V074, entry, table, table_file

from slim_kernel.backend import Geometry
from slim_kernel.names import FUSED_A, ROUTER


def test_estimate_weighs_measured_shapes_by_how_alike_the_candidates_grid_lands():
    from slim_kernel import estimate

    # two candidates, two measured shapes: "jit:direct_c8" wins at the shape whose grid is like the
    # query's, "torch" at the far one; the estimate follows the alike one
    tab = table(
        entry(8, us={"jit:direct_c8": 4.0, "torch": 6.0}, shape={"e": 256, "k": 7168, "out": "float32"}),
        entry(8, us={"jit:direct_c8": 9.0, "torch": 3.0}, shape={"e": 16, "k": 512, "out": "float32"}))
    dec = estimate.estimate(ROUTER, {"e": 288, "k": 7168, "out": "float32"}, 8, False, H200, [tab], V074)
    assert dec.point.us[0][0] == "jit:direct_c8"
    # narrow's straight-line body (K = 7168 and the smaller K it is fitted to) never stands in for its generic one
    assert Geometry().body(ROUTER, "jit:narrow_r1kc", 256, 7168, 4) == "exact"
    assert Geometry().body(ROUTER, "jit:narrow_r1kc", 256, 6144, 4) == "exact"  # fitted: 384 threads
    assert Geometry().body(ROUTER, "jit:narrow_r1kc", 256, 6152, 4) == ""
    tab = table(
        entry(4, us={"jit:narrow_r1kc": 2.0, "torch": 6.0}, shape={"e": 256, "k": 7168, "out": "float32"}),
        entry(4, us={"jit:narrow_r1kc": 2.5, "torch": 6.0}, shape={"e": 384, "k": 7168, "out": "float32"}))
    dec = estimate.estimate(ROUTER, {"e": 256, "k": 5128, "out": "float32"}, 4, False, H200, [tab], V074)
    assert [c for c, _ in dec.point.us] == ["torch"]


def test_a_shape_far_from_every_measured_one_is_still_estimated():
    from slim_kernel import estimate

    # every candidate's weight is far below MIN_WEIGHT here; they still rank by their regrets (the priority
    # order, which is what selection runs without an estimate, was 1.18-1.51x the best anchor at such a shape)
    tab = table(
        entry(8, us={"jit:stream_r2": 9.0, "flashinfer": 8.0, "torch": 12.0}, shape={"n": 3648, "k": 7168}, op=FUSED_A),
        entry(8, us={"jit:stream_r2": 7.0, "flashinfer": 7.5, "torch": 10.0}, shape={"n": 2112, "k": 7168}, op=FUSED_A))
    here, there = (1056, 2560, 8), (2112, 7168, 8)
    for cand in ("jit:stream_r2", "flashinfer", "torch"):
        assert math.exp(-estimate.geometry_distance(FUSED_A, cand, here, there, 132, Geometry()) / estimate.TAU) < estimate.MIN_WEIGHT
    dec = estimate.estimate(FUSED_A, {"n": 1056, "k": 2560}, 8, False, H200, [tab], V074)
    assert dec is not None and dec.source == "estimate"
    assert [c for c, _ in dec.point.us][-1] == "torch"  # 1.36-1.43x its shapes' best: last wherever it is


def test_pinned_flashinfer_programs_have_their_own_grid():
    from slim_kernel import estimate
    from slim_kernel.backends import flashinfer as fb
    from slim_kernel.names import FLASHINFER_FUSED_A_PROGRAMS

    assert set(fb.PINNED_ROWS_PER_CTA) == set(FLASHINFER_FUSED_A_PROGRAMS)
    # ncu: PACKED_S8_IL launches 164 CTAs at N=2624 (16 rows each), ACCUMULATORS_CN16 41 (64 rows)
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
    tab = table(
        entry(8, us={"jit:stream_r2": 9.0, "flashinfer": 8.0}, shape={"n": 2112, "k": 7168}, op=FUSED_A),
        entry(8, us={"jit:stream_r2": 9.0, "flashinfer": 12.0}, shape={"n": 2624, "k": 7168}, op=FUSED_A))
    dec = estimate.estimate(FUSED_A, {"n": 1536, "k": 7168}, 8, False, H200, [tab], V074, Geometry({"flashinfer": tiles}))
    assert dec.point.us[0][0] == "flashinfer"
    assert dict(dec.point.us)["flashinfer"] < dict(dec.point.us)["jit:stream_r2"] * 0.95
    assert "runs its U4 program here (96 CTAs, 132 at a time)" in dec.match  # what `info` shows
    # the programs of another release say nothing about the 0.7.4 points: opaque again, with its margin
    other = estimate.estimate(FUSED_A, {"n": 1536, "k": 7168}, 8, False, H200, [tab], (("flashinfer", "0.7.5"),), Geometry({"flashinfer": tiles}))
    assert other.point.us == estimate.estimate(FUSED_A, {"n": 1536, "k": 7168}, 8, False, H200, [tab], (("flashinfer", "0.7.5"),)).point.us
    assert other.point.us[0][0] == "jit:stream_r2"


def test_a_point_in_another_number_of_waves_barely_counts():
    from collections import namedtuple

    from slim_kernel import estimate

    tile = namedtuple("Tile", "name tokens rows smem cluster")
    u4 = tile("U4", 8, 16, 199680, 1)  # one CTA per SM

    def tiles(m, n, k, variant=None):
        return u4

    # M=12 (two token tiles): U4 at 2112 x 4096 is 264 CTAs, two waves, and loses there; at 1056 x 2560 132, one wave,
    # and wins. At 896 x 4096 it is 112 CTAs, one wave: the one-wave point decides (U4 at 1.00x the best
    # anchor there, 1.2-1.4x at every N=2112 shape in two waves; with the waves term at 1/2, stream_w4 serves here)
    tab = table(
        entry(12, us={"jit:stream_w4": 10.0, "flashinfer": 13.0}, shape={"n": 2112, "k": 4096}, op=FUSED_A),
        entry(12, us={"jit:stream_w4": 4.3, "flashinfer": 4.1}, shape={"n": 1056, "k": 2560}, op=FUSED_A))
    assert Geometry({"flashinfer": tiles}).grid(FUSED_A, "flashinfer", 896, 4096, 12, 132) == (112, 132)
    dec = estimate.estimate(FUSED_A, {"n": 896, "k": 4096}, 12, False, H200, [tab], V074, Geometry({"flashinfer": tiles}))
    assert dec.point.us[0][0] == "flashinfer"
    assert estimate.geometry_distance(FUSED_A, "flashinfer", (896, 4096, 12), (2112, 4096, 12), 132, Geometry({"flashinfer": tiles})) > 2


def test_a_candidate_known_only_from_unlike_grids_ranks_near_the_prior():
    from slim_kernel import estimate

    # narrow_r2k6c wins GLM-5's router (one wave of 128 CTAs) and nothing else measured it; at E=768 it runs three
    # waves, and its win there says little: torch, measured at the near E=640, serves (narrow_r2k6c read 1.24-1.35x the best anchor there)
    tab = table(
        entry(12, us={"jit:narrow_r2k6c": 5.0, "torch": 10.0}, shape={"e": 256, "k": 6144, "out": "float32"}),
        entry(12, us={"jit:skinny_c4": 10.2, "torch": 10.0}, shape={"e": 640, "k": 6144, "out": "float32"}))
    dec = estimate.estimate(ROUTER, {"e": 768, "k": 6144, "out": "float32"}, 12, False, H200, [tab], V074)
    us = dict(dec.point.us)
    assert dec.point.us[0][0] == "torch" and us.get("jit:narrow_r2k6c", math.inf) > us["torch"] * 1.05


def test_score_estimate_scores_the_pick_that_selection_would_run(tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import score_estimate

    shape = {"e": 256, "k": 7168, "out": "float32"}
    table = table_file([
        entry(4, us={"jit:direct_c8": 4.0, "flashinfer": 3.0, "torch": 6.0}, shape=shape),
        entry(4, us={"jit:direct_c8": 4.0, "torch": 6.0}, shape={"e": 384, "k": 7168, "out": "float32"})])
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


def test_score_estimate_scores_a_gpu_no_group_names_from_another_gpus_measurements(tmp_path, capsys):
    """``--learn DEVICE``: the BENCH GPU's rows estimated from another GPU's group alone (the H200 predicting the
    H100): where the two GPUs rank alike the pick is the fastest, where they do not the score says what it costs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
    import score_estimate

    from slim_kernel import routing

    shapes = [{"e": 256, "k": 7168, "out": "float32"}, {"e": 384, "k": 7168, "out": "float32"}]
    h200 = table_file([entry(4, us={"jit:direct_c8": 4.0, "torch": 6.0}, shape=s) for s in shapes])
    other = routing.Device("NVIDIA H100 80GB HBM3", 132, "sm_90")
    h100 = table_file([entry(4, us={"jit:direct_c8": 5.0, "torch": 4.0}, shape=s) for s in shapes], device=other)
    (tmp_path / "t.json").write_text(json.dumps({**h200, "measurements": h200["measurements"] + h100["measurements"]}))
    rows = [{"op": ROUTER, "producer": "plain", "shape": {**s, "m": 4},  # on the H100 torch is the faster
             "us": {"jit:direct_c8": 5.0, "torch": 4.0, "anchor:torch": 4.0, "default": 5.0}} for s in shapes]
    (tmp_path / "b.json").write_text(json.dumps({"device": other.name, "sms": 132, "hbm_read_GBps": 3000.0,
                                                 "rows": rows}))
    for learn, want in (("NVIDIA H200", "2 of 2 points > 1.10x the best anchor, worst 1.25x"),
                        ("NVIDIA H100 80GB HBM3", "0 of 2 points > 1.10x the best anchor, worst 1.00x")):
        sys.argv = ["score_estimate.py", str(tmp_path / "b.json"), str(tmp_path / "t.json"), "--learn", learn]
        assert score_estimate.main() == 0
        out = capsys.readouterr().out
        assert (f"another GPU's table (plain): {want}" in out) == (learn == "NVIDIA H200"), out
        assert ("learning from NVIDIA H200's measurements alone, predicting NVIDIA H100 80GB HBM3" in out) == \
            (learn == "NVIDIA H200")
        assert f"leave-one-shape-out (plain): {want}" in out, out
    sys.argv = ["score_estimate.py", str(tmp_path / "b.json"), str(tmp_path / "t.json"), "--learn", "NVIDIA B200"]
    with pytest.raises(SystemExit):  # a device the table does not hold
        score_estimate.main()
    assert "has no measurements of 'NVIDIA B200'" in capsys.readouterr().err
