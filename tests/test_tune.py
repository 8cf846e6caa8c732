"""`slim-kernel tune` without a GPU: its arguments and exit codes, the models' shapes, how it reads candidates
(the DRAM floor, confirmations, kernels several names launch) and the decode-step graph it times."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slim_kernel import models, tune


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


@pytest.fixture
def fake_measure(monkeypatch):
    """measure() on a fake point whose weights take 4 us at the fake device's peak DRAM bandwidth."""
    from slim_kernel import timing

    monkeypatch.setattr(timing, "peak_dram_bytes_per_s", lambda device: 256 * 6144 * 2 / 4e-6)

    class FakeWorkload:
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

    def run(named, step, pdl=False, skip=frozenset()):
        monkeypatch.setattr(tune, "candidates", lambda point, pdl: named)
        notes = []
        point = FakeWorkload()
        return tune.measure(point, pdl, notes, step, skip), notes, point.checked

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


def test_a_skipped_candidate_and_every_name_of_its_kernel_are_never_launched(fake_measure):
    """bench_gemm.py --skip-variants: a variant that failed alone (smoke_kernels.py) is neither checked nor
    timed, nor is another name that launches the same kernel."""
    shared, other = (lambda *a: None), (lambda *a: None)

    class FakeStep:
        producer_us = 1.0

        def time(self, fn):
            assert fn is other
            return 6.0

    times, notes, checked = fake_measure({"jit:a": shared, "jit:b": shared, "torch": other}, FakeStep(),
                                         skip=frozenset({"jit:b"}))
    assert times == {"torch": 6.0} and checked == [other] and not notes


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

    class FakeWorkload:
        shape, m, device = models.router(256, 6144, "float32"), 5, None

        def calls(self, fn):
            return fn

    notes = []
    anchors = {"lucky": lucky, "steady": steady, "slow": slow, "never": never}
    times = tune.read_confirmed(FakeWorkload(), FakeStep(), False, {f"anchor:{k}": fn for k, fn in anchors.items()}, notes)
    assert times == {"anchor:lucky": 6.0, "anchor:steady": 5.0, "anchor:slow": 9.0}
    assert len(notes) == 1 and "anchor:never: kept reading below the DRAM floor" in notes[0]
    assert tune.read_confirmed(FakeWorkload(), FakeStep(), False, {"default": default}, notes) == {"default": 5.4}


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
