"""One definition and dispatch path for every op.

Ops are defined with a plain ``torch.library.Library`` schema plus CPU/CUDA kernels and a
fake kernel: dispatch through it costs ~1 µs, where ``torch.library.custom_op``'s Python
autograd layers cost ~13 µs per call, and torch.compile, CUDA graphs and opcheck work alike.

:class:`Op` is the public-call path. Validation and backend selection are cached per call
signature (shapes, strides, dtypes, devices, 16-byte alignment, pinned backend, env
override). A plain eager call (no compile, tracing, dispatch/function mode, functorch
transform, tensor subclass or autograd) then runs the selected backend directly; every
other call goes through the registered op, so torch sees exactly what it would otherwise.
"""

from __future__ import annotations

import importlib.util
import os

import torch
from torch._C import _functorch

from .. import registry

_MAX_PLANS = 4096
# os.environ.get costs ~0.6 µs (str->bytes encoding); the POSIX bytes mapping behind it is
# kept in sync by os.environ and read in ~0.04 µs. Fall back to os.environ elsewhere.
_ENV_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None

LIB = torch.library.Library("slim_kernel", "DEF")


def run(op: str, backend: str | None, output: torch.Tensor, *inputs: torch.Tensor) -> None:
    args = (output, *inputs)
    _, fn = registry.select(op, inputs[0].device, args, backend)
    fn(*args)


def define(op: str, params: str):
    """Define ``slim_kernel::<op>(Tensor(a!) output, <params>, str? backend=None) -> ()``.

    The CPU and CUDA kernels select a backend for each call and run it; the fake kernel
    does nothing (the output is preallocated by the public function). Returns the overload.
    """
    LIB.define(f"{op}(Tensor(a!) output, {params}, str? backend=None) -> ()")

    n_inputs = params.count("Tensor")

    def kernel(output, *rest):
        # The dispatcher drops trailing arguments that equal their default (backend=None).
        backend = rest[n_inputs] if len(rest) > n_inputs else None
        run(op, backend, output, *rest[:n_inputs])

    for key in ("CPU", "CUDA"):
        LIB.impl(op, kernel, key)
    torch.library.register_fake(f"slim_kernel::{op}", lambda *args: None, lib=LIB)
    return getattr(torch.ops.slim_kernel, op).default


def _env_reader(name: str):
    if _ENV_BYTES is not None:
        key = name.encode()
        return lambda: _ENV_BYTES.get(key)
    return lambda: os.environ.get(name)


def _modes_active() -> bool:
    """Anything that must see the op through the dispatcher (modes, functorch, jit tracing)."""
    return bool(torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
                or _functorch.peek_interpreter_stack() is not None or torch._C._get_tracing_state())


class Op:
    """A public op: ``slim_kernel::<name>`` plus the cached eager fast path."""

    def __init__(self, name: str, params: str):
        self.name = name
        self.overload = define(name, params)
        self._env = registry.env_var(name)
        self._env_get = _env_reader(self._env)
        self._plans: dict = {}

    def _key(self, backend, output, inputs, extra) -> tuple | None:
        """The call signature of a plain eager call, else None (modes, subclasses, autograd)."""
        if _modes_active():
            return None
        key = [backend, self._env_get(), extra, output is None]
        grad = torch.is_grad_enabled()
        for t in inputs if output is None else (output, *inputs):
            if type(t) is not torch.Tensor or (grad and t.requires_grad):
                return None
            key += (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)
        return tuple(key)

    def __call__(self, validate, backend, output, inputs: tuple, extra=()) -> torch.Tensor:
        """Run the op. ``validate()`` raises on bad input, else returns (out shape, out dtype)."""
        if torch.compiler.is_compiling():  # traced: plain checks + the registered op, no caches
            shape, dtype = validate()
            if output is None:
                output = torch.empty(shape, dtype=dtype, device=inputs[0].device)
            self.overload(output, *inputs, backend)
            return output
        try:
            key = self._key(backend, output, inputs, extra)
            plan = self._plans.get(key) if key is not None else None
        except TypeError:  # an unhashable argument: validate() names it
            key = plan = None
        if plan is None:
            shape, dtype = validate()
            plan = [shape, dtype, inputs[0].device, None]
            if key is not None:
                if len(self._plans) >= _MAX_PLANS:
                    self._plans.clear()
                self._plans[key] = plan
        shape, dtype, device, fn = plan
        if output is None:
            output = torch.empty(shape, dtype=dtype, device=device)
        if key is not None:
            if fn is None:
                _, fn = registry.select(self.name, device, (output, *inputs), backend)
                plan[3] = fn
            fn(output, *inputs)
        else:
            self.overload(output, *inputs, backend)
        return output


def module_probe(name: str, what: str):
    """A spec probe saying whether an optional dependency is installed, without importing it."""

    def probe() -> str | None:
        return None if importlib.util.find_spec(name) is not None else f"{what} is not installed"

    return probe


flashinfer_probe = module_probe("flashinfer", "flashinfer-python")
