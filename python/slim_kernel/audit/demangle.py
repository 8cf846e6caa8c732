"""Batch C++ demangling through binutils' `c++filt` (one process per batch).

Only names that passed the cheap byte prefilter reach here, so batches are small. Without
`c++filt` names stay mangled and `available()` is False (the report says so).
"""

from __future__ import annotations

import shutil
import subprocess


def available() -> bool:
    return shutil.which("c++filt") is not None


def demangle_all(names) -> dict[str, str]:
    """Map each name to its demangled form (itself when not a mangled C++ name)."""
    names = list(dict.fromkeys(names))
    out = {n: n for n in names}
    mangled = [n for n in names if n.startswith("_Z") and "\n" not in n]
    tool = shutil.which("c++filt")
    if not mangled or tool is None:
        return out
    proc = subprocess.run(
        [tool],
        input="\n".join(mangled) + "\n",
        capture_output=True,
        text=True,
        encoding="latin-1",
        check=False,
    )
    lines = proc.stdout.splitlines()
    if proc.returncode == 0 and len(lines) == len(mangled):
        out.update(zip(mangled, lines))
    return out
