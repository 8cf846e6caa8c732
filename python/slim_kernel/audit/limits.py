"""Resource limits for reading untrusted wheels, and the errors raised when input is refused.

Every limit is documented in audit/README.md ("Limits"); change both together.
"""

from __future__ import annotations

import math
import struct
import time
from dataclasses import dataclass


class AuditInputError(Exception):
    """The input cannot be audited (unreadable, malformed or hostile): exit code 2."""


class HostileArchiveError(AuditInputError):
    """The archive looks crafted to harm the reader (bomb, traversal, symlink, overlap)."""


class MalformedBinaryError(AuditInputError):
    """An ELF, fatbin or archive member structure is truncated or self-inconsistent."""


class TimeLimitError(AuditInputError):
    """The wheel took longer than `Limits.max_seconds` to scan."""


# what a parser raises on content it cannot read (a bound is never one: HostileArchiveError)
UNPARSABLE = (MalformedBinaryError, struct.error, IndexError, ValueError, OverflowError, UnicodeError)


def unparsable_reason(exc: Exception) -> str:
    if isinstance(exc, MalformedBinaryError):
        return str(exc)
    return f"malformed content ({type(exc).__name__}: {exc})"


class MissingDependencyError(Exception):
    """A package the audit needs is not installed: exit code 3."""


MiB = 1 << 20
GiB = 1 << 30
NESTED_MEMBER_WEIGHT = 10


@dataclass(frozen=True)
class Limits:
    """Bounds that keep time and memory finite on hostile input.

    The defaults admit the largest real AOT kernel wheels (sgl-kernel 0.3.21: 1.7 GB unpacked,
    one 852 MB member, 57 MB of host bytes retained for one library, a 37 MB cubin, 28 MB LZ4
    payloads, 1,869 fatbin headers, 4,354 sections in one cubin); bytes past a memory cap spill
    to disk rather than being refused. Documented in audit/README.md.
    """

    max_seconds: float = 300.0  # wall time per wheel
    max_total_unpacked: int = 16 * GiB  # sum of declared member sizes (per archive)
    max_member_unpacked: int = 4 * GiB
    # a gzip/bz2/xz stream around a nested tar has no declared size: it may not expand more
    # than this ratio once past the floor (zip members have declared sizes: no ratio limit)
    max_ratio: float = 200.0
    ratio_floor: int = 4 * MiB
    max_members: int = 100_000
    max_entry_unpacked: int = 1 * GiB  # one fatbin entry after decompression
    max_entry_ratio: float = 1000.0  # fatbin payload decompression ratio
    retained_in_memory: int = 40 * MiB  # bytes of one ELF (host library or cubin) kept in RAM, then spilled
    max_lz4_entry: int = 40 * MiB  # LZ4 payloads up to this decompress in one piece, larger ones stream
    # decoder memory of a zip member or a .zst file (fatbin zstd payloads keep zstd's own cap,
    # 128 MiB, so two windows at once stay under 160 MiB); xz -9 uses a 64 MiB dictionary
    max_zstd_window: int = 32 * MiB
    max_lzma_dict: int = 64 * MiB
    max_sections: int = 65_536
    max_section_names: int = 32 * MiB  # distinct section-name bytes of one ELF (real: 6.0 MB, cuSPARSELt 0.10)
    max_symbols: int = 4_000_000  # per symbol table
    max_hit_strings: int = 100_000  # strings of one string table holding a retired-op literal (real: 28)
    max_candidates: int = 50_000  # names per member examined for retired ops (real: 1,254)
    # distinct evidence kept per member and layer, plus the first of each further op (real: 206)
    max_hits_per_member: int = 1_000
    max_repeats: int = 50_000  # the same evidence again (other archs/cubins) per member (real: 1,030)
    # items per wheel that cost a little Python each, however small they are made: fatbin
    # containers and entries, ar members, members of nested archives (NESTED_MEMBER_WEIGHT each:
    # reading one costs about as much), strings in library data holding a retired-op literal, names
    # examined. sgl-kernel 0.3.21: 6,262.
    max_items: int = 250_000
    max_text_lines: int = 10_000  # routed/info lines examined per text member
    # ... and per wheel: their own cap, apart from max_items (the rest are counted, never refused)
    max_routed_lines: int = 200_000
    # steps per wheel that cost a few nanoseconds each: symbol-table rows read, bytes of names
    # and strings examined (per KiB). sgl-kernel 0.3.21: see audit/README.md.
    max_steps: int = 40_000_000
    max_spill: int = 1 * GiB  # bytes written to the private spill file (per process)
    # LTO IR entries, linked to PTX by nvJitLink in a child process (`ltoir.py`): its address space,
    # the deadline of one entry, and the linking time per wheel (and worker), past which the rest
    # are listed unreadable (cuFFT 11.2: 10,046 entries, ~9 ms each)
    max_lto_memory: int = 1 * GiB  # each (cuFFT 11.2.3 links its 10,046 entries within 384 MiB)
    max_lto_processes: int = 4  # linking at once (at most one per CPU; with --jobs N, N share them)
    max_lto_entry: int = 256 * MiB  # stored bytes of one entry handed to nvJitLink
    max_lto_entry_seconds: float = 60.0
    max_lto_seconds: float = 150.0


