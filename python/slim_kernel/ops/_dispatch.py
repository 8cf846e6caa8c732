"""One dispatch path for every op: select the backend for this call, run it."""

from __future__ import annotations

import importlib.util

import torch

from .. import registry


def run(op: str, backend: str | None, output: torch.Tensor, *inputs: torch.Tensor) -> None:
    args = (output, *inputs)
    _, fn = registry.select(op, inputs[0].device, args, backend)
    fn(*args)


def module_probe(name: str, what: str):
    """A spec probe saying whether an optional dependency is installed, without importing it."""

    def probe() -> str | None:
        return None if importlib.util.find_spec(name) is not None else f"{what} is not installed"

    return probe


flashinfer_probe = module_probe("flashinfer", "flashinfer-python")
