"""A fake flashinfer package, shaped like a real release's bmm_fp8 path, for CPU tests.

It is written to a directory (with flashinfer_python-<version>.dist-info, so importlib.metadata
sees it) and imported from there. CPU tensors stand in for device tensors; the "JIT module"
computes in float32 and records what ran in ``gemm_base.CALLS``:
``("heuristic", workspace data_ptr)`` (tactic -1), ``("algo", tactic)``, ``"public"`` (the
public bmm_fp8 body) and ``"checks"`` (its argument checks, skipped by ``skip_check=True``).

Shapes: "0.7.2" (gemm_base imports ``_get_cache_buf``, a new runner per call) and "0.7.4"
(``_get_stream_cache_buf`` keyed by ``utils.CURRENT_STREAM[0]``, the runner memoized).
"""

from __future__ import annotations

from pathlib import Path

UTILS = '''
import functools
import torch

CURRENT_STREAM = [0]  # stands in for torch._C._cuda_getCurrentRawStream
_cache_buf = {}
_stream_cache_buf = {}


def _get_cache_buf(name, num_bytes, device, zero_init=False):
    key = (name, device)
    if key not in _cache_buf or _cache_buf[key].size(0) < num_bytes:
        _cache_buf[key] = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    return _cache_buf[key]


def _get_stream_cache_buf(name, num_bytes, device, zero_init=False):
    key = (name, device, CURRENT_STREAM[0])
    if key not in _stream_cache_buf or _stream_cache_buf[key].size(0) < num_bytes:
        _stream_cache_buf[key] = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    return _stream_cache_buf[key]


def backend_requirement(checks):
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            skip_check = kwargs.pop("skip_check", False)
            if not skip_check:
                from .gemm.gemm_base import CALLS
                CALLS.append("checks")
            return func(*args, **kwargs)
        return wrapper
    return decorator
'''

AUTOTUNER = '''
import threading


class TuningConfig:
    pass


class TunableRunner:
    def __call__(self, inputs, **kwargs):
        return self.forward(inputs, **kwargs)


class _V2Local(threading.local):
    active = False


class AutoTuner:
    _instance = None

    def __init__(self):
        self.is_tuning_mode = False
        self.profiling_cache = {}  # ("fp8_gemm", A.shape) -> tactic
        self._file_configs = {}
        self._winner_partitions = {}
        self._managed_cache = None
        self._v2_local = _V2Local()
        self._override_local = threading.local()
        self._skip_ops_local = threading.local()
        self.asked = 0
DROP_ATTRS

    @classmethod
    def get(cls):
        if cls._instance is None:
            cls._instance = AutoTuner()
        return cls._instance

    def choose_one(self, custom_op, runners, tuning_config, inputs):
        assert custom_op == "fp8_gemm" and isinstance(tuning_config, TuningConfig)
        self.asked += 1
        return runners[0], self.profiling_cache.get((custom_op, tuple(inputs[0].shape)), -1)
'''

