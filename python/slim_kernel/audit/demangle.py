"""Batch C++ demangling through binutils' `c++filt` (one process per batch).

Only names that passed the cheap byte prefilter reach here, so batches are small. Without
`c++filt` names stay mangled and `available()` is False (the report says so).
"""

from __future__ import annotations

import functools
import shutil
import subprocess


@functools.lru_cache(maxsize=1)
def _tool() -> str | None:
    return shutil.which("c++filt")


MAX_NAME = 8192  # longer names stay mangled (bounded demangler work on hostile input)
TIMEOUT_S = 60


def available() -> bool:
    return _tool() is not None


def demangle_all(names, timeout: float = TIMEOUT_S) -> dict[str, str]:
    """Map each name to its demangled form (itself when not a mangled C++ name); `timeout`
    seconds at most (then names stay mangled)."""
    names = list(dict.fromkeys(names))
    out = {n: n for n in names}
    mangled = [
        n for n in names if n.startswith("_Z") and n.isascii() and n.isprintable() and len(n) <= MAX_NAME
    ]
    if not mangled:
        return out
    tool = _tool()
    if tool is None:
        return out
    try:
        proc = subprocess.run(
            [tool],
            input="\n".join(mangled) + "\n",
            capture_output=True,
            text=True,
            encoding="latin-1",
            check=False,
            timeout=max(min(timeout, TIMEOUT_S), 0.1),
        )
    except subprocess.TimeoutExpired:
        return out  # a crafted name can make demanglers crawl: keep names mangled
    lines = proc.stdout.split("\n")[:-1]
    if proc.returncode == 0 and len(lines) == len(mangled):
        out.update(zip(mangled, lines))
    return out
