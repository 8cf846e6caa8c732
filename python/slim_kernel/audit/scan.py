"""Scan one wheel member in a single forward pass and report what it says about retired ops.

Member kinds (`kinds`: sniffed from content, not trusted from the name): host ELF (shared libraries,
objects), cubin (ELF for EM_CUDA), fatbin, ar archive (of objects), nested zip/tar archives
(see `nested`), PTX, raw LTO IR, other binary files, and text, which is reported as routed/info (Python,
JIT sources, metadata), never as AOT code. Every member is also searched, byte by byte, for
embedded fatbins and raw cubins (`embedded`). A host ELF is streamed: fatbin containers are
parsed and dropped as they pass, all other bytes are retained in a `SpanStore` so the symbol
tables and every allocated data section can be read after.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from . import demangle, ltoir, nested
from .device import DeviceCode
from .elf import ELF_MAGIC, PT_LOAD, ElfFile, HitStrings
from .embedded import device_code, device_split, shipped_ltoir
from .kinds import AR_MAGIC, SNIFF, classify, routed_kind
from .limits import UNPARSABLE, Budget, HostileArchiveError, Limits, MalformedBinaryError, unparsable_reason
from .rules import Rules
from .stream import Pull, SpanStore, SubReader, context_windows

MAX_AR_NAMES = 16 << 20
LINE_CONTEXT = 160  # routed evidence: bytes of the line either side of a hit
RUN_LIMIT = 512  # .rodata strings: bytes either side of a hit
EVIDENCE_MAX = 1024  # characters of one finding's evidence kept (sgl-kernel 0.3.21: 443 at most)
ROUTED_SNIPPETS = 3
_PRINTABLE = re.compile(rb"[\x20-\x7e]*")
_IDENT_END = re.compile(rb"[A-Za-z0-9_]*")
_PTX_ENTRY = re.compile(r"\s*(?:\.(?:visible|weak|extern)\s+)*\.entry\s+([A-Za-z_$%][A-Za-z0-9_$]*)")
_PTX_FUNC = re.compile(r"\s*(?:\.(?:visible|weak)\s+)*\.func\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][A-Za-z0-9_$]*)")  # not .extern
_IDENT_BYTES = frozenset(bytes([c]) for c in b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True)
class ScanContext:
    rules: Rules
    limits: Limits
    budget: Budget = field(default_factory=Budget, compare=False)  # mutable: this scan's work so far


@dataclass
class Hit:
    """Evidence of a retired op in compiled code (an AOT finding)."""

    op: str
    layer: str
    evidence: str
    size: int = 0  # bytes this evidence accounts for (symbol or kernel size), for `size`
    arch: str = ""
    counted: bool = True  # False when the bytes are already counted through a whole device blob


@dataclass
class Blob:
    """One device-code payload (fatbin entry or shipped cubin/PTX) for size accounting."""

    arch: str
    kind: str
    stored: int
    unpacked: int
    compression: str
    tu: str
    op: str


@dataclass
class MemberScan:
    member: str
    kind: str
    unpacked: int
    compressed: int
    hits: list[Hit] = field(default_factory=list)
    mentions: list[dict] = field(default_factory=list)  # names that are not evidence of code
    unreadable: list[dict] = field(default_factory=list)  # what could not be read, by layer
    routed: list[dict] = field(default_factory=list)
    blobs: list[Blob] = field(default_factory=list)
    stats: Counter = field(default_factory=Counter)


class _Collector:
    """Gathers one member's evidence: attributes ops to each candidate name, and keeps bounded
    evidence: every candidate is examined (at most `max_candidates`), at most
    `max_hits_per_member` distinct findings are kept per layer, plus the first of each further
    op, and `max_repeats` repeats of kept ones; at most `max_hits_per_member` mentions."""

    def __init__(self, scan: MemberScan, ctx: ScanContext):
        self.scan, self.ctx = scan, ctx
        self._examined = 0
        self._kept: dict[str, int] = {}  # distinct findings kept per layer
        self._extra: dict[str, int] = {}  # ... past the limit (the first of each further op)
        self._ops: set[tuple[str, str]] = set()
        self._evidence: dict[tuple[str, str, str], str] = {}
        self._repeats = 0
        self._mentioned: set[tuple[str, str]] = set()

    def add(
        self, layer: str, name: str, size: int = 0, arch: str = "", ops: tuple[str, ...] = (), what: str = ""
    ):
        """A name from compiled code (symbol, kernel, PTX entry): a finding for each retired op it
        names (read in its mangled form: no demangler needed), and for `ops` (its TU's)."""
        self._examined += 1
        self.ctx.budget.count(self.ctx.limits, self.scan.member, 1 + len(name) // 64)
        if self._examined > self.ctx.limits.max_candidates:
            raise HostileArchiveError(
                f"{self.scan.member}: more than {self.ctx.limits.max_candidates:,} names to examine (hostile?)"
            )
        found = dict.fromkeys([*ops, *self.ctx.rules.match(name)])
        if not found:
            return
        text = demangle.demangle(name)
        evidence = f"{what} {text}" if what else text
        if text != name:
            evidence += f" [{name}]"
        for op in found:
            self.hit(Hit(op, layer, evidence, size, arch, counted=not ops))

    def hit(self, hit: Hit) -> None:
        """Keep a finding unless its layer already holds enough distinct evidence; the same
        evidence again (another arch, another cubin: its bytes count for `size`) shares the
        kept string, up to `max_repeats` per member."""
        if len(hit.evidence) > EVIDENCE_MAX:
            hit.evidence = hit.evidence[: EVIDENCE_MAX - 3] + "..."
        lim, key = self.ctx.limits, (hit.layer, hit.op, hit.evidence)
        kept = self._evidence.get(key)
        if kept is not None:
            if self._repeats >= lim.max_repeats:
                self.scan.stats["evidence_dropped"] += 1
                return
            self._repeats += 1
            hit.evidence = kept
        elif self._kept.get(hit.layer, 0) < lim.max_hits_per_member:
            self._kept[hit.layer] = self._kept.get(hit.layer, 0) + 1
        elif (hit.layer, hit.op) not in self._ops and self._extra.get(hit.layer, 0) < lim.max_hits_per_member:
            self._extra[hit.layer] = self._extra.get(hit.layer, 0) + 1  # the first of each further op is kept
        else:
            self.scan.stats["evidence_dropped"] += 1
            return
        self._evidence.setdefault(key, hit.evidence)
        self._ops.add((hit.layer, hit.op))
        self.scan.hits.append(hit)

    def mention(self, op: str, layer: str, evidence: str) -> None:
        """A retired-op name (or device magic, `op` "") that is not evidence of compiled code."""
        evidence = evidence if len(evidence) <= EVIDENCE_MAX else evidence[: EVIDENCE_MAX - 3] + "..."
        if (op, evidence) in self._mentioned:
            return
        if len(self._mentioned) >= self.ctx.limits.max_hits_per_member:
            self.scan.stats["mentions_dropped"] += 1
            return
        self._mentioned.add((op, evidence))
        self.scan.mentions.append(
            {"op": op, "member": self.scan.member, "layer": layer, "evidence": evidence}
        )

    def unreadable(self, layer: str, why: str) -> None:
        """Something of `layer` that this audit cannot read: listed with why; the verdict is on the rest."""
        self.scan.unreadable.append({"member": self.scan.member, "layer": layer, "reason": why})

    def add_device(self, code: DeviceCode, layers: tuple[str, str], stored: int, unpacked: int, comp: str):
        """Record a cubin/PTX payload; `layers` = (layer for TU evidence, layer for names)."""
        blob_layer, names_layer = layers
        tu, op = (code.tus[0] if code.tus else ""), (code.tu_ops[0] if code.tu_ops else "")
        self.scan.blobs.append(Blob(code.arch, code.kind, stored, unpacked, comp, tu, op))
        self.scan.stats[f"{code.kind}s"] += 1
        self.scan.stats[f"{code.kind}_names"] += code.kernel_count
        for tu_name in code.tus:
            for tu_op in self.ctx.rules.match(tu_name):
                self.hit(Hit(tu_op, blob_layer, f"translation unit {tu_name}", stored, code.arch))
        for path in code.line_files:
            for file_op in self.ctx.rules.match(path):
                self.hit(Hit(file_op, blob_layer, f"source file {path} (line table)", stored, code.arch))
        for name, size, what in code.names:
            # kernels of a retired TU are attributed to it; their bytes are inside the blob already
            self.add(names_layer, name, size, code.arch, code.tu_ops, what)


# -- host ELF (shared library or object) ----------------------------------------------------
SHF_ALLOC, SHF_EXECINSTR = 0x2, 0x4
_DATA_TYPES = {1, 14, 15, 16}  # PROGBITS, INIT_ARRAY, FINI_ARRAY, PREINIT_ARRAY


def _scan_host_elf(src: Pull, col: _Collector, ctx: ScanContext, label: str) -> None:
    with SpanStore(src.size, ctx.limits.retained_in_memory, label, ctx.budget) as store:
        for off, data in device_split(src, col, _embedded_layers, strict=True):
            store.add(off, data)
        col.scan.stats["elf_files"] += 1
        _scan_elf_tables(ElfFile(store, ctx.limits, label), store, col, ctx)


def _merged(spans):
    """Union of (offset, length) spans as sorted (offset, length): each byte read once."""
    out: list[list[int]] = []
    for off, n in sorted(spans):
        if out and off <= out[-1][0] + out[-1][1]:
            out[-1][1] = max(out[-1][1], off + n - out[-1][0])
        else:
            out.append([off, n])
    return out


def _without(spans, holes):
    """Sorted, merged (offset, length) `spans` minus the sorted, merged `holes`."""
    out = []
    for off, n in spans:
        end = off + n
        for h_off, h_n in holes:
            if h_off + h_n <= off or h_off >= end:
                continue
            if h_off > off:
                out.append((off, h_off - off))
            off = max(off, h_off + h_n)
        if off < end:
            out.append((off, end - off))
    return out


def data_sections(elf: ElfFile):
    """(offset, size) of every allocated, non-executable section with contents: .rodata*,
    .data*, .data.rel.ro, init arrays and any custom one (where op tables and strings live)."""
    return [
        (s.offset, s.file_size)
        for s in elf.sections
        if s.file_size
        and (
            s.name.startswith((".rodata", ".data"))
            or (s.flags & SHF_ALLOC and not s.flags & SHF_EXECINSTR and s.type in _DATA_TYPES)
        )
    ]


def _scan_elf_tables(elf: ElfFile, store: SpanStore, col: _Collector, ctx: ScanContext) -> None:
    stats = col.scan.stats
    tables = elf.symbol_tables()
    for kind, sec, strtab in tables:
        layer = f"elf-{kind}"
        stats[f"{layer}_symbols"] += sec.size // (24 if elf.is64 else 16)
        hits = HitStrings(elf, strtab, ctx.rules, ctx.limits, ctx.budget)
        if not hits:
            continue
        for sym in elf.iter_symbols(sec, hits, ctx.budget, strtab):
            if sym.type != 3:  # STT_SECTION names are not symbols of code
                col.add(layer, sym.name.decode("latin-1"), sym.size, what="file" if sym.type == 4 else "")
    # data: allocated data sections whatever their names, and every byte the loader maps (a
    # renamed, unflagged .rodata is still read); no headers at all: every retained byte. The
    # symbols' string tables are not data: their names were read as symbols (defined ones only)
    mapped = [(g.offset, g.file_size) for g in elf.segments if g.type == PT_LOAD and g.file_size]
    spans = _merged(data_sections(elf) + mapped) if elf.sections or mapped else [(0, elf.size)]
    spans = _without(spans, _merged([(t.offset, t.file_size) for _, _, t in tables if t.file_size]))
    _scan_data_strings(store, spans, col, ctx)


def _scan_data_strings(store: SpanStore, spans, col: _Collector, ctx: ScanContext) -> None:
    """The strings around retired-op literals in the (offset, length) `spans` of `store`: op
    schemas and names are findings, texts naming them mentions, and a PTX `.entry` or `.func` definition line (PTX
    text kept in data for `cuModuleLoadData`) is read as PTX: its kernel or function name is examined."""
    stats = col.scan.stats
    covered, seen = -1, set()
    for off, n in spans:
        stats["data_bytes"] += store.retained(off, n)
        for base, data, lo, hi in context_windows(store.pieces(off, n, zeros=False), RUN_LIMIT):
            for end, text in _strings_with_hits(data, lo, hi, max(covered - base, lo), ctx.rules):
                ctx.budget.count(ctx.limits, col.scan.member, 1 + len(text) // 64)
                covered = base + end
                if text in seen:
                    continue
                if len(seen) < 4 * ctx.limits.max_hits_per_member:
                    seen.add(text)
                entry = _PTX_ENTRY.match(text) or _PTX_FUNC.match(text)
                if entry:
                    col.add("ptx-entry", entry.group(1), what="PTX text")
                    continue
                kind, ops = ctx.rules.string_kind(text)
                for op in ops:
                    if kind == "mention":
                        col.mention(op, "data-string", text)
                    else:
                        col.hit(Hit(op, "rodata-schema" if kind == "schema" else "rodata-string", text))


def _strings_with_hits(data: bytes, lo: int, hi: int, start: int, rules: Rules):
    """(end, text) of the printable runs (like `strings`, cut at RUN_LIMIT bytes either side)
    around each prefilter hit in data[start:hi]; each run once, each byte read a bounded
    number of times."""
    find = rules.finder(data, lo, hi)
    pos = find.find(start)
    while pos >= 0:
        back = data[max(0, pos - RUN_LIMIT) : pos][::-1]
        first = pos - _PRINTABLE.match(back).end()
        end = _PRINTABLE.match(data, pos, min(len(data), pos + RUN_LIMIT)).end()
        yield end, data[first:end].decode("ascii")
        pos = find.find(end)


# -- ar archives (static libraries) ---------------------------------------------------------
def _scan_ar(src: Pull, col: _Collector, ctx: ScanContext, label: str) -> None:
    src.take(len(AR_MAGIC))
    long_names = b""
    while src.remaining >= 60:
        src.budget.count(ctx.limits, label)
        head = src.take(60)
        if head[58:60] != b"`\n":
            raise MalformedBinaryError(f"{label}: bad ar member header at {src.pos - 60}")
        name = head[:16].rstrip(b" ")
        try:
            size = int(head[48:58].strip() or b"0")
        except ValueError:
            raise MalformedBinaryError(f"{label}: bad ar member size at {src.pos - 60}") from None
        if size > src.remaining:
            raise MalformedBinaryError(f"{label}: ar member of {size} bytes, only {src.remaining} left")
        if name == b"//":
            if size > MAX_AR_NAMES:
                raise HostileArchiveError(f"{label}: ar name table of {size} bytes is over the limit")
            long_names = src.take(size)
        elif name in (b"/", b"/SYM64/") or size < 4:
            src.skip(size)
        else:
            if name.startswith(b"/") and name[1:].isdigit():
                off = int(name[1:])
                name = long_names[off : long_names.find(b"\n", off)] if off < len(long_names) else name
            what = f"{label}({name.rstrip(b'/').decode('latin-1')[:256]})"
            reader = SubReader(src, size)
            sub = Pull(reader, size, what, budget=ctx.budget)
            try:
                sub.fill(4)
                if sub.peek(4) == ELF_MAGIC:
                    _scan_host_elf(sub, col, ctx, sub.what)
                else:
                    for _ in device_split(sub, col, _data_file_layers, strict=False):
                        pass
            except UNPARSABLE as exc:  # one object that cannot be parsed: the others are still read
                col.unreadable("member", unparsable_reason(exc))
                reader.drain()
        if size % 2 and src.remaining:
            src.take(1)


# -- text-like members: routed/info only ----------------------------------------------------
def _line_around(data: bytes, pos: int, lo: int) -> tuple[int, int]:
    """[start, end) of the text line around `pos`, at most LINE_CONTEXT bytes either side, cut
    only between identifiers (a cut word is dropped, never read as a shorter name); each
    search is bounded, so a hit costs O(LINE_CONTEXT) however long its line."""
    start = max(data.rfind(b"\n", max(0, pos - LINE_CONTEXT), pos) + 1, pos - LINE_CONTEXT, 0)
    if start and data[start - 1 : start] in _IDENT_BYTES:  # a cut word: start after it (the
        start = _IDENT_END.match(data, start, max(start, pos - 1)).end()  # byte before the hit stays)
    end = data.find(b"\n", pos, pos + LINE_CONTEXT)
    if end < 0:  # cut inside the line: end before a word (the hit's own word is kept whole)
        end = min(len(data), pos + LINE_CONTEXT)
        word_end = _IDENT_END.match(data, pos, min(len(data), pos + LINE_CONTEXT + RUN_LIMIT)).end()
        end = max(word_end, _word_start(data, end, word_end))
    return start, end


def _word_start(data: bytes, end: int, floor: int) -> int:
    """`end` moved back to the start of the identifier it cuts (not before `floor`)."""
    at = end
    while at > floor and data[at - 1 : at] in _IDENT_BYTES:
        at -= 1
    return at if at < end and end < len(data) and data[end : end + 1] in _IDENT_BYTES else end


def _scan_text(pieces, scan: MemberScan, ctx: ScanContext) -> None:
    """Lines naming retired ops in (offset, bytes) `pieces` of a text member: routed/info.
    Routed lines have their own caps (per member and per wheel), apart from the item budget
    for hostile work: a legit package may name the ops in many tuning tables; lines past a cap
    are counted only."""
    counts: dict[str, int] = {}
    snippets: dict[str, list[str]] = {}
    covered, lines = 0, 0
    limit = ctx.limits.max_text_lines
    for base, data, lo, hi in context_windows(pieces, LINE_CONTEXT + RUN_LIMIT):
        if lines >= limit:  # enough evidence: drain the rest for the CRC check only
            continue
        find = ctx.rules.finder(data, lo, hi)
        pos = find.find(max(covered - base, lo))
        while pos >= 0:
            lines += 1
            if lines > limit or not ctx.budget.routed_line():
                lines = max(lines, limit)
                scan.stats["routed_truncated"] += 1
                break
            start, end = _line_around(data, pos, lo)
            line = data[start:end].decode("utf-8", "replace").strip()
            for op in ctx.rules.match(line):
                counts[op] = counts.get(op, 0) + 1
                if len(snippets.setdefault(op, [])) < ROUTED_SNIPPETS and line not in snippets[op]:
                    snippets[op].append(line)
            covered = base + end
            pos = find.find(end)
    scan.stats["text_files"] += 1
    scan.stats["text_bytes"] += scan.unpacked
    kind = routed_kind(scan.member) if counts else ""
    for op, n in counts.items():
        scan.routed.append(
            {"op": op, "member": scan.member, "kind": kind, "count": n, "evidence": snippets[op]}
        )


# -- dispatch -------------------------------------------------------------------------------
def scan_member(
    stream, name: str, unpacked: int, compressed: int, ctx: ScanContext, on_progress=None, depth: int = 0
) -> MemberScan:
    src = Pull(stream, unpacked, name, on_progress, ctx.budget)
    src.fill(SNIFF)
    kind = classify(name, src.peek(SNIFF))
    scan = MemberScan(name, kind, unpacked, compressed)
    col = _Collector(scan, ctx)
    try:
        _dispatch(kind, src, col, ctx, depth)
    except UNPARSABLE as exc:
        # the member's content cannot be parsed: listed with its reason (evidence already found
        # is kept), the rest of the wheel is judged; bounds and the archive's own errors propagate
        col.unreadable("member", unparsable_reason(exc))
    except BaseException:
        ltoir.LINKER.abort()
        raise
    ltoir.LINKER.drain()  # the LTO IR entries still being linked
    return scan


def _dispatch(kind: str, src: Pull, col: _Collector, ctx: ScanContext, depth: int) -> None:
    scan, name, unpacked = col.scan, col.scan.member, src.size
    if kind == "elf":
        _scan_host_elf(src, col, ctx, name)
    elif kind == "macho":  # no Mach-O reader: every byte is read as data (strings), and for device code
        with SpanStore(src.size, ctx.limits.retained_in_memory, name, ctx.budget) as store:
            for off, data in device_split(src, col, _data_file_layers, strict=False):
                store.add(off, data)
            _scan_data_strings(store, [(0, src.size)], col, ctx)
        scan.stats["shipped_macho"] += 1
    elif kind == "ar":
        _scan_ar(src, col, ctx, name)
    elif kind in ("zip", "tar", "compressed"):  # an archive or .zst/.lz4 file: scan what it holds
        nested.scan_archive(kind, src, col, ctx, depth, scan_member)
    elif kind == "ltoir":  # a raw LTO IR module
        shipped_ltoir(src, col)
    elif kind in ("cubin", "ptx"):
        if unpacked > ctx.limits.max_entry_unpacked:
            raise HostileArchiveError(f"{name}: {unpacked}-byte device file is over the limit")
        windows = (data for _, data in src.pieces())
        device_code(col, kind, windows, unpacked, name, (f"shipped-{kind}",) * 2, unpacked)
        scan.stats[f"shipped_{kind}"] += 1
    else:  # a shipped fatbin, any other file: device code anywhere in it; text: routed lines
        pieces = device_split(src, col, _data_file_layers, strict=kind == "fatbin")
        if kind == "text":
            _scan_text(pieces, scan, ctx)
        else:
            for _ in pieces:
                pass
            scan.stats[f"shipped_{kind}"] += 1


def _embedded_layers(kind: str) -> tuple[str, str]:
    """Layers of device code inside a host library."""
    if kind == "cubin":
        return "embedded-cubin", "embedded-cubin"
    return "fatbin-tu", {"fatbin-ptx": "ptx-entry", "fatbin-ltoir": "ltoir-entry"}.get(kind, "fatbin-kernel")


def _data_file_layers(kind: str) -> tuple[str, str]:
    """Layers of device code inside any other file (a shipped fatbin, a data or cache file)."""
    return ("embedded-cubin",) * 2 if kind == "cubin" else ("shipped-fatbin",) * 2
