"""A repository that stands on its own (CPU): no tracked file names a path outside the repository
(the sibling shared folder one level up, a checkout of the sglang anchors in a dot folder) or a path
of the machine a run was made on (a home or work directory).

Flagged: those two, and absolute paths under the root user's home, a work tree, the home of any user,
/Users/<user>/, /mnt/, /scratch/. Allowed: system paths that mean the same on every machine and that
code and docs use on purpose (/usr/local/cuda, /tmp for throw-away files, /dev/null, /proc, /etc),
and relative paths inside the repository. Binary files are skipped; so is this file. The patterns
are put together from pieces so that a plain grep of the tree for them finds no file at all.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SIBLING, ANCHORS = ".." + "/shared", "." + "anchors/"
MACHINE_ROOTS = ("ro" + "ot", "wo" + "rk", "mnt", "scratch")  # a user's or a run's tree, never the same twice
OUTSIDE = re.compile(re.escape(SIBLING) + "|" + re.escape(ANCHORS) + r"|(?<![\w.~-])/(?:" + "|".join(MACHINE_ROOTS)
                     + r")/|(?<![\w.~-])/(?:home|Users)/\w")


def _tracked() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [n for n in out.decode().split("\0") if n and n != Path(__file__).relative_to(REPO).as_posix()]


def _hits(names: list[str]) -> list[str]:
    found = []
    for name in names:
        path = REPO / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (PNG, gzip, wheel)
        for lineno, line in enumerate(data.decode(errors="replace").splitlines(), 1):
            for m in OUTSIDE.finditer(line):
                found.append(f"{name}:{lineno}: {line[max(0, m.start() - 40):m.end() + 40].strip()}")
    return found


def test_the_pattern_flags_what_it_should():
    flagged = [SIBLING + "/device/make-bundle.py", "--sglang " + ANCHORS + "sglang_jit",
               f"--json /{MACHINE_ROOTS[0]}/out/x.json", f"cd /{MACHINE_ROOTS[1]}/main", "/" + "home/alice/src",
               "/Users/bob/x", "/mnt/data/x", "/scratch/run1"]
    allowed = ["/usr/local/cuda/bin/nvcc", "/tmp/wheels", "/dev/null", "/proc/self", "pkg/data/blob.tar.gz",
               "python/slim_kernel/work/x", "~/.cache/slim_kernel", "benchmark/results/h200"]
    assert [s for s in flagged if not OUTSIDE.search(s)] == []
    assert [s for s in allowed if OUTSIDE.search(s)] == []


def test_no_tracked_file_names_an_outside_or_machine_path():
    hits = _hits(_tracked())
    assert not hits, "paths outside the repository or of one machine:\n" + "\n".join(hits[:40])
