"""Argument checks shared by the public ops. Every error names the argument."""

from __future__ import annotations

import torch

from ..backend import NAMES


def tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_nested:
        raise ValueError(f"{name} must be a dense (strided) tensor, got a nested tensor")
    if value.layout is not torch.strided:
        raise ValueError(f"{name} must be a dense (strided) tensor, got layout {value.layout}")
    return value


def backend_arg(value) -> None:
    """``backend=`` is None or a backend name (checked by name in the registry)."""
    if value is not None and not isinstance(value, str):
        raise TypeError(f"backend must be a str (one of {', '.join(map(repr, NAMES))}) or None, "
                        f"got {type(value).__name__}")


def dtype_arg(name: str, value, allowed: tuple[torch.dtype, ...]) -> torch.dtype:
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{name} must be a torch.dtype, got {type(value).__name__}")
    if value not in allowed:
        raise ValueError(f"{name} must be one of {_names(allowed)}, got {value}")
    return value


def dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise ValueError(f"{name} must have dtype {_names(allowed)}, got {t.dtype}")


def rank(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(t.shape)}")


def same_device(name: str, t: torch.Tensor, device: torch.device, ref_name: str) -> None:
    if t.device != device:
        raise ValueError(f"{name} must be on {ref_name}'s device {device}, got {t.device}")


def nonempty(name: str, size: int, what: str) -> None:
    if size <= 0:
        raise ValueError(f"{name} must have at least one {what}, got {size}")


def output(name: str, t, shape: tuple[int, ...], dt: torch.dtype, device: torch.device) -> torch.Tensor:
    tensor(name, t)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
    if t.dtype != dt:
        raise ValueError(f"{name} must have dtype {dt}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} must be on device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous (row-major), got strides {t.stride()}")
    return t


def row_major_rows(t: torch.Tensor) -> bool:
    """Last dim unit-stride (rows may be padded/sliced): what the GEMM kernels read."""
    return t.stride(-1) == 1 or t.shape[-1] == 1


def column_major(t: torch.Tensor) -> bool:
    """(…, k, n) stored as the transpose of a (…, n, k) tensor with unit-stride k."""
    return t.stride(-2) == 1 or t.shape[-2] == 1


def _names(dtypes) -> str:
    return "/".join(str(d).replace("torch.", "") for d in dtypes)
