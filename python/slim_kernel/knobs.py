"""Run-time knobs and the one generation counter that invalidates every cached call plan.

Torch-free. Every run-time ``SLIM_KERNEL_*`` environment variable is declared here (:data:`VARIABLES`;
the modules that read them import their names from here, and ``slim-kernel info`` lists them from
here). A knob change (PDL, JIT tile rules, a reloaded routing table) calls :func:`bump`; the ops'
per-signature plans and the JIT backend's launch plans carry the generation they were made in and are
rebuilt on the next call after a bump. ``SLIM_KERNEL_BACKEND_<OP>`` pins are part of the plan key (read
per call), so they need no bump.
"""

from __future__ import annotations

import os

ENV_PDL = "SLIM_KERNEL_PDL"
# What the JIT does with a kernel missing from its cache: compile it (the default), raise
# (cache-only), or leave the call to the next backend with one warning (cache-or-fallback).
ENV_JIT = "SLIM_KERNEL_JIT"
JIT_MODES = ("compile", "cache-only", "cache-or-fallback")
# Shared memory (bytes) each SM keeps free, beside our CTAs, for a CTA of the kernel before ours (0: the
# driver's carveout choice); read when a call is planned (jit/runtime.py carveout_percent)
ENV_SMEM_ROOM = "SLIM_KERNEL_SMEM_ROOM"
ENV_CACHE_DIR = "SLIM_KERNEL_CACHE_DIR"
ENV_COMPILER = "SLIM_KERNEL_JIT_COMPILER"
ENV_LAUNCHER = "SLIM_KERNEL_LAUNCHER"
ENV_FLASHINFER_DIRECT = "SLIM_KERNEL_FLASHINFER_DIRECT"
ENV_TRACE = "SLIM_KERNEL_JIT_TRACE"
# every run-time variable, in the order `slim-kernel info` lists them: name -> what it sets
# (build-time variables, SLIM_KERNEL_NATIVE and SLIM_KERNEL_AOT_*, are CMake's and noxfile.py's)
VARIABLES: dict[str, str] = {
    ENV_PDL: "PDL launches: auto (after a PDL-aware kernel under capture), 1 or 0",
    ENV_JIT: "a kernel missing from the JIT cache: compile, cache-only or cache-or-fallback",
    ENV_SMEM_ROOM: "bytes of an SM's shared memory left for the kernel before ours",
    "SLIM_KERNEL_BACKEND_<OP>": "pins an op's backend",
    "SLIM_KERNEL_JIT_CONFIG_<OP>": "the JIT tile rules of an op (jit/rules.py)",
    ENV_COMPILER: "the JIT compiler: nvrtc or nvcc",
    ENV_CACHE_DIR: "the cache directory (JIT cubins, tuned routing tables)",
    ENV_FLASHINFER_DIRECT: "0: bmm_fp8 through flashinfer's public call only",
    ENV_LAUNCHER: "the JIT launcher: native or python",
    ENV_TRACE: "a file that gets one JSON line per JIT compile (tests, debugging)",
}


def backend_var(op: str) -> str:
    """``SLIM_KERNEL_BACKEND_<OP>``: pins ``op``'s backend."""
    return f"SLIM_KERNEL_BACKEND_{op.upper()}"


def jit_config_var(op: str) -> str:
    """``SLIM_KERNEL_JIT_CONFIG_<OP>``: ``op``'s JIT tile rules."""
    return f"SLIM_KERNEL_JIT_CONFIG_{op.upper()}"
SMEM_ROOM_DEFAULT = 32768  # a fused_add_rmsnorm CTA at hidden 7168 (28 KB) and the driver's 1 KB
_FALSE = ("0", "false", "off", "no")
_TRUE = ("1", "true", "on", "yes")


def parse_bool(name: str, value: str | None, default: bool) -> bool:
    """An on/off environment value; anything else is a ValueError naming the variable."""
    if value is None or not value.strip():
        return default
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"{name} must be one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}, got {value!r}")


class _State:
    __slots__ = ("generation", "pdl", "pdl_auto", "error")

    def __init__(self):
        self.generation = 0
        self.pdl = True
        self.pdl_auto = True  # under graph capture, PDL only after a PDL-aware producer (slim_kernel/pdl.py)
        self.error: str | None = None  # a malformed knob in the environment


STATE = _State()


def load_env() -> None:
    """(Re)read the knobs from the environment; a malformed value is kept for :func:`check_env`."""
    value = os.environ.get(ENV_PDL)
    STATE.pdl, STATE.pdl_auto, STATE.error = True, True, None
    if value is not None and value.strip().lower() not in ("", "auto"):
        try:
            STATE.pdl, STATE.pdl_auto = parse_bool(ENV_PDL, value, True), False
        except ValueError as exc:
            STATE.error = f"{exc} (or auto)"
    bump()


def check_env() -> None:
    """Raise the ValueError of a malformed knob (ops call this when they plan a call signature)."""
    if STATE.error is not None:
        raise ValueError(STATE.error)
    jit_mode()


def jit_mode() -> str:
    """``SLIM_KERNEL_JIT``: ``compile`` (default), ``cache-only`` or ``cache-or-fallback``; read when
    asked (a plan, a cache miss), so a change applies to the next call signature planned."""
    raw = os.environ.get(ENV_JIT)
    value = (raw or "").strip().lower() or "compile"
    if value not in JIT_MODES:
        raise ValueError(f"{ENV_JIT} must be one of {', '.join(JIT_MODES)}, got {raw!r}")
    return value


def smem_room() -> int:
    """``SLIM_KERNEL_SMEM_ROOM``: bytes of an SM's shared memory left for the kernel before ours (default
    32768: a CTA of flashinfer's fused_add_rmsnorm, what sglang runs before these GEMMs; 0: the driver's choice)."""
    raw = os.environ.get(ENV_SMEM_ROOM)
    if raw is None or not raw.strip():
        return SMEM_ROOM_DEFAULT
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= 1 << 20:
        raise ValueError(f"{ENV_SMEM_ROOM} must be a number of bytes from 0 to {1 << 20}, got {raw!r}")
    return value


def bump() -> None:
    STATE.generation += 1


def pdl() -> bool:
    """Whether our JIT kernels and flashinfer's may launch with programmatic dependent launch
    (default yes; ``SLIM_KERNEL_PDL=auto|1|0``).

    With PDL a GEMM starts streaming its weights while the previous kernel on the stream is
    finishing, and reads its activation only after that kernel completes. The weights must
    therefore not be written by the immediately preceding kernel (true for model parameters).
    """
    return STATE.pdl


def pdl_auto() -> bool:
    """``auto`` (the default): eager launches use PDL; a launch under CUDA-graph capture uses it
    only when the kernel it follows was itself launched with PDL (``slim_kernel/pdl.py``)."""
    return STATE.pdl and STATE.pdl_auto


def pdl_setting() -> bool | str:
    """The setting as :func:`set_pdl` takes it: ``"auto"``, True (always) or False (never)."""
    return "auto" if pdl_auto() else STATE.pdl


def set_pdl(enabled: bool | str) -> None:
    """``"auto"``, True (every launch with PDL) or False (none)."""
    if enabled == "auto":
        STATE.pdl, STATE.pdl_auto = True, True
    else:
        STATE.pdl, STATE.pdl_auto = bool(enabled), False
    bump()


load_env()
