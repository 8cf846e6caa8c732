"""Where slim-kernel keeps its files: the cache directory (JIT cubins, tuned routing tables). Torch-free leaf."""

from __future__ import annotations

import os
from pathlib import Path

from .knobs import ENV_CACHE_DIR


def cache_root() -> Path:
    """``$SLIM_KERNEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/slim_kernel`` (default ``~/.cache/slim_kernel``)."""
    env = os.environ.get(ENV_CACHE_DIR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "slim_kernel"
