"""Run a command under resource limits and measure it: wall time and the peak RSS of its
process tree (ru_maxrss of the children of a fresh wrapper process, so nothing else this
process ever ran is counted).

    python tests/audit_fixtures/bounded.py [CASE...]   # the crafted-wheel table, measured
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Runs in the wrapper: the limits apply to the command and every worker it starts.
_WRAPPER = r"""
import json, resource, subprocess, sys, time
cmd, timeout, address_space, keep = json.loads(sys.argv[1])
def limit():
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
start = time.perf_counter()
try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, preexec_fn=limit)
    rc, out, err = proc.returncode, proc.stdout, proc.stderr
except subprocess.TimeoutExpired as exc:
    rc, out, err = "timeout", exc.stdout or "", exc.stderr or ""
    out, err = [s.decode(errors="replace") if isinstance(s, bytes) else s for s in (out, err)]
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
peak, cpu = usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime
print(json.dumps({"rc": rc, "wall": wall, "cpu": cpu, "peak": peak, "stdout": out[-keep:], "stderr": err[-4000:]}))
"""


@dataclass
class Run:
    rc: int | str  # "timeout" when killed
    wall: float  # seconds
    cpu: float  # seconds of CPU time (user + system) of the process tree
    peak: int  # bytes: the largest RSS of any process of the tree
    stdout: str
    stderr: str

    @property
    def peak_mib(self) -> float:
        return self.peak / 2**20


def run_bounded(
    cmd: list[str], *, timeout: float, address_space: int, env: dict | None = None, keep_stdout: int = 20_000
) -> Run:
    """Run `cmd` under the limits; its stdout is kept up to its last `keep_stdout` characters."""
    arg = json.dumps([cmd, timeout, address_space, keep_stdout])
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, arg], capture_output=True, text=True, env=env, timeout=timeout + 60
    )
    if proc.returncode != 0:
        raise RuntimeError(f"harness failed: {proc.stderr}")
    return Run(**json.loads(proc.stdout))


def audit_cmd(wheel: Path | str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "slim_kernel", "audit", "--json", "--no-progress", *extra, str(wheel)]


def _main(names: list[str]) -> int:
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from audit_fixtures.crafted import CASES

    env = dict(os.environ, PYTHONPATH=os.environ.get("PYTHONPATH", "python"))
    print("| case | wheel bytes | exit | wall s | peak RSS MiB | message |\n|---|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names or CASES:
            wheel = CASES[name][0](Path(tmp))
            run = run_bounded(
                audit_cmd(wheel),
                timeout=float(os.environ.get("BOUNDED_TIMEOUT", 600)),
                address_space=16 << 30,
                env=env,
            )
            try:
                doc = json.loads(run.stdout)
                res = doc["wheels"][0] if "wheels" in doc else doc
                msg = res.get("error", "clean" if res["clean"] else f"found {res['ops_found']}")
            except (ValueError, KeyError):
                msg = (run.stderr.strip().splitlines() or ["-"])[-1]
            print(
                f"| {name} | {wheel.stat().st_size:,} | {run.rc} | {run.wall:.1f} | {run.peak_mib:,.0f} "
                f"| {msg[:110]} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
