"""The benchmarks' report plumbing and floors (GPU machine only).

The timing itself is the package's (``slim_kernel/timing.py``: the decode-step pattern that
``slim-kernel tune`` measures too; back-to-back graphs): this module re-exports it and adds what
a benchmark report carries besides, measured in the same run:
  * the HBM floor: bytes an op must read / the read bandwidth of a large torch sum;
  * the DRAM floor: the same bytes / the bandwidth of a plain 1 GiB device copy (``copy_bandwidth``);
  * the graph launch floor: the same graph of a one-element kernel (per-node launch cost).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from slim_kernel.timing import CALLS, REPS, copies_for, rotate_bytes, rotating, time_decode_step, time_graph  # noqa: F401


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _median_seconds(fn: Callable[[], object], reps: int = 10) -> float:
    """Median seconds of ``fn`` on the current stream (CUDA events), after one call that warms it."""
    fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return statistics.median(times)


def hbm_read_bandwidth(nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Bytes/s a large torch reduction reads from HBM (the bandwidth of ``hbm_floor_us``)."""
    x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    out = torch.empty((), device="cuda", dtype=torch.float32)
    seconds = _median_seconds(lambda x=x, out=out: torch.sum(x, dim=0, dtype=torch.float32, out=out), reps)
    del x, out
    torch.cuda.empty_cache()
    return nbytes / seconds


def copy_bandwidth() -> float:
    """Bytes/s of a plain 1 GiB device-to-device copy, median of 10: the DRAM floor's bandwidth.

    Bytes read + written over the time: the DRAM moves both, and all of it is what a GEMM streaming its
    weights (reads, a few KB written) could spend on them."""
    nbytes = 1 << 30
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    seconds = _median_seconds(lambda src=src, dst=dst: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds


def graph_launch_floor() -> float:
    """Per-call microseconds of a one-element kernel replayed in the same kind of graph."""
    one = torch.zeros(1, device="cuda")
    return time_graph([lambda: one.add_(1.0)])


@dataclass
class Row:
    op: str
    shape: dict
    cache: str  # "cold" | "hot"
    us: dict[str, float] = field(default_factory=dict)  # implementation -> median us per call
    pattern: str = "b2b"  # "decode" (after a producer kernel) | "b2b" (back to back)
    producer: str | None = None  # decode: "plain" (PDL-unaware) | "pdl" (flashinfer rmsnorm, PDL)
    choice: dict[str, str] = field(default_factory=dict)  # "default" -> the backend[:variant] it ran
    bytes_read: int = 0
    hbm_floor_us: float = 0.0
    launch_floor_us: float = 0.0
    unnamed: bool = False  # a shape no table names: its default runs on the estimate (bench_gemm.py)


@dataclass
class Report:
    command: str
    device: str
    torch: str
    hbm_read_GBps: float
    launch_floor_us: float
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checks: dict[str, float] = field(default_factory=dict)  # "what" -> relative error vs float64
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)  # flashinfer, sglang anchors, slim-kernel
    sms: int = 0

    def add(self, row: Row) -> Row:
        row.hbm_floor_us = row.bytes_read / (self.hbm_read_GBps * 1e9) * 1e6
        row.launch_floor_us = self.launch_floor_us
        self.rows.append(row)
        return row

    def to_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(asdict(self), f, indent=1)


_ABSOLUTE = __import__("re").compile(r"(?:/[\w.+-]+)+/([\w.+-]+)")


def scrub(text: str, limit: int = 400) -> str:
    """A note as committed: absolute paths (of the machine that ran it) reduced to their last
    component, and cut at ``limit`` characters (a compiler's whole log is not a note)."""
    text = _ABSOLUTE.sub(lambda m: m.group(1), text)
    return text if len(text) <= limit else text[:limit] + " ..."


