"""LTO IR fatbin entries, read through nvJitLink.

nvcc's LTO IR (`code=lto_90`, cuFFT's and cuSPARSE's callback code) is NVVM's own format,
stored obfuscated when compressed; no name in it is readable as bytes. nvJitLink (the
`nvidia-nvjitlink` wheel, through `cuda.bindings`) links it to PTX on the CPU, and the PTX layer
reads that: its kernels and device functions are what the entry would load as. nvJitLink is a third-party
compiler given hostile input, so it runs in processes of its own (`ltoir_child.py`, up to
`Limits.max_lto_processes` linking at once while the scan reads on) under an address-space limit
set before they read any input, one entry per process at a time with a deadline (then it is
killed); a crash, a timeout or an entry it refuses makes only that entry unreadable. Without
nvJitLink, LTO IR entries are unreadable with the reason. The time spent linking per wheel is
capped (`Limits.max_lto_seconds`, and at most half the wheel's time limit, summed over the
processes) so that a wheel of many entries (cuFFT 11.2: 10,046, ~7 ms each) still gets its
verdict; past it, the rest are unreadable.
"""

from __future__ import annotations

import multiprocessing.util
import os
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

from . import fatbin
from .ltoir_child import FATBIN_INPUT, LTOIR_INPUT, PTX, READY, REPLY, REQUEST

CHILD = Path(__file__).with_name("ltoir_child.py")
INSTALL = "to install it: pip install nvidia-nvjitlink (with cuda-bindings 13; the 'audit' extra has both)"
START_SECONDS = 60.0  # importing cuda.bindings and loading nvJitLink on a cold disk
MAX_FAILURES = 3  # crashes (or timeouts) before nvJitLink is given up on for this process


NVVM_MAGIC = b"\xed\x43\x4e\x7f"  # raw LTO IR: NVRTC's -dlto output, an uncompressed fatbin entry's payload
# a raw module does not say its arch in any documented place: these are tried oldest first (LTO IR
# links for its own arch or any later one)
RAW_TARGETS = "sm_75,sm_80,sm_86,sm_89,sm_90,sm_100,sm_103,sm_110,sm_120,sm_121"


def wrap(header: bytes, payload: bytes) -> bytes:
    """One fatbin entry (its header and payload as stored) as a fatbin of its own."""
    body = header + payload
    return struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, len(body)) + body


