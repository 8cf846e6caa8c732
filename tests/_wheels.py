"""Build this repository's wheel the way the build tests need it: `pip wheel` of the source tree,
no build isolation (the test env has the backend: the `test` extra), a private build dir, no index."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pip_wheel(out: Path, build: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", str(out),
           f"--config-settings=build-dir={build}", str(REPO)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def one_wheel(out: Path) -> Path:
    (wheel,) = out.glob("slim_kernel-*.whl")
    return wheel


def log_tail(proc: subprocess.CompletedProcess, n: int = 3000) -> str:
    return proc.stdout[-n:] + proc.stderr[-n:]
