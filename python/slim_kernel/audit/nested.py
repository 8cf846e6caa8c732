"""Archives inside a wheel (a vendored .whl/.zip/.egg/.jar, a .tar/.tar.gz of libraries) are
opened and their members scanned like the wheel's own, so compiled code cannot hide there.

A nested zip needs random access: it is spooled to a file in a private temporary directory
(deleted afterwards) and validated with the same `WheelArchive` checks as a wheel. A tar is read
as a forward-only stream; its declared member sizes and count are bounded by `Limits`. Nesting
deeper than `MAX_DEPTH` is refused. Evidence from inside is prefixed with the inner path.
"""

from __future__ import annotations

import lzma
import os
import struct
import tarfile
import tempfile
import zlib

from .limits import AuditInputError, HostileArchiveError
from .stream import CHUNK
from .wheel import WheelArchive, open_member

MAX_DEPTH = 3
ZIP_MAGIC = b"PK\x03\x04"
_TAR_NAMES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")


def archive_kind(name: str, head: bytes) -> str | None:
    if head[:4] == ZIP_MAGIC:
        return "zip"
    if head[257:262] == b"ustar" or (name.lower().endswith(_TAR_NAMES) and head.startswith(_COMPRESSED)):
        return "tar"
    return None


def scan_archive(kind: str, src, scan, ctx, depth: int, scan_member) -> None:
    """Scan every file inside the archive `src` (a `stream.Pull`) into `scan` (its MemberScan);
    `scan_member` is `scan.scan_member` (passed in to avoid an import cycle)."""
    if depth >= MAX_DEPTH:
        raise HostileArchiveError(f"{scan.member}: archives nested more than {MAX_DEPTH} deep")
    try:
        if kind == "zip":
            _scan_zip(src, scan, ctx, depth, scan_member)
        else:
            _scan_tar(src, scan, ctx, depth, scan_member)
    except AuditInputError as exc:
        raise type(exc)(f"{scan.member} (nested {kind}): {exc}") from None
    scan.stats[f"nested_{kind}"] += 1


def _scan_zip(src, scan, ctx, depth, scan_member) -> None:
    with tempfile.TemporaryDirectory(prefix="slim-kernel-audit-") as tmp:
        path = os.path.join(tmp, "nested.zip")
        with open(path, "wb") as f:
            while src.remaining:
                f.write(src.take(min(CHUNK, src.remaining)))
        with WheelArchive(path, ctx.limits) as inner:
            for m in inner.members:
                with open_member(path, m) as stream:
                    _merge(scan, scan_member(stream, m.name, m.unpacked, m.compressed, ctx, depth=depth + 1))


class _PullFile:
    """Minimal file object over a `Pull` for tarfile's stream mode."""

    def __init__(self, src):
        self._src = src

    def read(self, n: int = -1) -> bytes:
        n = self._src.remaining if n is None or n < 0 else min(n, self._src.remaining)
        return self._src.take(n) if n else b""


def _scan_tar(src, scan, ctx, depth, scan_member) -> None:
    lim = ctx.limits
    total = count = 0
    try:
        with tarfile.open(fileobj=_PullFile(src), mode="r|*") as tf:
            for info in tf:
                count += 1
                if count > lim.max_members:
                    raise HostileArchiveError(f"more than {lim.max_members} tar members")
                if not info.isfile():
                    continue  # links and devices are never followed or created
                total += info.size
                if info.size > lim.max_member_unpacked or total > lim.max_total_unpacked:
                    raise HostileArchiveError(f"tar member {info.name!r} exceeds the size limits (bomb?)")
                stream = tf.extractfile(info)
                _merge(scan, scan_member(stream, info.name, info.size, info.size, ctx, depth=depth + 1))
    except (tarfile.TarError, EOFError, OSError, ValueError, struct.error, zlib.error, lzma.LZMAError) as exc:
        raise AuditInputError(f"unreadable tar: {exc}") from None


def _merge(outer, inner) -> None:
    for hit in inner.hits:
        hit.evidence = f"{inner.member}: {hit.evidence}"
        outer.hits.append(hit)
    outer.blobs.extend(inner.blobs)
    for r in inner.routed:
        r["member"] = f"{outer.member}!{r['member']}"
        outer.routed.append(r)
    outer.stats.update(inner.stats)
    outer.stats["nested_members"] += 1
