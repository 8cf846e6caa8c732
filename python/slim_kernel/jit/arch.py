"""GPU architecture names: ``"9.0a"``/``"90a"``/``"sm_90a"`` -> ``"sm_90a"``, and the arch of a device.

JIT kernels are compiled for the exact, arch-specific target of the device (``sm_90a`` on SM 9.0,
``sm_100a`` on SM 10.0, ...) so they may use wgmma, TMA multicast, setmaxnreg and friends; SM 8.x
and older have no ``a`` variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Limits:
    """What an SM of an architecture offers the JIT kernels (the CUDA programming guide's table of compute
    capabilities): the base for never launching a configuration that cannot fit."""
    smem_per_sm: int  # bytes of shared memory an SM has (its largest carveout)
    smem_per_block: int  # the most one CTA may opt into
    regs_per_sm: int = 65536
    threads_per_sm: int = 2048
    smem_reserved_per_cta: int = 1024  # what the driver keeps of an SM's shared memory for each resident CTA
    sms: int | None = None  # the SM count of the architecture's reference part (routing without a GPU)
    regs_per_block: int = 65536
    threads_per_block: int = 1024
    max_cluster: int = 8  # CTAs per cluster: 8 is portable; 16 needs the non-portable attribute, where granted


# per SM version (sm_version); an architecture not listed gets the most restrictive limits listed
LIMITS = {
    90: Limits(228 * 1024, 227 * 1024, sms=132, max_cluster=16),  # H100 SXM / H200
    100: Limits(228 * 1024, 227 * 1024, sms=148, max_cluster=16),  # B200
    120: Limits(100 * 1024, 99 * 1024, threads_per_sm=1536),  # RTX PRO 6000 / RTX 50xx: portable clusters only
}


def limits(arch: str) -> Limits:
    """The limits of ``arch`` (``"sm_90a"``, ``"9.0"``, ...), or the most restrictive known for an unlisted one."""
    version = sm_version(arch)
    if version in LIMITS:
        return LIMITS[version]
    return min(LIMITS.values(), key=lambda lim: (lim.smem_per_block, lim.threads_per_sm, lim.max_cluster))


def device_limits(index: int) -> Limits:
    """The limits of CUDA device ``index``, read from the device where torch says them, else :func:`limits`."""
    import torch

    props = torch.cuda.get_device_properties(index)
    base = limits(f"sm_{props.major}{props.minor}")
    return Limits(smem_per_sm=getattr(props, "shared_memory_per_multiprocessor", 0) or base.smem_per_sm,
                  smem_per_block=getattr(props, "shared_memory_per_block_optin", 0) or base.smem_per_block,
                  regs_per_sm=getattr(props, "regs_per_multiprocessor", 0) or base.regs_per_sm,
                  threads_per_sm=getattr(props, "max_threads_per_multi_processor", 0) or base.threads_per_sm,
                  smem_reserved_per_cta=base.smem_reserved_per_cta, sms=props.multi_processor_count,
                  regs_per_block=base.regs_per_block, threads_per_block=base.threads_per_block,
                  max_cluster=base.max_cluster)
