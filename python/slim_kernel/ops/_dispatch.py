"""One definition and dispatch path for every op.

Ops are defined with a plain ``torch.library.Library`` schema plus CPU/CUDA kernels and a
fake kernel: dispatch through it costs ~1 µs, where ``torch.library.custom_op``'s Python
autograd layers cost ~13 µs per call, and torch.compile, CUDA graphs and opcheck work alike.

:class:`Op` is the public-call path. Validation and backend selection run once per call
signature (shapes, strides, dtypes, devices, 16-byte alignment, pinned backend, env pin): the
result is a :class:`Plan` holding the bound implementation, rebuilt after any knob change
(``knobs.bump``). A plain eager call (no compile, tracing, dispatch/function mode, functorch
transform, tensor subclass or autograd) runs the plan directly; every other call goes through
the registered op, whose CPU/CUDA kernel uses the same plans. An empty output (an empty batch,
M = 0) selects no backend and launches nothing on either path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch._C import _functorch

from .. import knobs, registry
from ..pdl import launch_pdl
from ._validate import backend_arg

_MAX_PLANS = 4096
# os.environ.get costs ~0.6 µs (str->bytes encoding); the POSIX bytes mapping behind it is
# kept in sync by os.environ and read in ~0.04 µs. Fall back to os.environ elsewhere.
_ENV_BYTES = getattr(os.environ, "_data", None) if os.name == "posix" else None

LIB = torch.library.Library("slim_kernel", "DEF")


@dataclass(frozen=True, slots=True)
class Plan:
    shape: tuple  # output shape
    dtype: torch.dtype  # output dtype
    device: torch.device
    fn: object  # fn(output, *inputs)
    why: str  # why this backend was selected


def _env_reader(name: str):
    if _ENV_BYTES is not None:
        key = name.encode()
        return lambda: _ENV_BYTES.get(key)
    return lambda: os.environ.get(name)


def _modes_active() -> bool:
    """Anything that must see the op through the dispatcher (modes, functorch, jit tracing)."""
    return bool(torch._C._len_torch_dispatch_stack() or torch._C._is_torch_function_mode_enabled()
                or _functorch.peek_interpreter_stack() is not None or torch._C._get_tracing_state())


def _signature(tensors) -> tuple:
    return tuple(x for t in tensors for x in (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15))


class Op:
    """A public op: ``slim_kernel::<name>(Tensor(a!) output, <params>, str? backend=None) -> ()``
    plus the cached plans both call paths use."""

    def __init__(self, name: str, params: str, pdl_sensitive: bool = False):
        self.name = name
        # The backends launch with or without PDL by context (slim_kernel.pdl): part of the plan key.
        self.pdl_sensitive = pdl_sensitive
        self.n_inputs = params.count("Tensor")
        LIB.define(f"{name}(Tensor(a!) output, {params}, str? backend=None) -> ()")
        for key in ("CPU", "CUDA"):
            LIB.impl(name, self._dispatched, key)
        torch.library.register_fake(f"slim_kernel::{name}", lambda *args: None, lib=LIB)
        self.overload = getattr(torch.ops.slim_kernel, name).default
        self._env_get = _env_reader(registry.env_var(name))
        self._plans: dict = {}
        self._generation = knobs.STATE.generation

    def _cache(self) -> dict:
        if self._generation != knobs.STATE.generation:  # a knob changed: every plan is stale
            self._plans.clear()
            self._generation = knobs.STATE.generation
        elif len(self._plans) >= _MAX_PLANS:
            self._plans.clear()
        return self._plans

    def _select(self, backend, output, inputs, pdl) -> registry.Selection:
        return registry.select(self.name, inputs[0].device, (output, *inputs), backend, pdl)

    def _pdl(self, inputs) -> bool | None:
        """The launch context of a PDL-sensitive op on CUDA (None: not one, or not on CUDA)."""
        x = inputs[0] if inputs else None
        if not self.pdl_sensitive or not isinstance(x, torch.Tensor) or not x.is_cuda:
            return None  # a bad argument is validate()'s to name
        return launch_pdl(device=x.device)

    def _captured_context(self, backend, output, inputs, pdl) -> registry.Selection | None:
        """Under PDL auto an eager call (context True) also selects, and runs once, what a capture
        after a plain kernel (context False) will run: a capture then never selects, compiles or
        loads a backend (the first call of a signature runs the GEMM twice, eager only). The
        caller writes the result with its own plan afterwards."""
        if pdl is not True or not knobs.pdl_auto():
            return None
        sel = self._select(backend, output, inputs, False)
        sel.fn(output, *inputs)
        return sel

    def _dispatched(self, output, *rest) -> None:
        """The registered op's CPU/CUDA kernel (compile, modes, autograd): plans keyed by the call."""
        # The dispatcher drops trailing arguments that equal their default (backend=None).
        inputs = rest[:self.n_inputs]
        backend = rest[self.n_inputs] if len(rest) > self.n_inputs else None
        if output.numel() == 0:  # an empty batch (M = 0): nothing to compute, nothing launched
            registry.pinned_backend(self.name, backend)  # a misspelt pin is an error here as in eager
            return
        pdl = self._pdl(inputs)
        key = ("dispatch", backend, self._env_get(), pdl, *_signature((output, *inputs)))
        plans = self._cache()
        fn = plans.get(key)
        if fn is None:
            fn = plans[key] = self._select(backend, output, inputs, pdl).fn
            other = self._captured_context(backend, output, inputs, pdl)
            if other is not None:
                plans[key[:3] + (False,) + key[4:]] = other.fn
        fn(output, *inputs)

    def __call__(self, validate, backend, output, inputs: tuple, extra=()) -> torch.Tensor:
        """Run the op. ``validate()`` raises on bad input, else returns (out shape, out dtype)."""
        if torch.compiler.is_compiling():  # traced: plain checks + the registered op, no caches
            backend_arg(backend)
            shape, dtype = validate()
            if output is None:
                output = torch.empty(shape, dtype=dtype, device=inputs[0].device)
            self.overload(output, *inputs, backend)
            return output
        pdl = self._pdl(inputs)
        given = output
        key = self._key(backend, output, inputs, (extra, pdl))
        plans = self._cache()
        plan = plans.get(key) if key is not None else None
        if plan is None:
            backend_arg(backend)
            shape, dtype = validate()
            device = inputs[0].device
            if output is None:
                output = torch.empty(shape, dtype=dtype, device=device)
            if device.type == "meta":  # shape propagation only: nothing to compute
                return output
            if key is None:  # modes, subclasses, autograd: torch must see the op
                self.overload(output, *inputs, backend)
                return output
            if output.numel() == 0:  # an empty batch (M = 0): a plan that launches nothing, in either context
                registry.pinned_backend(self.name, backend)  # a misspelt pin is still an error
                plans[key] = Plan(shape, dtype, device, _nothing, "empty output: nothing to launch")
                return output
            sel = self._select(backend, output, inputs, pdl)
            plan = plans[key] = Plan(shape, dtype, device, sel.fn, sel.why)
            other = self._captured_context(backend, output, inputs, pdl)
            if other is not None:
                plans[self._key(backend, given, inputs, (extra, False))] = Plan(shape, dtype, device, other.fn,
                                                                               other.why)
        elif output is None:
            output = torch.empty(plan.shape, dtype=plan.dtype, device=plan.device)
        plan.fn(output, *inputs)
        return output

    def _key(self, backend, output, inputs, extra) -> tuple | None:
        """The call signature of a plain eager call, else None (modes, subclasses, autograd)."""
        if _modes_active():
            return None
        grad = torch.is_grad_enabled()
        try:
            for t in inputs if output is None else (output, *inputs):
                if type(t) is not torch.Tensor or (grad and t.requires_grad) or t.layout is not torch.strided:
                    return None
            key = (backend, self._env_get(), extra, output is None,
                   *_signature(inputs if output is None else (output, *inputs)))
            hash(key)
        except (TypeError, RuntimeError):  # an unhashable or odd argument: validate() names it
            return None
        return key


def _nothing(output, *inputs) -> None:
    """The plan of an empty output (M = 0): selects no backend and launches nothing."""