@dataclass
class Budget:
    """Work done so far for one wheel (or one worker's share of it): the wall-clock deadline
    and the items examined (`Limits.max_items`).
    The time is checked by every reader between reads of at most 1 MiB."""

    deadline: float = math.inf  # time.monotonic() value (system-wide, so valid in workers)
    seconds: float = math.inf  # the limit, for the message
    items: int = 0
    steps: int = 0
    spilled: int = 0
    routed: int = 0
    unpacked: int = 0  # bytes of the wheel's members and of its nested archives' members
    lto_seconds: float = 0.0  # spent linking LTO IR entries (`Limits.max_lto_seconds`)
    limits: Limits = Limits()

    @classmethod
    def starting_now(cls, limits: Limits) -> Budget:
        return cls(time.monotonic() + limits.max_seconds, limits.max_seconds, limits=limits)

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TimeLimitError(
                f"stopped: the scan took longer than the limit of {self.seconds:g} s per wheel (--time-limit)"
            )

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)

    def count(self, limits: Limits, what: str, weight: int = 1) -> None:
        self.items += weight
        if self.items > limits.max_items:
            raise HostileArchiveError(f"{what}: {too_many_items(limits)}")

    def unpack(self, unpacked: int, compressed: int, what: str) -> None:
        """Count a member of a nested archive: the wheel's unpacked bytes, nested archives
        included, stay within `max_total_unpacked`, and past `ratio_floor` a nested member may
        not expand more than `max_ratio` (nesting multiplies what each level may declare)."""
        self.unpacked += unpacked
        _refuse_past(self.unpacked, self.limits.max_total_unpacked, what,
                     "bytes unpacked in this wheel, nested archives included (zip bomb?)")
        check_ratio(unpacked, compressed, self.limits, what)

    def routed_line(self) -> bool:
        """Count one routed (info) text line; False once the wheel's own cap for them is reached."""
        self.routed += 1
        return self.routed <= self.limits.max_routed_lines

    def step(self, n: int, what: str) -> None:
        """Count `n` cheap steps (symbol rows, KiB of names and strings examined)."""
        self.steps += n
        _refuse_past(self.steps, self.limits.max_steps, what, "steps of work in this wheel (symbol-table rows, "
                     "KiB of names and strings examined; hostile?)")

    def spill(self, n: int, what: str) -> None:
        self.spilled += n
        _refuse_past(self.spilled, self.limits.max_spill, what, "bytes to keep on disk while reading this wheel "
                     "(hostile?)")


def _refuse_past(count: int, limit: int, what: str, unit: str) -> None:
    if count > limit:
        raise HostileArchiveError(f"{what}: more than {limit:,} {unit}")


def too_many_items(limits: Limits) -> str:
    return (
        f"more than {limits.max_items:,} items to examine in this wheel (fatbin headers, archive "
        "members, strings and names that hold retired-op names; hostile?)"
    )


def check_ratio(produced: int, consumed: int, limits: Limits, what: str) -> None:
    """Refuse a decompressor whose output outgrows `limits.max_ratio` x its input."""
    if produced > limits.ratio_floor and produced > consumed * limits.max_ratio:
        raise HostileArchiveError(
            f"{what}: expands more than {limits.max_ratio:.0f}:1 ({produced:,} bytes from {consumed:,}; "
            "decompression bomb?)"
        )
