"""GPU architecture names: ``"9.0a"``/``"90a"``/``"sm_90a"`` -> ``"sm_90a"``, and the arch of a device.

JIT kernels are compiled for the exact, arch-specific target of the device (``sm_90a`` on SM 9.0,
``sm_100a`` on SM 10.0, ...) so they may use wgmma, TMA multicast, setmaxnreg and friends; SM 8.x
and older have no ``a`` variant.
"""

from __future__ import annotations

import re

_ARCH_RE = re.compile(r"^(?:sm_|compute_)?(\d+)\.?(\d)?([af]?)$")


def normalize_arch(arch: str) -> str:
    """Return the canonical ``sm_XY[a|f]`` form of ``arch`` (``"9.0a"``, ``"90a"``, ``"sm_90a"``)."""
    text = str(arch).strip().lower()
    m = _ARCH_RE.match(text)
    if not m:
        raise ValueError(f"arch must look like '9.0a', '90a' or 'sm_90a', got {arch!r}")
    major, minor, suffix = m.groups()
    if minor is None:  # "90a" / "sm_100a": the last digit is the minor version
        if len(major) < 2:
            raise ValueError(f"arch must look like '9.0a', '90a' or 'sm_90a', got {arch!r}")
        major, minor = major[:-1], major[-1]
    return f"sm_{int(major)}{minor}{suffix}"


def sm_version(arch: str) -> int:
    """``"sm_90a"`` -> 90 (the number stored in a cubin's ELF header)."""
    return int(re.sub(r"[^0-9]", "", normalize_arch(arch)))


def arch_for_capability(major: int, minor: int) -> str:
    """The exact target for a device of compute capability ``major.minor``."""
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def arch_for_device(index: int) -> str:
    """The exact target of CUDA device ``index`` (``sm_90a`` on an H100/H200)."""
    import torch

    if not isinstance(index, int) or index < 0:
        raise ValueError(f"device_index must be a non-negative int, got {index!r}")
    major, minor = torch.cuda.get_device_capability(index)
    return arch_for_capability(major, minor)
