"""The set-up a new user meets: the README's two commands run nox through tools/nox_venv.py (a PEP 668
Python refuses `pip install nox`), .ci/run runs the README's test command as written, and the test
torch comes from PyTorch's CPU index only where it answers (tools/cpu_torch.py), falling back fast."""

from __future__ import annotations

import http.server
import re
import runpy
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CPU_TORCH = runpy.run_path(str(REPO / "tools" / "cpu_torch.py"))


def _readme_commands() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_starts_with_the_two_commands_through_the_private_nox():
    assert _readme_commands() == ["python3 tools/nox_venv.py -s build audit size", "python3 tools/nox_venv.py -s test"]


def test_ci_runs_the_readme_test_command_as_written():
    lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert _readme_commands()[1] in lines and not any("pip install" in line for line in lines)


def test_the_private_nox_satisfies_the_noxfile():
    wanted = re.search(r'nox.needs_version = "(.*?)"', (REPO / "noxfile.py").read_text()).group(1)
    assert runpy.run_path(str(REPO / "tools" / "nox_venv.py"))["NOX"] == f"nox{wanted}"


def test_torch_index_none_is_the_plain_pin(monkeypatch):
    monkeypatch.setenv(CPU_TORCH["ENV"], "none")
    args, how, env = CPU_TORCH["pip_args"]("torch==2.13.0")
    assert args == ["torch==2.13.0"] and env == "none" and "SLIM_KERNEL_TORCH_INDEX=none" in how


def test_an_index_that_does_not_answer_falls_back_fast(monkeypatch):
    monkeypatch.setenv(CPU_TORCH["ENV"], "http://127.0.0.1:9/whl/cpu")  # the discard port: refused at once
    start = time.monotonic()
    args, how, env = CPU_TORCH["pip_args"]("torch==2.13.0")
    assert time.monotonic() - start < CPU_TORCH["PROBE_TIMEOUT_S"] + 1
    assert args == ["torch==2.13.0"] and env == "none" and "does not answer" in how and "CUDA build" in how


@pytest.fixture
def index_server():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            found = self.path == "/whl/cpu/torch/"
            self.send_response(200 if found else 404)
            self.end_headers()
            self.wfile.write(b"<a href='torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl'>torch</a>" if found else b"")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_an_index_that_answers_is_used_with_short_pip_limits(monkeypatch, index_server):
    monkeypatch.setenv(CPU_TORCH["ENV"], f"{index_server}/whl/cpu/")
    args, how, env = CPU_TORCH["pip_args"]("torch==2.13.0")
    assert args == ["--index-url", f"{index_server}/whl/cpu", *CPU_TORCH["PIP_LIMITS"], "torch==2.13.0"]
    assert env == f"{index_server}/whl/cpu" and "CPU build" in how
    monkeypatch.setenv(CPU_TORCH["ENV"], f"{index_server}/elsewhere")  # answers, but has no torch page
    assert CPU_TORCH["pip_args"]("torch==2.13.0")[0] == ["torch==2.13.0"]
