"""Turn a wheel scan into the audit result (the JSON contract) and a short human report.

A finding is evidence of compiled AOT code, in one of five classes (`EVIDENCE_CLASS`): an
entry point (a defined symbol), a registration or schema (an op schema, a binding name or op
table entry, a symbol or kernel name, a source path in a library's data), a kernel (in an
embedded fatbin, PTX or raw cubin), a translation unit (nvcc's internal names, line tables),
a shipped device file. A mention names a retired op without being code (a name inside a longer
text, another library's qualified op name, device magic that is no device code): listed, never
exit 1. Python, JIT sources and METADATA are `routed` (info).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from . import demangle
from .rules import Rules
from .runner import WheelScan

SCHEMA = 1  # version of the JSON written by `audit --json` and `size --json`

EVIDENCE_CLASS = {
    "elf-dynsym": "entry point",  # defined dynamic symbols, matched in mangled form
    "elf-symtab": "entry point",  # the static symbol table, when not stripped
    "rodata-schema": "registration",  # op schemas in any allocated data section
    "rodata-string": "registration",  # names, op tables, symbol names, source paths in data
    "fatbin-kernel": "kernel",  # kernels and symbols of cubins in embedded fatbins
    "ptx-entry": "kernel",  # .entry (and defined .func) names of PTX in embedded fatbins
    "ltoir-entry": "kernel",  # the same of LTO IR entries, linked to PTX by nvJitLink
    "embedded-cubin": "kernel",  # raw cubins (no fatbin around them) anywhere in any file
    "fatbin-tu": "translation unit",  # nvcc internal names and line tables of embedded code
    "shipped-cubin": "shipped device file",
    "shipped-fatbin": "shipped device file",  # .fatbin files, fatbins inside any other file
    "shipped-ptx": "shipped device file",
    "shipped-ltoir": "shipped device file",  # raw LTO IR files, linked to PTX by nvJitLink
}
LAYERS = tuple(EVIDENCE_CLASS)


def _stats(scan: WheelScan) -> Counter:
    total: Counter = Counter()
    for s in scan.scans:
        total.update(s.stats)
    return total


def _scanned(layer: str, st: Counter) -> str:
    if layer == "elf-dynsym":
        return f"{st['elf_files']} ELF files, {st['elf-dynsym_symbols']:,} dynamic symbols"
    if layer == "elf-symtab":
        return f"{st['elf-symtab_symbols']:,} static symbols"
    if layer.startswith("rodata"):
        return f"{st['data_bytes']:,} bytes of allocated data sections"
    if layer == "embedded-cubin":
        return f"{st['raw_cubins']} raw cubins"
    if layer in ("fatbin-kernel", "fatbin-tu"):
        return (
            f"{st['fatbin_containers']} fatbin containers, {st['fatbin_entries']} entries "
            f"({st['fatbin_none']} plain, {st['fatbin_lz4']} LZ4, {st['fatbin_zstd']} zstd), "
            f"{st['cubins']} cubins, {st['cubin_names']:,} kernels"
        )
    if layer == "ptx-entry":
        return f"{st['ptxs']} PTX modules, {st['ptx_names']:,} entries"
    if layer == "ltoir-entry":
        return (
            f"{st['fatbin_ltoir']} LTO IR fatbin entries and {st['shipped_ltoir']} LTO IR files, "
            f"{st['ltoirs']} linked to PTX by nvJitLink, {st['ltoir_names']:,} kernels"
        )
    kind = layer.split("-", 1)[1]
    extra = f", {st['shipped_binary']} other binary files searched for fatbins" if kind == "fatbin" else ""
    return f"{st['shipped_' + kind]} shipped .{kind} files{extra}"


def audit_result(scan: WheelScan, rules: Rules) -> dict:
    """The contract's per-wheel JSON object (plus mentions, routed info and per-layer counts)."""
    merged: dict[tuple[str, str, str, str], set[str]] = defaultdict(set)
    for s in scan.scans:
        for h in s.hits:
            archs = merged[(h.op, s.member, h.layer, h.evidence)]
            if h.arch:
                archs.add(h.arch)
    order = {layer: i for i, layer in enumerate(LAYERS)}
    findings = [
        {
            "op": op,
            "member": member,
            "layer": layer,
            "class": EVIDENCE_CLASS[layer],
            "evidence": evidence,
            "archs": sorted(archs),
        }
        for (op, member, layer, evidence), archs in sorted(
            merged.items(), key=lambda kv: (kv[0][0], order.get(kv[0][2], 99), kv[0][1], kv[0][3])
        )
    ]
    unreadable = [u for s in scan.scans for u in s.unreadable]
    st = _stats(scan)
    per_layer = Counter(f["layer"] for f in findings)
    bad_layers = Counter(u["layer"] for u in unreadable)
    return {
        "wheel": scan.path,
        # an unreadable part is listed with its reason; the verdict is on everything else
        "exit_code": 1 if findings else 0,
        "clean": not findings,
        "ops_found": sorted({f["op"] for f in findings}),
        "findings": findings,
        "mentions": [m for s in scan.scans for m in s.mentions],
        "unreadable": unreadable,
        "seconds": round(scan.seconds, 3),
        "retired": rules.to_json(),
        "routed": [r for s in scan.scans for r in s.routed],
        "layers": {
            layer: {
                "scanned": _scanned(layer, st),
                "findings": per_layer[layer],
                "unreadable": bad_layers[layer],
            }
            for layer in LAYERS
        },
        "members": len(scan.members),
        "bytes_unpacked": scan.unpacked,
        "demangler": demangle.name(),
    }


