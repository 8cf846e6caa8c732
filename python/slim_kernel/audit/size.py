"""Wheel size model: where the bytes are (members, device code per arch and per translation
unit, native bytes per retired op) and how two wheels compare. Built from the same streaming
scan as the audit, so it works on any wheel, ours or third-party."""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from .runner import WheelScan

NATIVE_KINDS = {"elf", "ar", "cubin", "fatbin", "ptx"}
HOST_LAYERS = {"elf-dynsym", "elf-symtab"}
TOP_MEMBERS = 15
TOP_UNITS = 20
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.I)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
    "t": 1000**4,
    "tb": 1000**4,
    "tib": 1024**4,
}


def parse_size(text: str, arg: str = "--budget") -> int:
    """'5MB' (decimal), '512KiB' (binary) or plain bytes -> bytes; ValueError naming `arg`."""
    m = _SIZE.match(str(text))
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"{arg}: expected a size like 5MB, 512KiB or 1048576, got {text!r}")
    return int(float(m.group(1)) * _UNITS[unit])


def size_summary(scan: WheelScan) -> dict:
    members = scan.members
    kinds = {s.member: s.kind for s in scan.scans}
    native = sum(m.unpacked for m in members if kinds.get(m.name) in NATIVE_KINDS)
    blobs = [b for s in scan.scans for b in s.blobs]
    device_stored = sum(b.stored for b in blobs)
    per_arch: dict[str, dict] = defaultdict(lambda: {"entries": 0, "stored": 0, "unpacked": 0})
    per_unit: dict[str, dict] = defaultdict(lambda: {"stored": 0, "unpacked": 0, "archs": set()})
    for b in blobs:
        a = per_arch[b.arch]
        a["entries"] += 1
        a["stored"] += b.stored
        a["unpacked"] += b.unpacked
        u = per_unit[b.tu or "(unnamed translation unit)"]
        u["stored"] += b.stored
        u["unpacked"] += b.unpacked
        u["archs"].add(b.arch)
    return {
        "wheel": scan.path,
        "file_bytes": scan.compressed_file,
        "compressed": sum(m.compressed for m in members),
        "unpacked": scan.unpacked,
        "members": len(members),
        "native_bytes": native,
        "device_bytes": device_stored,
        "host_native_bytes": max(native - device_stored, 0),
        "largest": [
            {"member": m.name, "compressed": m.compressed, "unpacked": m.unpacked}
            for m in sorted(members, key=lambda m: m.unpacked, reverse=True)[:TOP_MEMBERS]
        ],
        "per_arch": dict(sorted(per_arch.items(), key=lambda kv: -kv[1]["stored"])),
        "per_op": _per_op(scan),
        "per_translation_unit": [
            {"unit": name, "stored": u["stored"], "unpacked": u["unpacked"], "archs": sorted(u["archs"])}
            for name, u in sorted(per_unit.items(), key=lambda kv: -kv[1]["stored"])[:TOP_UNITS]
        ],
        "member_sizes": {m.name: [m.compressed, m.unpacked] for m in members},
        "unit_sizes": {name: u["stored"] for name, u in per_unit.items()},
        "seconds": round(scan.seconds, 3),
    }


def _per_op(scan: WheelScan) -> dict:
    """Native bytes per retired op: whole device payloads of its translation units, its own
    kernels elsewhere (code size), and its host symbols (each symbol once per member); with
    the split per member."""
    ops: dict[str, dict] = defaultdict(lambda: {"device": 0, "host": 0, "archs": set(), "members": Counter()})

    def add(op: str, member: str, kind: str, size: int, arch: str = "") -> None:
        ops[op][kind] += size
        ops[op]["members"][member] += size
        if arch:
            ops[op]["archs"].add(arch)

    for s in scan.scans:
        for b in s.blobs:
            if b.op:
                add(b.op, s.member, "device", b.stored, b.arch)
        host_seen: dict[tuple[str, str], int] = {}
        for h in s.hits:
            if h.layer in HOST_LAYERS:
                key = (h.op, h.evidence)
                host_seen[key] = max(host_seen.get(key, 0), h.size)
            elif h.counted and h.size and not h.layer.endswith("-tu"):
                add(h.op, s.member, "device", h.size, h.arch)
            else:  # an op seen only in strings still gets a (zero-byte) row
                add(h.op, s.member, "device", 0)
        for (op, _), size in host_seen.items():
            add(op, s.member, "host", size)
    return {
        op: {
            "device": v["device"],
            "host": v["host"],
            "total": v["device"] + v["host"],
            "archs": sorted(v["archs"]),
            "members": dict(v["members"].most_common()),
        }
        for op, v in sorted(ops.items())
    }


def _delta(new: int, old: int) -> dict:
    return {"bytes": old - new, "percent": round(100.0 * (old - new) / old, 2) if old else 0.0}


def _diff(new_sizes: dict[str, int], old_sizes: dict[str, int], key: str) -> list[dict]:
    """Entries whose size differs, largest change first (added/removed/changed)."""
    changes = []
    for name in set(new_sizes) | set(old_sizes):
        new, old = new_sizes.get(name, 0), old_sizes.get(name, 0)
        if new != old or (name in new_sizes) != (name in old_sizes):
            status = "added" if name not in old_sizes else "removed" if name not in new_sizes else "changed"
            changes.append({key: name, "status": status, "baseline": old, "subject": new, "delta": new - old})
    changes.sort(key=lambda c: (-abs(c["delta"]), c[key]))
    return changes


def compare(subject: dict, baseline: dict, top: int = 25) -> dict:
    """Reduction of `subject` vs `baseline` (positive = smaller), member-level and
    translation-unit-level diffs (unpacked member bytes; stored device-code bytes per TU)."""
    members = _diff(
        {k: v[1] for k, v in subject["member_sizes"].items()},
        {k: v[1] for k, v in baseline["member_sizes"].items()},
        "member",
    )
    units = _diff(subject["unit_sizes"], baseline["unit_sizes"], "unit")
    ops = sorted(set(subject["per_op"]) | set(baseline["per_op"]))
    return {
        "baseline": baseline["wheel"],
        "file_bytes": _delta(subject["file_bytes"], baseline["file_bytes"]),
        "unpacked": _delta(subject["unpacked"], baseline["unpacked"]),
        "native_bytes": _delta(subject["native_bytes"], baseline["native_bytes"]),
        "per_op": {
            op: _delta(
                subject["per_op"].get(op, {}).get("total", 0), baseline["per_op"].get(op, {}).get("total", 0)
            )
            for op in ops
        },
        "per_arch": {
            arch: _delta(
                subject["per_arch"].get(arch, {}).get("stored", 0),
                baseline["per_arch"].get(arch, {}).get("stored", 0),
            )
            for arch in sorted(set(subject["per_arch"]) | set(baseline["per_arch"]))
        },
        "members_added": sum(c["status"] == "added" for c in members),
        "members_removed": sum(c["status"] == "removed" for c in members),
        "members_changed": sum(c["status"] == "changed" for c in members),
        "member_diff": members[:top],
        "units_added": sum(c["status"] == "added" for c in units),
        "units_removed": sum(c["status"] == "removed" for c in units),
        "unit_diff": units[:top],
    }
