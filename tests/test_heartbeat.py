"""The heartbeat (tests/_heartbeat.py): a test that runs longer than the interval without output gets a
line naming it, past pytest's capture, in a log that is not a terminal; 0 turns it off."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.parametrize("every,lines", [("0.5", True), ("0", False)])
def test_a_long_test_gets_heartbeat_lines(tmp_path, every, lines):
    (tmp_path / "test_slow_step.py").write_text("import time\n\ndef test_slow_step():\n    time.sleep(2.2)\n\n"
                                                "def test_quick():\n    pass\n")
    env = dict(os.environ, SLIM_KERNEL_TEST_HEARTBEAT_S=every,
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "_heartbeat", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_slow_step.py")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    beats = [line for line in proc.stdout.splitlines() if line.startswith("[heartbeat ")]
    if not lines:
        assert beats == []
        return
    assert len(beats) >= 2, proc.stdout
    # the node id is relative to the rootdir pytest settles on (a tmp dir may lie inside the checkout)
    assert all("test_slow_step.py::test_slow_step (" in b and "0 of 2 tests done" in b for b in beats), beats
