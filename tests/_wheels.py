"""Build this repository's wheel the way the build tests need it: `pip wheel` of the source tree,
no build isolation (the test env has the backend: the `test` extra), a private build dir, no index;
and fetch a released wheel once into a cache directory (`cached_download`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pip_wheel(out: Path, build: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "--no-index",
        "-w",
        str(out),
        f"--config-settings=build-dir={build}",
        str(REPO),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def one_wheel(out: Path) -> Path:
    (wheel,) = out.glob("slim_kernel-*.whl")
    return wheel


def log_tail(proc: subprocess.CompletedProcess, n: int = 3000) -> str:
    return proc.stdout[-n:] + proc.stderr[-n:]


def cached_download(spec: str, dest: Path, timeout: int = 3600) -> tuple[Path | None, str]:
    """(the wheel of `spec` ("name==version") in `dest`, ""), downloaded there once with `pip
    download --no-deps` for manylinux x86_64 / CPython 3.12; (None, pip's error) when it fails."""
    name, version = spec.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    dest.mkdir(parents=True, exist_ok=True)
    if not any(dest.glob(pattern)):
        platforms = ("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *platforms]
        proc = subprocess.run(
            [*cmd, "--python-version", "3.12", "-d", str(dest), spec],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode:
            return None, proc.stderr.strip()[-300:]
    found = sorted(dest.glob(pattern))
    return (found[0], "") if found else (None, f"pip download gave no {pattern}")