def error_result(path: str, message: str, seconds: float, exit_code: int) -> dict:
    return {
        "wheel": path,
        "clean": False,
        "ops_found": [],
        "findings": [],
        "seconds": round(seconds, 3),
        "error": message,
        "exit_code": exit_code,
    }


def human_report(result: dict, examples: int = 3) -> str:
    lines = []
    name = result["wheel"]
    if "error" in result:
        label = {3: "MISSING DEPENDENCY", 4: "INTERNAL ERROR"}.get(result["exit_code"], "UNREADABLE")
        return f"{name}: {label}: {result['error']}"
    if result["ops_found"]:
        verdict = f"RETIRED AOT CODE FOUND: {', '.join(result['ops_found'])}"
    else:
        n = len(result["unreadable"])
        verdict = f"CLEAN ({n} unreadable part{'s' * (n != 1)} listed below)" if n else "CLEAN"
    lines.append(f"{name}: {verdict}")
    lines.append(
        f"  {result['members']} members, {result['bytes_unpacked']:,} bytes unpacked, "
        f"{result['seconds']:.1f} s; retired: {', '.join(result['retired'])}"
    )
    lines.append("  layer            findings  scanned")
    for layer, info in result["layers"].items():
        lines.append(f"  {layer:<16} {info['findings']:>8}  {info['scanned']}")
    by_op_layer: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for f in result["findings"]:
        by_op_layer[(f["op"], f["layer"])].append(f)
    for (op, layer), items in by_op_layer.items():
        members = sorted({f["member"] for f in items})
        lines.append(
            f"  [{op}] {layer}: {len(items)} in {', '.join(members[:3])}"
            + (f" (+{len(members) - 3} more)" if len(members) > 3 else "")
        )
        for f in items[:examples]:
            archs = f" ({', '.join(f['archs'])})" if f["archs"] else ""
            where = f"{f['member']}: " if len(members) > 1 else ""
            lines.append(f"      {where}{_clip(f['evidence'])}{archs}")
    for u in result["unreadable"][:examples]:
        lines.append(f"  unreadable ({u['layer']}): {u['member']}: {u['reason']}")
    mentions = result["mentions"]
    if mentions:
        ops = Counter(m["op"] or "device magic" for m in mentions)
        lines.append(
            "  mentions (not AOT code): "
            + ", ".join(f"{op} x{n}" for op, n in sorted(ops.items()))
            + f" in {len({m['member'] for m in mentions})} files"
        )
        for m in mentions[:examples]:
            lines.append(f"      {m['member']}: {_clip(m['evidence'])}")
    if not result["demangler"].startswith("cpp_demangle"):
        lines.append(f"  demangler: {result['demangler']}")
    routed = result["routed"]
    if routed:
        files = {r["member"]: r["kind"] for r in routed}
        kinds = Counter(files.values())
        summary = ", ".join(f"{n} in {k}" for k, n in sorted(kinds.items()))
        mentions = sum(r["count"] for r in routed)
        lines.append(
            f"  info (routed, not AOT code): op names mentioned in {len(files)} files "
            f"({summary}; {mentions} mentions)"
        )
    return "\n".join(lines)


def _clip(text: str, n: int = 160) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."
