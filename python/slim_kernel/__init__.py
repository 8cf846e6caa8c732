"""slim-kernel: the retired sgl-kernel AOT ops, served by flashinfer, JIT kernels or torch.

Importing this package imports neither flashinfer nor any CUDA compiler; torch and the op
registrations load on first access of an op, so the audit/size CLI runs without torch.
"""

from __future__ import annotations

import importlib

from ._version import __version__

_LAZY = {
    "bmm_fp8": "slim_kernel.ops",
    "dsv3_router_gemm": "slim_kernel.ops",
    "dsv3_fused_a_gemm": "slim_kernel.ops",
    "BackendUnavailableError": "slim_kernel.registry",
    "KernelBackend": "slim_kernel.registry",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'slim_kernel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(__all__)
