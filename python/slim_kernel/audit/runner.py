"""Scan every member of a wheel, in parallel across members, with a progress bar on stderr.

Large members each get their own task; small ones are batched. Tasks run largest first on a
process pool (each worker opens the wheel itself and streams its members), or in-process for
small wheels where starting workers would cost more than it saves.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace

from .limits import Budget, HostileArchiveError, MiB, too_many_items
from .scan import MemberScan, ScanContext, scan_member
from .wheel import Member, WheelArchive, member_stream, open_regular, verify_member

BIG_MEMBER = 16 * MiB
BATCH_BYTES = 32 * MiB
POOL_THRESHOLD = 96 * MiB  # below this many unpacked bytes, scan in-process
PROGRESS_THRESHOLD = 64 * MiB
PROGRESS_STEP = 16 * MiB


@dataclass
class WheelScan:
    path: str
    members: list[Member]
    scans: list[MemberScan] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def unpacked(self) -> int:
        return sum(m.unpacked for m in self.members)

    @property
    def compressed_file(self) -> int:
        return os.path.getsize(self.path)


class Progress:
    """Bytes-scanned bar on stderr (tqdm when installed, else a plain updating line)."""

    def __init__(self, total: int, label: str, enabled: bool):
        self.enabled = enabled
        self._bar = None
        self._done = 0
        self._total = total
        self._label = label
        self._last = 0.0
        if enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(
                    total=total,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=f"audit {label}",
                    file=sys.stderr,
                    leave=False,
                )
            except ImportError:
                pass

    def update(self, n: int) -> None:
        if not self.enabled:
            return
        self._done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if now - self._last > 0.5 or self._done >= self._total:
            self._last = now
            pct = 100.0 * self._done / max(self._total, 1)
            print(
                f"\raudit {self._label}: {self._done / MiB:,.0f}/{self._total / MiB:,.0f} MiB ({pct:.0f}%)",
                end="",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled:
            print(file=sys.stderr)


_QUEUE = None  # set in pool workers: progress reports to the parent


def _init_worker(queue) -> None:
    global _QUEUE
    _QUEUE = queue


def _scan_task(path: str, members: list[Member], ctx: ScanContext, report=None):
    """Scan `members`; returns their scans and the items counted in `ctx.budget`."""
    pending, base = [0], ctx.budget.unpacked

    def on_progress(n: int) -> None:
        pending[0] += n
        if pending[0] >= PROGRESS_STEP:
            _emit(report, pending[0])
            pending[0] = 0

    out = []
    with open_regular(path) as f:
        for m in members:  # validated by the parent: read each straight from its offset
            scan = scan_member(member_stream(f, m, ctx.limits), m.name, m.unpacked, m.compressed, ctx, on_progress)
            if scan.unreadable:  # its parse stopped early: the archive's own check (CRC) still runs
                verify_member(f, m, ctx.budget)
            out.append(scan)
    _emit(report, pending[0])
    return out, ctx.budget.items, ctx.budget.unpacked - base, ctx.budget.spilled


def _emit(report, n: int) -> None:
    if n and report is not None:
        report(n)
    elif n and _QUEUE is not None:
        _QUEUE.put(n)


def plan_tasks(members: list[Member]) -> list[list[Member]]:
    """Big members alone, small ones in batches; largest task first."""
    tasks: list[list[Member]] = []
    batch: list[Member] = []
    batch_bytes = 0
    for m in sorted(members, key=lambda m: m.unpacked, reverse=True):
        if m.unpacked >= BIG_MEMBER:
            tasks.append([m])
            continue
        batch.append(m)
        batch_bytes += m.unpacked
        if batch_bytes >= BATCH_BYTES or len(batch) >= 256:
            tasks.append(batch)
            batch, batch_bytes = [], 0
    if batch:
        tasks.append(batch)
    return tasks


def scan_wheel(
    path: str, ctx: ScanContext, jobs: int | None = None, progress: bool | None = None
) -> WheelScan:
    """Scan all members within `ctx.limits.max_seconds`; raises `AuditInputError` if the wheel
    cannot be read safely. In-process, one `Budget` counts the wheel's work; each pool task
    gets a copy of it (same deadline, its own count) and this process adds up the counts."""
    start = time.perf_counter()
    ctx = replace(ctx, budget=Budget.starting_now(ctx.limits))
    with WheelArchive(path, ctx.limits) as archive:
        members = archive.members
    result = WheelScan(os.fspath(path), members)
    total = ctx.budget.unpacked = result.unpacked  # nested archives' members add to it
    jobs = max(1, jobs or os.cpu_count() or 1)
    show = progress if progress is not None else (total >= PROGRESS_THRESHOLD and sys.stderr.isatty())
    bar = Progress(total, os.path.basename(path), bool(show))
    tasks = plan_tasks(members)
    try:
        if jobs == 1 or total < POOL_THRESHOLD or len(tasks) == 1:
            for task in tasks:
                result.scans.extend(_scan_task(result.path, task, ctx, bar.update)[0])
        else:
            result.scans.extend(_run_pool(result.path, tasks, ctx, jobs, bar))
    finally:
        bar.close()
    order = {m.name: i for i, m in enumerate(members)}
    result.scans.sort(key=lambda s: order[s.member])
    result.seconds = time.perf_counter() - start
    return result


def _run_pool(path: str, tasks: list[list[Member]], ctx: ScanContext, jobs: int, bar: Progress):
    """Run tasks on worker processes, at most one in flight per worker; after an error (or the
    time limit) the running ones are terminated. Progress reports are drained on this thread (no
    helper thread, so forking workers is safe)."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    mp = multiprocessing.get_context(method)
    queue = mp.SimpleQueue()
    workers = min(jobs, len(tasks))
    # each worker may spill its share of the wheel's spill budget (the disk used at once is the
    # wheel's budget), and the workers' sum is checked here; so with the nvJitLink processes
    share = replace(
        ctx.limits,
        max_spill=ctx.limits.max_spill // workers,
        max_lto_processes=max(1, ctx.limits.max_lto_processes // workers),
    )
    ctx = replace(ctx, limits=share, budget=replace(ctx.budget, limits=share))
    results: dict[int, list[MemberScan]] = {}

    def drain() -> None:
        while not queue.empty():
            bar.update(queue.get())

    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp, initializer=_init_worker, initargs=(queue,))
    try:
        todo = iter(enumerate(tasks))
        running = {pool.submit(_scan_task, path, task, ctx): i for i, task in itertools.islice(todo, workers)}
        items, nested, spilled = 0, ctx.budget.unpacked, 0
        while running:
            done, _ = wait(running, timeout=0.2, return_when=FIRST_COMPLETED)
            drain()
            for fut in done:
                results[running.pop(fut)], n, unpacked, spill = fut.result()  # raise the first error now
                spilled += spill
                if spilled > ctx.limits.max_spill * workers:
                    raise HostileArchiveError(
                        f"more than {ctx.limits.max_spill * workers:,} bytes to keep on disk while reading this "
                        "wheel (hostile?)"
                    )
                items += n  # each task counted its own (from zero): their sum is the wheel's
                if items > ctx.limits.max_items:
                    raise HostileArchiveError(too_many_items(ctx.limits))
                nested += unpacked
                if nested > ctx.limits.max_total_unpacked:
                    raise HostileArchiveError(
                        f"more than {ctx.limits.max_total_unpacked:,} bytes unpacked in this wheel, nested "
                        "archives included (zip bomb?)"
                    )
                for i, task in itertools.islice(todo, 1):
                    running[pool.submit(_scan_task, path, task, ctx)] = i
            ctx.budget.check_time()
        drain()
    except BaseException:
        # an error, the time limit or an interrupt: the workers still scanning are stopped, not awaited
        workers_left = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers_left:
            proc.terminate()
        raise
    pool.shutdown()
    return [scan for i in range(len(tasks)) for scan in results[i]]
