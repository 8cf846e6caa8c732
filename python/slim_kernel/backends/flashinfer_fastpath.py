"""bmm_fp8 through flashinfer: ``flashinfer.bmm_fp8(backend="cublas")`` without its per-call Python.

The public call checks its arguments, builds a cuBLAS runner, asks flashinfer's autotuner
for a (runner, tactic), takes the bmm_fp8 workspace and runs the runner. The fast path runs
the same steps with flashinfer's own objects: the runner is built once; the tuner's answer
is cached per call signature until the tuner's state changes (and asked on every call while
it tunes or an autotune context is open); the workspace comes, on every call, from the very
helper ``flashinfer.bmm_fp8`` calls (0.7.4: one buffer per CUDA stream); tactic -1 calls the
function the runner calls for it. So the same cuBLASLt call runs on the same workspace.

No version string is matched: the internals are found by reading ``flashinfer.bmm_fp8``'s
own code (the names it calls) and checked for what is used. The path then proves itself:
the first eager result of each (call signature, tactic) is compared bit for bit with the
public call. A missing internal, an error or a mismatch turns it off for the process with
one RuntimeWarning saying why; the public call serves every call after.
``SLIM_KERNEL_FLASHINFER_DIRECT=0`` turns it off.

CUDA-graph capture cannot compare (no sync): a signature not yet verified is served by the
public call (captured as is) and verified on its first eager call; a verified one runs the
fast path. A nondeterministic cuBLASLt algorithm would fail the comparison and leave the
public call serving: the safe side.

flashinfer is imported on the first call only, so :func:`fast_path_state` works without it.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import threading
import warnings
from importlib import metadata
from types import SimpleNamespace

import torch

from ..knobs import ENV_FLASHINFER_DIRECT as ENV  # noqa: E402

# The workspace helpers flashinfer.bmm_fp8 has called, newest first (0.7.4: per stream).
WORKSPACE_HELPERS = ("_get_stream_cache_buf", "_get_cache_buf")
# The AutoTuner state choose_one's answer depends on (read by _Direct._token).
TUNER_ATTRS = ("is_tuning_mode", "profiling_cache", "_file_configs", "_winner_partitions", "_managed_cache",
               "_v2_local", "_override_local", "_skip_ops_local")
_NOT_CHECKED = "not checked until the first flashinfer bmm_fp8 call"
_MAX_PLANS = 4096
# os.environ.get costs ~0.6 µs; the POSIX bytes mapping it keeps in sync is read in ~0.04 µs.
_ENV_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None


def _load_from_file_env():
    if _ENV_BYTES is not None:
        return _ENV_BYTES.get(b"FLASHINFER_AUTOTUNER_LOAD_FROM_FILE")
    return os.environ.get("FLASHINFER_AUTOTUNER_LOAD_FROM_FILE")


class MissingInternal(Exception):
    """A flashinfer internal the fast path needs is not there (the message says which)."""


def _need(ok, what: str) -> None:
    if not ok:
        raise MissingInternal(what)


def find_internals(fi) -> SimpleNamespace:
    """What ``fi.bmm_fp8(backend="cublas")`` uses, read from its own code (cheap: builds nothing)."""
    fn = inspect.unwrap(fi.bmm_fp8)
    code = getattr(fn, "__code__", None)
    _need(code is not None, "flashinfer.bmm_fp8 is not a Python function")
    names, g = code.co_names, fn.__globals__
    helper = next((n for n in WORKSPACE_HELPERS if n in names and callable(g.get(n))), None)
    _need(helper, f"flashinfer.bmm_fp8 calls none of the workspace helpers {', '.join(WORKSPACE_HELPERS)}")
    _need("bmm_fp8_workspace" in code.co_consts, "flashinfer.bmm_fp8 takes no 'bmm_fp8_workspace' buffer")
    _need("DEFAULT_WORKSPACE_SIZE" in names and isinstance(g.get("DEFAULT_WORKSPACE_SIZE"), int),
          "flashinfer.bmm_fp8 sizes its workspace without DEFAULT_WORKSPACE_SIZE")
    gemm = g.get("fp8_gemm_sm100")
    _need("fp8_gemm_sm100" in names and inspect.isfunction(gemm), "flashinfer.bmm_fp8 does not call fp8_gemm_sm100")
    gcode = gemm.__code__
    _need("choose_one" in gcode.co_names and "fp8_gemm" in gcode.co_consts,
          "fp8_gemm_sm100 does not call AutoTuner.choose_one('fp8_gemm', ...)")
    configs = [n for n in gcode.co_names if type(g.get(n)).__name__ == "TuningConfig"]
    _need(len(configs) == 1, f"fp8_gemm_sm100 names {len(configs)} TuningConfigs, expected one")
    tuner = g.get("AutoTuner")
    _need(callable(getattr(tuner, "get", None)) and callable(getattr(tuner, "choose_one", None)),
          "flashinfer has no AutoTuner.get / AutoTuner.choose_one")
    _need(callable(g.get("get_gemm_module")), "flashinfer.gemm.gemm_base has no get_gemm_module")
    return SimpleNamespace(workspace=g[helper], workspace_size=g["DEFAULT_WORKSPACE_SIZE"],
                           tuning_config=g[configs[0]], tuner_cls=tuner, get_gemm_module=g["get_gemm_module"],
                           where=f"{getattr(g[helper], '__module__', '?')}.{helper}")


def make_public_call(public):
    """``out = public(..., backend="cublas")``: flashinfer's public call, the fallback.

    ``skip_check=True`` (flashinfer's own switch for callers that validated already) when its
    wrapper takes it: the op validated these arguments, so flashinfer's checks would be done twice.
    """
    takes_skip = "skip_check" in getattr(getattr(public, "__code__", None), "co_consts", ())
    if takes_skip:
        def public_call(out, A, B, A_scale, B_scale):
            public(A, B, A_scale, B_scale, out.dtype, out, backend="cublas", skip_check=True)
    else:
        def public_call(out, A, B, A_scale, B_scale):
            public(A, B, A_scale, B_scale, out.dtype, out, backend="cublas")
    return public_call


def _tactic_minus_one(runner):
    """What the runner's forward calls for tactic -1: ``bmm_fp8`` of the module it closes over."""
    fwd = getattr(type(runner), "forward", None)
    code = getattr(fwd, "__code__", None)
    if code is None or "module" not in code.co_freevars or "bmm_fp8" not in code.co_names:
        return None
    return getattr(fwd.__closure__[code.co_freevars.index("module")].cell_contents, "bmm_fp8", None)


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _describe(sig) -> str:
    a_shape, b_shape, a_dtype, b_dtype, out_dtype, device = sig
    return (f"A {tuple(a_shape)} {a_dtype}, B {tuple(b_shape)} {b_dtype}, out {out_dtype}, "
            f"device {'cpu' if device < 0 else device}")


def _same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    # bf16/fp16 compared as int16: NaN == NaN and -0 != +0, bit for bit.
    return torch.equal(x.view(torch.int16), y.view(torch.int16))


class _Direct:
    """The fast path: flashinfer's runner, tuner answer and workspace, cached (see the module doc)."""

    def __init__(self, found: SimpleNamespace, public_call):
        tuner = found.tuner_cls.get()
        missing = [a for a in TUNER_ATTRS if not hasattr(tuner, a)]
        _need(not missing, f"flashinfer's AutoTuner has no {', '.join(missing)}")
        runner = found.get_gemm_module().cublas_fp8_gemm_runner()  # JIT-builds flashinfer's gemm module
        _need(callable(getattr(runner, "forward", None)), "flashinfer's cuBLAS fp8 runner has no forward")
        self.public_call = public_call
        self.tuner, self.runner, self.config = tuner, runner, found.tuning_config
        self.workspace, self.workspace_size = found.workspace, found.workspace_size
        self.heuristic = _tactic_minus_one(runner)  # None: tactic -1 goes through the runner
        self.plans: dict = {}  # (*signature, tuner token) -> verified tactic
        self.verified: set = set()  # (signature, tactic) that matched the public call

    def _token(self):
        """A value that changes whenever choose_one could answer differently; None: ask every call.

        The winner sources are compared by size: a cleared tuner cache refilled to the very same
        sizes goes unnoticed (call :func:`reset` after such a swap).
        """
        t = self.tuner
        # the thread-local stacks through __dict__: getattr of a missing attribute costs ~0.6 µs
        if (t.is_tuning_mode or t._managed_cache is not None or t._v2_local.active
                or t._override_local.__dict__.get("stack") or t._skip_ops_local.__dict__.get("stack")):
            return None
        return len(t.profiling_cache), len(t._file_configs), len(t._winner_partitions), _load_from_file_env()

    def _run(self, tactic, A, B, A_scale, B_scale, out, ws) -> None:
        if tactic == -1 and self.heuristic is not None:
            self.heuristic(A, B, out, A_scale, B_scale, ws)
        else:
            self.runner(inputs=[A, B, A_scale, B_scale, out, ws], tactic=tactic)

    def __call__(self, out, A, B, A_scale, B_scale) -> None:
        # the workspace from flashinfer's helper on every call, as flashinfer.bmm_fp8 takes it
        ws = self.workspace("bmm_fp8_workspace", self.workspace_size, A.device)
        key = (A.shape, B.shape, A.dtype, B.dtype, out.dtype, A.get_device(), self._token())
        tactic = self.plans.get(key)
        if tactic is None:
            self._plan_and_run(key, out, A, B, A_scale, B_scale, ws)
        elif tactic == -1 and self.heuristic is not None:  # _run, inlined: this is the per-call path
            self.heuristic(A, B, out, A_scale, B_scale, ws)
        else:
            self.runner(inputs=[A, B, A_scale, B_scale, out, ws], tactic=tactic)

    def _plan_and_run(self, key, out, A, B, A_scale, B_scale, ws) -> None:
        sig, token = key[:-1], key[-1]
        try:
            _, tactic = self.tuner.choose_one("fp8_gemm", [self.runner], self.config, [A, B, A_scale, B_scale, out, ws])
        except Exception as exc:
            return self._give_up(f"AutoTuner.choose_one raised {type(exc).__name__}: {exc}", out, A, B, A_scale, B_scale)
        if (sig, tactic) not in self.verified:
            if _capturing():  # no sync possible: the public call is captured; verify on the first eager call
                return self.public_call(out, A, B, A_scale, B_scale)
            try:
                self._run(tactic, A, B, A_scale, B_scale, out, ws)
            except Exception as exc:
                return self._give_up(f"it raised {type(exc).__name__}: {exc}", out, A, B, A_scale, B_scale)
            expected = torch.empty_like(out)
            self.public_call(expected, A, B, A_scale, B_scale)
            if not _same_bits(out, expected):
                out.copy_(expected)
                return _disable(f"its result differs from flashinfer.bmm_fp8(backend='cublas') for {_describe(sig)}, "
                               f"tactic {tactic}")
            self.verified.add((sig, tactic))
            if _state["bmm_fp8_fast_path"] == "untested":
                _state.update(bmm_fp8_fast_path="on", reason=None)
        else:
            self._run(tactic, A, B, A_scale, B_scale, out, ws)
        if token is not None:
            if len(self.plans) >= _MAX_PLANS:
                self.plans.clear()
            self.plans[key] = tactic

    def _give_up(self, reason, out, A, B, A_scale, B_scale) -> None:
        _disable(reason)
        self.public_call(out, A, B, A_scale, B_scale)


_lock = threading.Lock()
_state: dict = {"bmm_fp8_fast_path": "untested", "reason": _NOT_CHECKED, "workspace": None}
_direct: _Direct | None = None
_public_call = None


def bmm_fp8(out: torch.Tensor, A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor) -> None:
    """The flashinfer backend of bmm_fp8: the fast path once verified, else the public call."""
    # flashinfer's cublas path reads dense operands and checks no strides: make them dense
    # (a no-op for the usual contiguous A and W.transpose(-2, -1) B).
    if not A.is_contiguous():
        A = A.contiguous()
    b, k, n = B.shape
    sb = B.stride()
    if not (sb[1] == 1 and (n == 1 or sb[2] == k) and (b == 1 or sb[0] == k * n)):
        B = B.transpose(-2, -1).contiguous().transpose(-2, -1)
    _serve(out, A, B, A_scale, B_scale)


def _first_call(out, A, B, A_scale, B_scale) -> None:
    decide()
    _serve(out, A, B, A_scale, B_scale)


_serve = _first_call  # what bmm_fp8 calls: _first_call, then a _Direct or the public call


def decide() -> None:
    """Import flashinfer and build the fast path, or settle on the public call (and say why)."""
    global _serve, _direct, _public_call
    with _lock:
        if _serve is not _first_call:
            return
        fi = importlib.import_module("flashinfer")
        _public_call = make_public_call(fi.bmm_fp8)
        if os.environ.get(ENV, "1") == "0":
            _state.update(bmm_fp8_fast_path="off", reason=f"{ENV}=0")
            _serve = _public_call
            return
        try:
            found = find_internals(fi)
            _direct = _Direct(found, _public_call)
        except Exception as exc:
            what = str(exc) if isinstance(exc, MissingInternal) else f"building it raised {type(exc).__name__}: {exc}"
            _off(what)
            return
        _state.update(bmm_fp8_fast_path="untested", reason="flashinfer's internals found; no call verified yet",
                      workspace=found.where)
        _serve = _direct


def _disable(reason: str) -> None:
    """Turn the fast path off for this process (one RuntimeWarning); the public call serves."""
    with _lock:
        if _state["bmm_fp8_fast_path"] != "off":
            _off(reason)


def _off(reason: str) -> None:
    global _serve, _direct
    _state.update(bmm_fp8_fast_path="off", reason=reason)
    _serve, _direct = _public_call, None
    warnings.warn(f"slim_kernel: bmm_fp8 fast path off: {reason}; flashinfer.bmm_fp8(backend='cublas') serves "
                  f"every call", RuntimeWarning, stacklevel=2)


def reset() -> None:
    """Forget the decision (tests): the next call imports, detects and verifies again."""
    global _serve, _direct, _public_call
    with _lock:
        _serve, _direct, _public_call = _first_call, None, None
        _state.update(bmm_fp8_fast_path="untested", reason=_NOT_CHECKED, workspace=None)


def _installed_version() -> str | None:
    try:
        return metadata.version("flashinfer-python")
    except metadata.PackageNotFoundError:
        return "unknown" if importlib.util.find_spec("flashinfer") is not None else None


def fast_path_state(probe: bool = False) -> dict:
    """For `slim-kernel info`: {"flashinfer": version or None, "bmm_fp8_fast_path": "on" | "off" |
    "untested", "reason": why not on (None when on), "workspace": the flashinfer helper it uses}.

    Imports nothing heavy: flashinfer is imported only with ``probe=True``, and then only its
    code is read (no JIT build, no autotuner); "untested" until a first call verified one.
    """
    state = {"flashinfer": _installed_version(), **_state}
    if state["flashinfer"] is None:
        return {**state, "bmm_fp8_fast_path": "off", "reason": "flashinfer-python is not installed"}
    if _serve is not _first_call:
        return state
    if os.environ.get(ENV, "1") == "0":
        return {**state, "bmm_fp8_fast_path": "off", "reason": f"{ENV}=0"}
    if not probe:
        return state
    try:
        found = find_internals(importlib.import_module("flashinfer"))
    except MissingInternal as exc:
        return {**state, "bmm_fp8_fast_path": "off", "reason": str(exc)}
    except Exception as exc:
        return {**state, "bmm_fp8_fast_path": "off", "reason": f"import flashinfer raised {type(exc).__name__}: {exc}"}
    return {**state, "workspace": found.where,
            "reason": "flashinfer's internals found; each call signature is verified on its first eager call"}
