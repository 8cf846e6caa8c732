"""How the test runs install their torch: a CPU build from PyTorch's CPU index where that index answers,
else the plain requirement from the configured index (stdlib only: noxfile.py and tests/test_packaging.py
load this file by path).

PyPI's Linux x86_64 `torch==X` is a CUDA build (about 3 GB with its nvidia-* packages); the CPU index
serves the same version as `X+cpu` (about 190 MB, 750 MB installed), which is all the CPU tests need.
`SLIM_KERNEL_TORCH_INDEX` names another index, or `none` for the plain requirement (a machine whose own
pip configuration already serves a CPU build, or that wants the CUDA one).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
ENV = "SLIM_KERNEL_TORCH_INDEX"
PROBE_TIMEOUT_S = 5.0
# pip's own limits for the CPU-index install: a stalled index fails in seconds, not after pip's
# default 15 s x 5 retries per request.
PIP_LIMITS = ("--timeout", "20", "--retries", "1")


def index() -> str | None:
    """The index to try first (None: the plain requirement only)."""
    value = os.environ.get(ENV, CPU_INDEX).strip()
    return None if value.lower() in ("", "none") else value.rstrip("/")


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``url``'s torch page does not answer within ``timeout`` seconds, or None when it does."""
    try:
        with urllib.request.urlopen(f"{url}/torch/", timeout=timeout) as response:
            response.read(1)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc)) or type(exc).__name__
    return None


def pip_args(requirement: str) -> tuple[list[str], str, str]:
    """``(pip install arguments, what they install, the value of ENV that repeats this choice)``."""
    url = index()
    if url is None:
        return [requirement], f"{requirement} from the configured index ({ENV}=none)", "none"
    why = unreachable(url)
    if why is not None:
        return ([requirement], f"{requirement} from the configured index: {url} does not answer ({why}); on PyPI "
                "that is a CUDA build, about 3 GB", "none")
    return ["--index-url", url, *PIP_LIMITS, requirement], f"{requirement} as a CPU build from {url}", url