class _Child:
    """One nvJitLink process, at most one request in flight."""

    def __init__(self, command: list[str], limits) -> None:
        self.proc = subprocess.Popen(
            [*command, str(limits.max_lto_memory)],  # the child limits its own address space
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        self.fd = self.proc.stdout.fileno()
        self.job = None  # (started, deadline, seconds, done, budget) of the request in flight

    def send(self, kind: int, targets: str, data: bytes, most: int) -> None:
        encoded = targets.encode()
        self.proc.stdin.write(REQUEST.pack(kind, len(encoded), len(data), most))
        self.proc.stdin.write(encoded + data)
        self.proc.stdin.flush()

    def reply(self, deadline: float) -> tuple[int, bytes]:
        status, size = REPLY.unpack(self._read(REPLY.size, deadline))
        return status, self._read(size, deadline)

    def _read(self, n: int, deadline: float) -> bytes:
        parts, got = [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise TimeoutError
            part = os.read(self.fd, min(n - got, 1 << 20))
            if not part:
                raise EOFError
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def kill(self) -> int:
        self.proc.kill()
        return self.proc.wait()

    def close(self) -> None:
        """End the process (it exits at the end of its input), so its time counts as its parent's."""
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()


FAILURES = (OSError, EOFError, ValueError, TimeoutError)


class Linker:
    """The nvJitLink processes of this (audit or worker) process, started as entries need them.
    `submit` hands an entry to a free one (waiting for one when all are busy) and returns; its
    `done` callback runs when the answer comes, within a later `submit` or in `drain`."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.command = command or [sys.executable, str(CHILD)]
        self._reset()

    def _reset(self) -> None:
        self.children: list[_Child] = []
        self.pid = os.getpid()
        self.version = ""
        self.gone = ""  # why nvJitLink cannot be used in this process (set once)
        self.failures = 0
        self.finalizer = None

    def submit(self, arch: str, data: bytes, limits, budget, done, raw: bool = False) -> None:
        """Link `data` (a fatbin of one LTO IR entry for `arch`, or with `raw` a bare LTO IR
        module) to PTX within the wheel's share of linking time; `done(ptx, "")` or `done(None,
        reason)` follows."""
        if self.pid != os.getpid():  # a forked worker: the parent's processes are not ours
            self._reset()
        share = min(limits.max_lto_seconds, limits.max_seconds / 2)  # the rest of the scan keeps its time
        spent = f"not linked: this wheel's {share:g} s of nvJitLink time is spent"
        if budget.lto_seconds >= share:
            return done(None, spent)
        try:
            child = self._free_child(limits)  # may take answers, which count
        except BaseException:
            self.abort()
            raise
        if child is None or budget.lto_seconds >= share:
            return done(None, self.gone or spent)
        seconds = min(limits.max_lto_entry_seconds, budget.left(), share - budget.lto_seconds)
        started = time.monotonic()
        child.job = (started, started + seconds, seconds, done, budget)
        try:
            child.send(LTOIR_INPUT if raw else FATBIN_INPUT, RAW_TARGETS if raw else arch, data, limits.max_entry_unpacked)
        except FAILURES as exc:
            self._failed(child, exc)

    def drain(self) -> None:
        """Wait for every answer (their callbacks run here)."""
        try:
            while any(c.job for c in self.children):
                self._wait_one()
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Drop the requests in flight (a bound stopped the scan): their processes are killed."""
        for child in [c for c in self.children if c.job]:
            child.kill()
            self.children.remove(child)

    def close(self) -> None:
        if self.pid == os.getpid():
            for child in self.children:
                child.close()
        self.children = []

    def _free_child(self, limits) -> _Child | None:
        while True:
            if self.gone:
                return None
            idle = [c for c in self.children if not c.job]
            if idle:
                return idle[0]
            if len(self.children) < max(1, min(limits.max_lto_processes, _cpus())):
                return self._start(limits)
            self._wait_one()

    def _start(self, limits) -> _Child | None:
        child = None
        try:
            child = _Child(self.command, limits)
            status, data = child.reply(time.monotonic() + START_SECONDS)
        except FAILURES as exc:
            if child is not None:
                child.kill()
            self.gone = f"nvJitLink's process did not start: {exc or type(exc).__name__}"
            return None
        if status != READY:
            child.kill()
            self.gone = f"nvJitLink, which reads LTO IR, did not load ({data.decode('utf-8', 'replace')[:300]}); {INSTALL}"
            return None
        self.version = data.decode()
        self.children.append(child)
        if self.finalizer is None:  # at the exit of this process, a pool worker included (no atexit there)
            self.finalizer = multiprocessing.util.Finalize(None, self.close, exitpriority=10)
        return child

    def _wait_one(self) -> None:
        """Take the next answer (or the first deadline passed) and run its callback."""
        busy = [c for c in self.children if c.job]
        wait = max(min(c.job[1] for c in busy) - time.monotonic(), 0)
        ready = select.select([c.fd for c in busy], [], [], wait)[0]
        child = next(c for c in busy if c.fd in ready) if ready else min(busy, key=lambda c: c.job[1])
        try:
            status, data = child.reply(child.job[1])
        except FAILURES as exc:
            return self._failed(child, exc)
        done = self._finish(child)
        if status == PTX:
            done(data, "")
        else:
            done(None, f"nvJitLink {self.version}: {data.decode('utf-8', 'replace')[:500]}")

    def _finish(self, child: _Child):
        started, _, _, done, budget = child.job
        budget.lto_seconds += time.monotonic() - started
        child.job = None
        return done

    def _failed(self, child: _Child, exc) -> None:
        """A request's process crashed or ran out of time: it is killed, the entry unreadable."""
        seconds = child.job[2]
        done = self._finish(child)
        code = child.kill()
        self.children.remove(child)
        if isinstance(exc, TimeoutError):
            reason = f"nvJitLink took longer than {seconds:.0f} s on it (stopped)"
        else:
            reason = f"nvJitLink's process ended on it (exit code {code}: a crash, or over its memory limit)"
        self.failures += 1
        if self.failures >= MAX_FAILURES:
            self.gone = f"not linked: nvJitLink failed {self.failures} times in this audit (last: {reason})"
        done(None, reason)



def _cpus() -> int:
    """CPUs this process may run on (its affinity where the OS says, as in a container)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


LINKER = Linker()
