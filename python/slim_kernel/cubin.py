"""Which SM a cubin was built for, from its ELF header: the one rule the JIT cache and the audit
share. Torch-free and import-free.

CUDA ELF ABI version 7 (OS/ABI 0x33, CUDA < 12.8) keeps the SM in the low byte of e_flags and
marks arch-specific code ("sm_90a") with 0x800; version 8 (OS/ABI 0x41) keeps the SM in bits
8..15 and marks it with 0x8 (as seen in sgl-kernel 0.3.21's cubins). nvcc 13.0 does not set
the version-8 mark, so its sm_90a cubins read as sm_90 here.
"""

from __future__ import annotations

import struct

EM_CUDA = 190


def decode_sm(abi_version: int, e_flags: int) -> tuple[int, bool]:
    """(SM number, arch-specific) from the ELF header's EI_ABIVERSION and e_flags."""
    if abi_version >= 8:
        return (e_flags >> 8) & 0xFF, bool(e_flags & 0x8)
    return e_flags & 0xFF, bool(e_flags & 0x800)


def cubin_sm(cubin: bytes) -> int:
    """The SM number a 64-bit little-endian cubin was built for (90 for sm_90 and sm_90a)."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF cubin")
    (machine,) = struct.unpack_from("<H", cubin, 18)
    if machine != EM_CUDA:
        raise ValueError(f"ELF machine {machine} is not CUDA ({EM_CUDA})")
    (flags,) = struct.unpack_from("<I", cubin, 48)
    return decode_sm(cubin[8], flags)[0]