def command_line() -> str:
    """This process's command as a user would type it: ``python3 benchmark/<script> ...`` with any
    absolute path reduced to its last component (a path of the machine that ran it means nothing
    to a reader)."""
    import os

    def clean(arg: str) -> str:
        if "=" in arg and arg.startswith("--"):
            key, _, value = arg.partition("=")
            return f"{key}={clean(value)}"
        return os.path.basename(arg.rstrip("/")) if os.path.isabs(arg) else arg

    script = sys.argv[0]
    here = os.path.relpath(os.path.abspath(script), os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return " ".join(["python3", here, *(clean(a) for a in sys.argv[1:])])


def start_report() -> tuple[Report, float]:
    t0 = time.time()
    bw = hbm_read_bandwidth()
    floor = graph_launch_floor()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    report = Report(command=command_line(), device=device_name(), torch=torch.__version__, hbm_read_GBps=bw / 1e9,
                    launch_floor_us=floor, sms=props.multi_processor_count)
    report.notes.append(f">= {CALLS} calls per graph (decode step: one producer more first), median of {REPS} replays; cold = weights rotated over "
                        f">= {rotate_bytes() >> 20} MiB of copies (more than twice the {props.L2_cache_size >> 20} MiB L2)")
    return report, t0


def plot(report: Report, path: str, groups: list[tuple[str, Callable[[Row], bool]]], impls: list[str]) -> None:
    """Latency vs M per implementation (cold), one panel per group, floors dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 5), squeeze=False)
    for ax, (title, pred) in zip(axes[0], groups):
        rows = sorted((r for r in report.rows if pred(r) and r.cache == "cold"), key=lambda r: r.shape["m"])
        if not rows:
            continue
        ms = [r.shape["m"] for r in rows]
        for name in impls:
            ys = [r.us.get(name) for r in rows]
            if any(y is not None for y in ys):
                variant = "[" in name  # tile-config variants: thin dashed, behind the main lines
                ax.plot(ms, [float("nan") if y is None else y for y in ys], marker="" if variant else "o", ms=3,
                        lw=0.8 if variant else 1.8, ls="--" if variant else "-", alpha=0.7 if variant else 1.0,
                        label=name)
        ax.plot(ms, [r.hbm_floor_us for r in rows], "k--", lw=1, label="HBM floor")
        ax.plot(ms, [r.launch_floor_us for r in rows], "k:", lw=1, label="graph launch floor")
        ax.plot(ms, [r.hbm_floor_us + r.launch_floor_us for r in rows], "k-.", lw=0.8, label="HBM + launch")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("us per call (cold, CUDA graph)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2, loc="upper left")
    fig.suptitle(f"{report.device}: HBM read {report.hbm_read_GBps / 1e3:.2f} TB/s, "
                 f"graph launch floor {report.launch_floor_us:.2f} us", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table(report: Report, impls: list[str], ms: tuple[int, ...] = (1, 2, 4, 8, 16), cache: str = "cold",
          op: str | None = None) -> str:
    """A short text table: one line per (op, shape, M), implementations as columns."""
    rows = [r for r in report.rows if op is None or r.op == op]
    cols = [i for i in impls if any(i in r.us for r in rows)]
    head = f"{'case':<34}{'M':>3} " + "".join(f"{c[:12]:>13}" for c in cols) + f"{'HBM floor':>11}{'launch':>8}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.cache != cache or r.shape["m"] not in ms:
            continue
        short = r.op.removeprefix("dsv3_").removesuffix("_gemm")
        case = f"{short} " + " ".join(f"{k}={v}" for k, v in r.shape.items() if k != "m")
        cells = "".join(f"{r.us[c]:>13.2f}" if r.us.get(c) is not None else f"{'-':>13}" for c in cols)
        lines.append(f"{case[:34]:<34}{r.shape['m']:>3} {cells}{r.hbm_floor_us:>11.2f}{r.launch_floor_us:>8.2f}")
    return "\n".join(lines)
