"""Run nox from a private virtual environment: `python3 tools/nox_venv.py -s test` is `nox -s test`.

A distribution's Python (Debian 12, Ubuntu 23.04 and newer) is marked externally managed (PEP 668):
`python3 -m pip install nox` is refused there. This script needs only the standard library and the
venv module (Debian/Ubuntu: `sudo apt-get install python3-venv`, which nox's own session venvs need
too): it makes `.nox/_nox` beside the sessions' environments, installs nox into it once (again when
missing or older than the noxfile needs) and hands it the arguments.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOME = ROOT / ".nox" / "_nox"
NOX = "nox>=2025.2.9"  # noxfile.py's nox.needs_version


def _python(home: Path) -> Path:
    return home / "bin" / "python"


def ensure() -> Path:
    """The private venv's python, with nox installed."""
    py = _python(HOME)
    if not py.exists():
        print(f"nox_venv: creating {HOME.relative_to(ROOT)} (a private virtual environment for nox)", flush=True)
        try:
            venv.EnvBuilder(with_pip=True, clear=True).create(HOME)
        except (subprocess.CalledProcessError, OSError) as exc:
            shutil.rmtree(HOME, ignore_errors=True)  # no half-made venv for the next run to trip on
            sys.exit(f"nox_venv: cannot create a virtual environment with {sys.executable} ({exc}); on Debian or "
                     "Ubuntu install the venv module first: sudo apt-get install python3-venv")
    check = subprocess.run([str(py), "-c", "import importlib.metadata as m, sys; "
                            "from packaging.requirements import Requirement as R; "
                            f"sys.exit(0 if R({NOX!r}).specifier.contains(m.version('nox')) else 1)"],
                           capture_output=True)
    if check.returncode:
        print(f"nox_venv: installing {NOX} into {HOME.relative_to(ROOT)}", flush=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", NOX], check=True)
    return py


def main() -> int:
    py = ensure()
    os.chdir(ROOT)
    return subprocess.run([str(py), "-m", "nox", *sys.argv[1:]]).returncode


if __name__ == "__main__":
    sys.exit(main())
