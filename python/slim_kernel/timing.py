"""Timing in the decode-step pattern: what ``slim-kernel tune`` and the benchmark both measure.

Each GEMM follows, on the same stream inside a CUDA graph, the kernel that writes its activation
(the producer); weights rotate over enough distinct copies that the bytes touched between two
uses of one copy exceed twice the L2 (cold, as in a model: every layer has its own weights). Per
call = (median replay of ``CALLS`` producer+GEMM pairs - median replay of the producers alone) /
``CALLS`` (both graphs open with one producer more), the two graphs replayed alternately so drift
hits both (:class:`DecodeStep`).
Back-to-back calls of one GEMM (:func:`time_graph`) let its PDL prologue overlap its own previous
call, which no model does: the benchmark reports them, routing never uses them.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

CALLS = 48  # calls per captured graph
REPS = 15  # timed replays; the median is reported
WARMUP = 3
MIN_ROTATE_BYTES = 160 << 20  # at least this much, and at least twice the device's L2


def rotate_bytes(device: torch.device | None = None) -> int:
    """Bytes of distinct weight copies a cold rotation cycles through on ``device``."""
    l2 = getattr(torch.cuda.get_device_properties(device or torch.cuda.current_device()), "L2_cache_size", 0)
    return max(MIN_ROTATE_BYTES, 2 * l2 + (8 << 20))


def copies_for(nbytes: int, cold: bool, device: torch.device | None = None) -> int:
    """How many weight copies a rotation needs so each copy is evicted before its reuse."""
    return max(2, -(-rotate_bytes(device) // max(nbytes, 1))) if cold else 1


def rotating(tensor: torch.Tensor, copies: int) -> list[torch.Tensor]:
    """``copies`` distinct buffers with ``tensor``'s values (the first is ``tensor`` itself)."""
    return [tensor] + [tensor.clone() for _ in range(copies - 1)]


def capture(seq: list[Callable[[], None]]) -> torch.cuda.CUDAGraph:
    """``seq`` run once eagerly (compiles, plans, heuristics), then captured in one graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in dict.fromkeys(seq):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in seq:
            fn()
    for _ in range(WARMUP):
        graph.replay()
    return graph


def replay_ms(graphs: list[torch.cuda.CUDAGraph], reps: int) -> list[list[float]]:
    """Replay the graphs alternately, ``reps`` rounds; milliseconds per replay of each graph."""
    events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in graphs]
              for _ in range(reps)]
    for rnd in events:
        for graph, (start, end) in zip(graphs, rnd):
            start.record()
            graph.replay()
            end.record()
    torch.cuda.synchronize()
    return [[rnd[i][0].elapsed_time(rnd[i][1]) for rnd in events] for i in range(len(graphs))]


def time_graph(calls: list[Callable[[], None]], *, reps: int = REPS) -> float:
    """Median microseconds per call of ``calls`` (run in order, cycled to CALLS) replayed in a graph."""
    seq = [calls[i % len(calls)] for i in range(max(CALLS, len(calls)))]
    graph = capture(seq)
    (ms,) = replay_ms([graph], reps)
    del graph
    return statistics.median(ms) * 1e3 / len(seq)


class DecodeStep:
    """Per-call µs of GEMMs after ``producer``: the producers-alone graph is captured once and
    replayed alternately with each GEMM's producer+GEMM graph. Both graphs hold at least ``CALLS``
    calls (``calls``: more where more weight copies rotate) and open with one producer more, so no
    producer is the graph's first node: in a model the producer follows the previous layer's
    kernel, and a PDL-aware producer then carries the programmatic edge that PDL's auto mode looks
    for (slim_kernel/pdl.py). Without it the first GEMM of each graph went without PDL: 1 of 4-6
    calls at fused-A's shapes, +0.08-0.1 µs per call on the default path (H200)."""

    def __init__(self, producer: Callable[[], None], calls: int = CALLS):
        self.producer, self.calls = producer, max(CALLS, calls)
        self.alone = capture([producer] * (self.calls + 1))
        self.producer_us = 0.0

    def time(self, gemm_calls: list[Callable[[], None]], *, reps: int = REPS) -> float:
        n = max(self.calls, len(gemm_calls))
        if n != self.calls:
            raise ValueError(f"{len(gemm_calls)} weight copies need graphs of {n} calls, not {self.calls}")
        pairs = capture([self.producer] + [fn for i in range(n) for fn in (self.producer, gemm_calls[i % len(gemm_calls)])])
        with_gemm, without = replay_ms([pairs, self.alone], reps)
        del pairs
        self.producer_us = statistics.median(without) * 1e3 / (n + 1)  # the producer's own, as this reading saw it
        return (statistics.median(with_gemm) - statistics.median(without)) * 1e3 / n


def time_decode_step(producer: Callable[[], None], calls: list[Callable[[], None]], *, reps: int = REPS) -> float:
    """Median microseconds per GEMM call net of its producer (one-off :class:`DecodeStep`)."""
    return DecodeStep(producer, len(calls)).time(calls, reps=reps)


def peak_dram_bytes_per_s(device: torch.device | None = None) -> float:
    """The device's DRAM bandwidth by its memory clock and bus width (double data rate, as
    ``torch.cuda._device_limits`` reckons it); 0 where this torch does not report them."""
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return 2 * getattr(props, "memory_clock_rate", 0) * 1e3 * getattr(props, "memory_bus_width", 0) / 8


def producers(x: torch.Tensor, gen: torch.Generator | None = None) -> dict[str, Callable[[], None]]:
    """The kernels that write the activation ``x``: ``plain``, a PDL-unaware torch elementwise
    kernel, and ``pdl``, flashinfer's ``rmsnorm(..., enable_pdl=True)`` (what sglang runs on
    Hopper) where flashinfer is installed."""
    src = torch.randn(x.shape, generator=gen, device=x.device, dtype=torch.float32).to(x.dtype)
    out = {"plain": lambda: torch.mul(src, 1.0, out=x)}
    try:
        import flashinfer.norm as fi_norm
    except Exception:  # noqa: BLE001 - no (usable) flashinfer: no PDL-aware producer
        return out
    gamma = torch.randn(x.shape[1], generator=gen, device=x.device, dtype=torch.float32).to(x.dtype)
    out["pdl"] = lambda: fi_norm.rmsnorm(src, gamma, 1e-6, out=x, enable_pdl=True)
    return out
