"""What one JIT kernel instantiation is: the contract between kernel authors and the runtime.

A kernel source under ``slim_kernel/jit/kernels/`` defines one ``extern "C" __global__`` entry
whose compile-time parameters come from ``-D`` macros; one :class:`KernelInstance` names the
source, the entry, the macro values and the launch-argument signature. The runtime compiles
it (NVRTC or nvcc) to a cubin for one exact arch, caches it, loads it and launches it.
"""

from __future__ import annotations

from dataclasses import dataclass

# Launch-argument signature codes, one per kernel parameter:
#   p = device pointer (int address), i = int32, l = int64, f = float32
SIGNATURE_CODES = frozenset("pilf")


@dataclass(frozen=True)
class KernelInstance:
    source: str  # file name under slim_kernel/jit/kernels/, e.g. "dsv3_router_gemm.cuh"
    entry: str  # extern "C" kernel name in that source
    defines: tuple[tuple[str, int | str], ...]  # compile-time macros, sorted by name
    signature: str  # one SIGNATURE_CODES letter per kernel parameter

    def __post_init__(self):
        if not set(self.signature) <= SIGNATURE_CODES:
            raise ValueError(f"signature {self.signature!r} has codes outside {sorted(SIGNATURE_CODES)}")
        if list(self.defines) != sorted(self.defines):
            raise ValueError("defines must be sorted by name (they are part of the cache key)")

    @property
    def label(self) -> str:
        """``entry[NAME=value,...]``: how logs and errors name the instance."""
        return self.entry + "[" + ",".join(f"{k}={v}" for k, v in self.defines) + "]"

    @classmethod
    def make(cls, source: str, entry: str, signature: str, **defines: int | str) -> KernelInstance:
        return cls(source, entry, tuple(sorted(defines.items())), signature)
