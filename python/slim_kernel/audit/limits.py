"""Resource limits for reading untrusted wheels, and the errors raised when input is refused."""

from __future__ import annotations

from dataclasses import dataclass


class AuditInputError(Exception):
    """The input cannot be audited (unreadable, malformed or hostile): exit code 2."""


class HostileArchiveError(AuditInputError):
    """The archive looks crafted to harm the reader (bomb, traversal, symlink, overlap)."""


class MalformedBinaryError(AuditInputError):
    """An ELF, fatbin or archive member structure is truncated or self-inconsistent."""


MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class Limits:
    """Bounds that keep time and memory finite on hostile input.

    The defaults admit the largest real AOT kernel wheels (sgl-kernel 0.3.21: 1.7 GB unpacked,
    one 852 MB member, 28 MB LZ4 cubins) with a wide margin.
    """

    max_total_unpacked: int = 16 * GiB  # sum of declared member sizes
    max_member_unpacked: int = 4 * GiB
    max_ratio: float = 200.0  # unpacked / compressed, for members above ratio_floor
    ratio_floor: int = 4 * MiB  # small members may compress arbitrarily well
    max_members: int = 100_000
    max_entry_unpacked: int = 1 * GiB  # one fatbin entry after decompression
    max_entry_ratio: float = 1000.0  # fatbin payload decompression ratio
    retained_in_memory: int = 256 * MiB  # non-fatbin bytes of one ELF kept in RAM, then spilled
    max_sections: int = 65_536
    max_symbols: int = 20_000_000
    max_hits_per_member: int = 2_000  # evidence strings kept per member and layer
    max_fatbin_entries: int = 1_000_000  # per member (sgl-kernel 0.3.21 has 1,514 in all)
    max_text_lines: int = 10_000  # routed/info lines examined per text member
