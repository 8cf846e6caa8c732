"""benchmark/cold_start.py without a GPU: its arguments, the compile count read from a cache trace, the
verdict and the table from made-up rank results, a phase whose ranks cannot reach CUDA, and one rank's
call loop run on the CPU (the torch backend serves there; the routed picks are made up)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))
import cold_start as cs  # noqa: E402
import cold_start_rank as cr  # noqa: E402

from slim_kernel.names import FUSED_A, ROUTER  # noqa: E402

ROUTER_F32 = {"e": 256, "k": 7168, "out": "float32"}


def test_arguments_and_defaults():
    args = cs.parse_args([])
    assert args.procs is None and args.ms == list(range(1, 17)) and args.other_caches == "fresh"
    assert not args.rotate and not args.skip_anchors and args.json is None
    args = cs.parse_args(["--procs", "8", "--ms", "1,4-6", "--rotate", "--skip-anchors", "--other-caches", "inherit"])
    assert (args.procs, args.ms, args.rotate, args.skip_anchors, args.other_caches) == (8, [1, 4, 5, 6], True, True,
                                                                                         "inherit")


@pytest.mark.parametrize("argv, match", [
    (["--procs", "0"], r"--procs must be a positive int, got '0'"), (["--procs", "two"], r"--procs must be"),
    (["--ms", "0-4"], r"--ms must list M values in 1\.\.64"), (["--ms", "x"], r"--ms must list"),
    (["--ms", "60-65"], r"--ms must list"), (["--timeout", "0"], r"--timeout must be positive"),
    (["--other-caches", "old"], r"--other-caches: invalid choice")])
def test_bad_arguments_exit_2_naming_the_argument(capsys, argv, match):
    with pytest.raises(SystemExit) as exc:
        cs.parse_args(argv)
    assert exc.value.code == 2 and re.search(match, capsys.readouterr().err)


def test_sglang_must_be_a_directory(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cs.parse_args(["--sglang", str(tmp_path / "missing")])
    assert re.search(r"--sglang: '.*missing' is not a directory", capsys.readouterr().err)
    assert cs.parse_args(["--sglang", str(tmp_path)]).sglang == str(tmp_path)


def test_compiles_are_counted_per_cache_key(tmp_path):
    trace = tmp_path / "t.trace"
    events = [{"event": "compile", "key": "a", "pid": 1, "seconds": 0.5},
              {"event": "compile", "key": "b", "pid": 2, "seconds": 0.25},
              {"event": "compile", "key": "a", "pid": 2, "seconds": 0.5}, {"event": "invalid", "pid": 3}]
    trace.write_text("".join(json.dumps(e) + "\n" for e in events) + "\n")
    assert cs.count_compiles(trace) == {"count": 3, "keys": 2, "more_than_once": ["a"], "pids": 2, "seconds": 1.25,
                                        "invalid_entries": 1}
    assert cs.count_compiles(tmp_path / "none")["count"] == 0


def _call(ok=True, **extra):
    return {"op": ROUTER, "shape": ROUTER_F32, "m": 1, "pdl": True, "pick": "jit:narrow_r1kc", "seconds": 0.3,
            "rel_err": 1e-7 if ok else None, "ok": ok, **extra}


def _phase(cache, role, ranks, compiles, routed=2, **extra):
    base = {"count": 0, "keys": 0, "more_than_once": [], "pids": 0, "seconds": 0.0, "invalid_entries": 0}
    phase = {"cache": cache, "role": role, "wall_s": 9.5, "ranks": ranks, "compiles": {**base, **compiles},
             "routed_jit_instances": routed, **extra}
    phase["problems"] = cs.problems(phase)
    return phase


def _rank(rank, calls, **extra):
    return {"rank": rank, "device": "cuda:0", "torch_import_s": 1.5, "cuda_init_s": 2.0, "import_s": 2.5,
            "first_result_s": 3.0, "all_results_s": 8.25, "calls": calls, "notes": [], **extra}


def test_the_verdict_per_phase():
    good = _phase("cold", "ours", [_rank(0, [_call()]), _rank(1, [_call()])], {"count": 2, "keys": 2, "pids": 1})
    assert good["problems"] == []
    twice = _phase("cold", "ours", [_rank(0, [_call()])], {"count": 3, "keys": 2, "more_than_once": ["a"]})
    assert twice["problems"] == ["1 cache keys compiled more than once across ranks"]
    short = _phase("cold", "ours", [_rank(0, [_call()])], {"count": 1, "keys": 1})
    assert short["problems"] == ["1 instances compiled, 2 routed JIT instances"]
    warm = _phase("warm", "ours", [_rank(0, [_call(ok=False)]), {"rank": 1, "calls": [], "error": "exit status -9"}],
                  {"count": 1, "keys": 1})
    assert warm["problems"] == ["rank 1: exit status -9", f"rank 0: WRONG jit:narrow_r1kc {ROUTER} {ROUTER_F32} M=1 "
                                "rel err None", "1 compiles with a precompiled cache"]
    anchors = _phase("cold", "anchors", [_rank(0, [_call(pick="flashinfer")])], {"count": 5, "keys": 1}, routed=0)
    assert anchors["problems"] == []  # the rule is ours: flashinfer's and sglang's compiles are not in our trace


def test_the_table():
    anchor_calls = [_call(pick="flashinfer", seconds=12.5), _call(pick="flashinfer", m=2, seconds=0.01),
                    {**_call(pick="sglang:fused_a", seconds=20.0), "op": FUSED_A, "shape": {"n": 2112, "k": 7168}}]
    report = {"procs": 2, "gpus": 1, "device": "NVIDIA H200", "ms": [1, 16], "notes": ["sglang: absent"], "phases": [
        _phase("cold", "ours", [_rank(0, [_call()]), {"rank": 1, "calls": [], "error": "boom"}], {"count": 2, "keys": 2,
                                                                                                  "pids": 2}),
        _phase("warm", "ours", [_rank(0, [_call()])], {}, precompile={"seconds": 30.5, "exit": 0, "summary": ""}),
        _phase("cold", "anchors", [_rank(0, anchor_calls, imports={"flashinfer": 1.25, "anchors_init": 0.5})], {})]}
    text = cs.render(report)
    lines = text.splitlines()
    assert lines[0].startswith("cold start: 2 ranks on 1 GPU(s) (NVIDIA H200), M 1-16")
    assert re.match(r"cold ours\s+0 cuda:0\s+1\.50\s+2\.00\s+2\.50\s+3\.00\s+8\.25\s+1\s+0$", lines[2])
    assert re.match(r"cold ours\s+1 \?\s+(-\s+){5}0\s+0  ERROR boom$", lines[3])
    assert ("cold ours: wall 9.5 s; 2 compiles of 2 instances in 2 ranks (0.0 s); 2 routed JIT instances; rank 0 "
            "calls by backend: jit 0.30 s") in text
    assert "PROBLEM rank 1: boom" in text and "precompile 30.5 s" in text
    assert ("rank 0 imports {'flashinfer': 1.25, 'anchors_init': 0.5}; first calls: flashinfer dsv3_router_gemm float32 "
            "12.50, sglang:fused_a dsv3_fused_a_gemm 20.00") in text
    assert lines[-1] == "note: sglang: absent"


def test_a_phase_of_ranks_without_cuda(tmp_path):
    """Two ranks launched at once, torch.distributed-style env; each fails at CUDA init and says so."""
    args = cs.parse_args(["--ms", "1", "--skip-anchors", "--timeout", "120"])
    dirs = {name: tmp_path / "ours" / name for name in ("slim", "flashinfer", "sglang")}
    phase = cs.run_phase(args, "ours", "cold", dirs, 2, 1, tmp_path)
    assert [r["rank"] for r in phase["ranks"]] == [0, 1]
    for r in phase["ranks"]:
        assert r["local_rank"] == r["rank"] and r["device"] == "cuda:0" and r["calls"] == []
        assert r["error"] and r["torch_import_s"] > 0
    assert len(phase["problems"]) == 2 and phase["compiles"]["count"] == 0 and phase["wall_s"] > 0


def _rows():
    return [{"op": ROUTER, "shape": ROUTER_F32, "m": 2, "pdl": False, "pick": "jit:narrow_r1kc", "why": ""},
            {"op": FUSED_A, "shape": {"n": 2112, "k": 7168}, "m": 1, "pdl": True, "pick": "flashinfer", "why": ""},
            {"op": ROUTER, "shape": {**ROUTER_F32, "out": "bfloat16"}, "m": 1, "pdl": True, "pick": "jit:direct_c8",
             "why": ""}]


@pytest.mark.parametrize("rotate", [False, True])
def test_one_rank_calls_each_routed_instance_once_checked(monkeypatch, pdl_auto, rotate):
    monkeypatch.setattr(cr, "routed_calls", lambda device, ms: _rows())
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = {"rank": 1, "calls": [], "notes": []}
    cr.run_ours(result, torch.device("cpu"), [1, 2], lambda: 1.0, rotate)
    order = [(c["op"], c["m"], c["pdl"]) for c in result["calls"]]
    pdl_first = [(FUSED_A, 1, True), (ROUTER, 1, True), (ROUTER, 2, False)]
    assert order == (pdl_first[1:] + pdl_first[:1] if rotate else pdl_first)  # rank 1 of 2 starts 1/2 way in
    assert all(c["ok"] and c["rel_err"] < 5e-3 for c in result["calls"])
    instances = {c["pick"]: c["instance"] for c in result["calls"]}
    assert instances["flashinfer"] is None and "dsv3_router_gemm" in instances["jit:narrow_r1kc"]
    assert instances["jit:direct_c8"] != instances["jit:narrow_r1kc"]
    assert result["first_result_s"] == 1.0 and result["import_s"] == 1.0


def test_no_gpu_is_exit_2(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert cs.main(["--skip-anchors"]) == 2
    assert "no CUDA device is visible" in capsys.readouterr().err
