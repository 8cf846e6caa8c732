"""The exceptions selection raises and backends raise to decline a call. Torch-free leaf."""

from __future__ import annotations


class BackendUnavailableError(RuntimeError):
    """A pinned backend cannot serve a call, or no backend can (the message says why)."""


class CallNotServed(BackendUnavailableError):
    """Raised by a ``prepare`` target that declines this call (e.g. a JIT kernel missing from the
    cache under ``SLIM_KERNEL_JIT=cache-or-fallback``): the next eligible backend serves it, with
    one warning; a pinned backend raises it."""
