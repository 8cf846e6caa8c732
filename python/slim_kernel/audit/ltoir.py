"""LTO IR fatbin entries, read through nvJitLink.

nvcc's LTO IR (`code=lto_90`, cuFFT's and cuSPARSE's callback code) is NVVM's own format,
stored obfuscated when compressed; no name in it is readable as bytes. nvJitLink (the
`nvidia-nvjitlink` wheel, through `cuda.bindings`) links it to PTX on the CPU, and the PTX layer
reads that: its `.entry` kernels are what the entry would load as. nvJitLink is a third-party
compiler given hostile input, so it runs in its own process (`ltoir_child.py`) under an
address-space limit set before it reads any input, one entry at a time with a deadline (then it
is killed); a crash, a timeout or an entry it refuses makes only that entry unreadable. Without
nvJitLink, LTO IR entries are unreadable with the reason. The time spent linking per wheel is
capped (`Limits.max_lto_seconds`) so that a wheel of many entries (cuFFT 11.2: 10,046, ~7 ms
each) still gets its verdict; past it, the rest are unreadable.
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
MAX_RESTARTS = 3  # crashes (or timeouts) before nvJitLink is given up on for this process


NVVM_MAGIC = b"\xed\x43\x4e\x7f"  # raw LTO IR: NVRTC's -dlto output, an uncompressed fatbin entry's payload
# a raw module does not say its arch in any documented place: these are tried oldest first (LTO IR
# links for its own arch or any later one)
RAW_TARGETS = "sm_75,sm_80,sm_86,sm_89,sm_90,sm_100,sm_103,sm_110,sm_120,sm_121"


class LtoUnreadable(Exception):
    """This entry cannot be read through nvJitLink: the message says why."""


def wrap(header: bytes, payload: bytes) -> bytes:
    """One fatbin entry (its header and payload as stored) as a fatbin of its own."""
    body = header + payload
    return struct.pack("<IHHQ", fatbin.MAGIC, 1, 16, len(body)) + body


class Linker:
    """The nvJitLink process of this (audit or worker) process, started at its first entry."""

    def __init__(self, command: list[str] | None = None) -> None:
        self.command = command or [sys.executable, str(CHILD)]
        self._reset()

    def _reset(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.pid = os.getpid()
        self.version = ""
        self.gone = ""  # why nvJitLink cannot be used in this process (set once)
        self.restarts = 0

    def to_ptx(self, arch: str, data: bytes, limits, budget, raw: bool = False) -> bytes:
        """The PTX that nvJitLink links `data` (a fatbin of one LTO IR entry for `arch`, or with
        `raw` a bare LTO IR module) to, within the wheel's share of linking time; raises
        `LtoUnreadable` with the reason otherwise."""
        if budget.lto_seconds >= limits.max_lto_seconds:
            raise LtoUnreadable(
                f"not linked: this wheel's {limits.max_lto_seconds:g} s of nvJitLink time is spent"
            )
        started = time.monotonic()
        try:
            if raw:
                return self._request(LTOIR_INPUT, RAW_TARGETS, data, limits, budget)
            return self._request(FATBIN_INPUT, arch, data, limits, budget)
        finally:
            budget.lto_seconds += time.monotonic() - started

    def _request(self, kind: int, targets: str, blob: bytes, limits, budget) -> bytes:
        self._start(limits)
        seconds = min(limits.max_lto_entry_seconds, budget.left(), limits.max_lto_seconds - budget.lto_seconds)
        encoded = targets.encode()
        try:
            self.proc.stdin.write(REQUEST.pack(kind, len(encoded), len(blob), limits.max_entry_unpacked))
            self.proc.stdin.write(encoded + blob)
            self.proc.stdin.flush()
            status, data = self._reply(time.monotonic() + seconds)
        except (OSError, EOFError, ValueError, TimeoutError) as exc:
            reason = self._stop(exc, seconds)
            raise LtoUnreadable(reason) from None
        if status == PTX:
            return data
        raise LtoUnreadable(f"nvJitLink {self.version}: {data.decode('utf-8', 'replace')[:500]}")

    def _start(self, limits) -> None:
        if self.pid != os.getpid():  # a forked worker: the parent's process is not ours to talk to
            self._reset()
        if self.gone:
            raise LtoUnreadable(self.gone)
        if self.proc is not None:
            return
        try:
            self.proc = subprocess.Popen(
                [*self.command, str(limits.max_lto_memory)],  # the child limits its own address space
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
            )
            status, data = self._reply(time.monotonic() + START_SECONDS)
        except (OSError, EOFError, ValueError, TimeoutError) as exc:
            self._stop(exc, START_SECONDS)
            self.gone = f"nvJitLink's process did not start: {exc or type(exc).__name__}"
            raise LtoUnreadable(self.gone) from None
        if status != READY:
            self._stop(None, 0)
            self.gone = f"nvJitLink, which reads LTO IR, did not load ({data.decode('utf-8', 'replace')[:300]}); {INSTALL}"
            raise LtoUnreadable(self.gone)
        self.version = data.decode()
        # at the exit of this process, a pool worker included (their atexit handlers do not run)
        multiprocessing.util.Finalize(None, self.close, exitpriority=10)

    def close(self) -> None:
        """End the process (it exits at the end of its input), so its time counts as this one's."""
        proc, self.proc = self.proc, None
        if proc is None or self.pid != os.getpid():
            return
        proc.stdin.close()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _reply(self, deadline: float) -> tuple[int, bytes]:
        status, size = REPLY.unpack(self._read(REPLY.size, deadline))
        return status, self._read(size, deadline)

    def _read(self, n: int, deadline: float) -> bytes:
        fd, parts, got = self.proc.stdout.fileno(), [], 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            part = os.read(fd, min(n - got, 1 << 20))
            if not part:
                raise EOFError
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    def _stop(self, exc, seconds: float) -> str:
        """End the process after a failure; the reason for the entry it was given."""
        proc, self.proc = self.proc, None
        if proc is None:
            return f"nvJitLink's process could not be started: {exc}"
        proc.kill()
        code = proc.wait()
        self.restarts += 1
        if isinstance(exc, TimeoutError):
            reason = f"nvJitLink took longer than {seconds:.0f} s on it (stopped)"
        else:
            reason = f"nvJitLink's process ended on it (exit code {code}: a crash, or over its memory limit)"
        if self.restarts >= MAX_RESTARTS:
            self.gone = f"not linked: nvJitLink failed {self.restarts} times in this audit (last: {reason})"
        return reason


LINKER = Linker()