GEMM_BASE = '''
import functools
from types import SimpleNamespace

import torch

from ..autotuner import AutoTuner, TunableRunner, TuningConfig
from ..utils import HELPER, backend_requirement

DEFAULT_WORKSPACE_SIZE = 4096
CALLS = []


def _product(a, b, sa, sb, out):
    # what cuBLASLt reads: dense A and a column-major B
    assert a.is_contiguous() and b.transpose(-2, -1).is_contiguous(), "strided operands reached the GEMM"
    out.copy_(((a.float() @ b.float()) * (sa * sb)).to(out.dtype))


class _GemmModule:  # stands in for flashinfer's JIT-built gemm module
    def bmm_fp8(self, a, b, out, sa, sb, ws):
        CALLS.append(("heuristic", ws.data_ptr()))
        _product(a, b, sa, sb, out)

    def bmm_fp8_run_with_algo(self, a, b, out, sa, sb, ws, algos, tactic):
        CALLS.append(("algo", tactic))
        _product(a, b, sa, sb, out)


@functools.cache
def get_gemm_module():
    module = _GemmModule()

    def cublas_fp8_gemm_runner():
        class CublasFp8GemmRunner(TunableRunner):
            def forward(self, inputs, tactic=-1, do_preparation=False, **kwargs):
                a, b, sa, sb, out, ws = inputs
                if tactic >= 0:
                    module.bmm_fp8_run_with_algo(a, b, out, sa, sb, ws, None, tactic)
                    return out
                module.bmm_fp8(a, b, out, sa, sb, ws)
                return out

        return CublasFp8GemmRunner()

    return SimpleNamespace(cublas_fp8_gemm_runner=RUNNER_FACTORY)


CONFIG_NAME = TuningConfig()
_CONFIGS = {"fp8": CONFIG_NAME}


def fp8_gemm_sm100(a, b, scale_a, scale_b, out, workspace_buffer, runner_names):
    tuner = AutoTuner.get()
    runners = [get_gemm_module().cublas_fp8_gemm_runner()]
    inputs = [a, b, scale_a, scale_b, out, workspace_buffer]
    runner, tactic = tuner.choose_one("fp8_gemm", runners, CONFIG_EXPR, inputs)
    runner(inputs=inputs, tactic=tactic)


DECORATOR
def bmm_fp8(A, B, A_scale, B_scale, dtype, out=None, backend="cublas"):
    CALLS.append("public")
    if out is None:
        out = torch.empty((A.shape[0], A.shape[1], B.shape[2]), device=A.device, dtype=dtype)
    workspace_buffer = HELPER("bmm_fp8_workspace", DEFAULT_WORKSPACE_SIZE, A.device)
    fp8_gemm_sm100(A, B, A_scale, B_scale, out, workspace_buffer, [backend])
    return out
'''

GEMM_INIT = '''
from .gemm_base import bmm_fp8


def _not_faked(*args, **kwargs):
    raise NotImplementedError("not part of the fake")


mm_M1_16_K7168_N256 = mm_M1_16_K7168_N256_bf16 = mm_M1_16_K6144_N256 = mm_M1_16_K7168_N128 = _not_faked
mm_M1_16_K7168_N384 = mm_M1_16_K7168_N384_bf16 = mm_M1_16_K7168_N896 = mm_M1_16_K7168_N896_bf16 = _not_faked
tinygemm_bf16 = _not_faked
'''


def write(root: Path, shape: str = "0.7.4", *, helper: str | None = None, config_name="_FP8_GEMM_SM100_TUNING_CONFIG",
          config_from_dict=False, drop_tuner_attr: str | None = None, decorated=True) -> Path:
    """Write the fake package under ``root``; the options break one internal each. Returns root."""
    if shape not in ("0.7.2", "0.7.4"):
        raise ValueError(f"shape must be '0.7.2' or '0.7.4', got {shape!r}")
    helper = helper or ("_get_stream_cache_buf" if shape == "0.7.4" else "_get_cache_buf")
    utils = UTILS if helper in ("_get_cache_buf", "_get_stream_cache_buf") else UTILS + f"\n{helper} = _get_cache_buf\n"
    if shape == "0.7.2":  # 0.7.2's utils has no per-stream helper
        utils = utils.replace("def _get_stream_cache_buf(", "def _removed_stream_cache_buf(")
    factory = "functools.lru_cache(maxsize=64)(cublas_fp8_gemm_runner)" if shape == "0.7.4" else "cublas_fp8_gemm_runner"
    drop = f"        del self.{drop_tuner_attr}" if drop_tuner_attr else ""
    gemm_base = (GEMM_BASE.replace("HELPER", helper).replace("RUNNER_FACTORY", factory)
                 .replace("CONFIG_EXPR", '_CONFIGS["fp8"]' if config_from_dict else "CONFIG_NAME")
                 .replace("CONFIG_NAME", config_name)
                 .replace("DECORATOR", "@backend_requirement({})" if decorated else ""))
    pkg = root / "flashinfer"
    (pkg / "gemm").mkdir(parents=True)
    (pkg / "__init__.py").write_text(f'__version__ = "{shape}"\nfrom .gemm import bmm_fp8\n')
    (pkg / "utils.py").write_text(utils)
    (pkg / "autotuner.py").write_text(AUTOTUNER.replace("DROP_ATTRS", drop))
    (pkg / "gemm" / "__init__.py").write_text(GEMM_INIT)
    (pkg / "gemm" / "gemm_base.py").write_text(gemm_base)
    dist = root / f"flashinfer_python-{shape}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flashinfer-python\nVersion: {shape}\n")
    return root
