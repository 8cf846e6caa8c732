"""A heartbeat for long test steps: while one test (or its fixtures: whole-catalogue compiles, wheel
builds, a fresh venv) runs longer than SLIM_KERNEL_TEST_HEARTBEAT_S seconds (default 20) without
output, a line says which test, for how long, and how many of the collected tests are done. Written to
the terminal pytest started on (a log file in CI), past pytest's output capture; 0 turns it off."""

from __future__ import annotations

import os
import threading
import time

ENV = "SLIM_KERNEL_TEST_HEARTBEAT_S"
_BEAT: list = []  # the running Heartbeat (the runtest hooks get no config)


class Heartbeat:
    def __init__(self, fd: int, every: float):
        self.fd, self.every = fd, every
        self.current, self.started, self.done, self.total = None, 0.0, 0, 0
        self.last = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pytest-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(min(self.every, 1.0)):
            now, current = time.monotonic(), self.current
            if current is not None and now - self.last >= self.every:
                self.last = now
                line = (f"\n[heartbeat {time.strftime('%H:%M:%S')}] still in {current} ({now - self.started:.0f} s); "
                        f"{self.done} of {self.total} tests done\n")
                try:
                    os.write(self.fd, line.encode())
                except OSError:
                    return


def pytest_configure(config):
    every = float(os.environ.get(ENV, "20") or 0)
    if every <= 0 or hasattr(config, "workerinput"):
        return
    # pytest's capture is suspended while plugins configure: fd 1 is the real stdout here
    beat = Heartbeat(os.dup(1), every)
    _BEAT[:] = [beat]
    beat.thread.start()


def pytest_collection_finish(session):
    beat = _beat()
    if beat is not None:
        beat.total = len(session.items)


def pytest_runtest_logstart(nodeid, location):
    beat = _beat()
    if beat is not None:
        beat.current, beat.started, beat.last = nodeid, time.monotonic(), time.monotonic()


def pytest_runtest_logfinish(nodeid, location):
    beat = _beat()
    if beat is not None:
        beat.done += 1
        beat.current, beat.last = None, time.monotonic()


def _beat() -> Heartbeat | None:
    return _BEAT[0] if _BEAT else None


def pytest_unconfigure(config):
    beat = _beat()
    _BEAT.clear()
    if beat is not None:
        beat.stop.set()
        beat.thread.join(timeout=2)
        os.close(beat.fd)
