"""What a compiled kernel uses: registers, spills, stack and static shared memory.

Both compilers run ptxas with ``-v``; its report (``Used 40 registers``, ``8 bytes spill
stores``, ``1024 bytes smem``) is parsed here and stored in the cache entry next to the cubin,
so the numbers are available for any cached instance without re-running a tool. Which SM a
cubin was built for is decoded by `slim_kernel.cubin.cubin_sm` (re-exported here), the rule the
audit uses too.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ..cubin import cubin_sm as cubin_sm  # re-exported for the cache


@dataclass(frozen=True)
class ResourceUsage:
    registers: int = 0
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_bytes: int = 0
    smem_static: int = 0
    cmem0: int = 0

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ResourceUsage:
        return cls(**{k: int(v) for k, v in data.items() if k in cls.__dataclass_fields__})


_FUNC_RE = re.compile(r"Compiling entry function '([^']+)'")
_PATTERNS = {
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_store_bytes": re.compile(r"(\d+) bytes spill stores"),
    "spill_load_bytes": re.compile(r"(\d+) bytes spill loads"),
    "registers": re.compile(r"Used (\d+) registers"),
    "smem_static": re.compile(r"(\d+) bytes smem"),
    "cmem0": re.compile(r"(\d+) bytes cmem\[0\]"),
}


def parse_ptxas_log(log: str, entry: str) -> ResourceUsage:
    """The usage of function ``entry`` from a ``ptxas -v`` report (nvcc stderr or NVRTC log)."""
    values: dict[str, int] = {}
    current = None
    found = False
    for line in log.splitlines():
        m = _FUNC_RE.search(line)
        if m:
            current = m.group(1)
            found = found or current == entry
            continue
        if current != entry:
            continue
        for name, pattern in _PATTERNS.items():
            m = pattern.search(line)
            if m:
                values[name] = int(m.group(1))
    if not found or "registers" not in values:
        raise ValueError(f"no ptxas resource report for entry {entry!r} in the compiler log")
    return ResourceUsage(**values)


def check_limits(usage: ResourceUsage, limits: dict[str, int]) -> list[str]:
    """Violations of declared ``slim:limits`` (empty when within them)."""
    actual = {"max_registers": usage.registers, "max_spill_bytes": usage.spill_bytes,
              "max_smem_static": usage.smem_static}
    return [f"{name.removeprefix('max_')} {actual[name]} > declared {limit}"
            for name, limit in sorted(limits.items()) if actual[name] > limit]
