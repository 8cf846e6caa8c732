"""What a cubin or a PTX module says about its origin: kernels, symbols and translation units.

A cubin names its kernels in `.text.<mangled>` sections and its symbol table; the translation
unit it was compiled from survives in internal-linkage names, which nvcc spells
``_INTERNAL_<hash>_<len>_<file with . -> _>_<hash>`` (``<len>`` counts the file part, so
``_29_dsv3_router_gemm_float_out_cu`` is ``dsv3_router_gemm_float_out.cu``), and, with
``-lineinfo`` or ``-G``, in the file tables of its line tables (`.debug_line`,
`.nv_debug_line_sass`, `.debug_line_str`), read as strings around each hit. PTX names its
kernels in `.entry` directives and its target in `.target`. Both are read in windows from a
`SpanStore` (or bytes), and names are handed on lazily, so nothing grows with the input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ..cubin import decode_sm
from .elf import STT_FUNC, ElfFile, HitStrings
from .limits import Budget, HostileArchiveError, Limits
from .rules import Rules
from .stream import WINDOW, SpanStore, context_windows, window_matches

# Every pattern is shorter than OVERLAP, so a window sees each match whole.
OVERLAP = 64 << 10
MATCH_STEPS = 64  # steps (Limits.max_steps) one regex match costs: 40M steps = 625,000 matches
_TU = re.compile(rb"_INTERNAL_[0-9a-f]{1,64}_(\d{1,4})_")
_PTX_ENTRY = re.compile(rb"\.entry\s{1,64}([A-Za-z_$%][\w$%]{0,65000})")
# a device function, after its return parameter if any: defined unless `.extern` comes before it
_PTX_FUNC = re.compile(rb"\.func\s{1,64}(?:\([^)]{0,256}\)\s{0,64})?([A-Za-z_$%][\w$%]{0,65000})")
_PTX_EXTERN = re.compile(rb"\.extern\s{1,8}$")
LINE_TABLES = (".debug_line", ".nv_debug_line_sass", ".debug_line_str")
_FILE_NAME = re.compile(rb"[\x21-\x7e]*")
_PTX_TARGET = re.compile(rb"\.target\s{1,64}(sm_\w{1,16})")
_FILE_OK = re.compile(rb"^[A-Za-z0-9_]+$")


@dataclass
class DeviceCode:
    kind: str  # "cubin" | "ptx" | "ltoir" (PTX nvJitLink linked an LTO IR entry to)
    arch: str
    tus: tuple[str, ...] = ()  # source files, e.g. "dsv3_router_gemm_float_out.cu"
    tu_ops: tuple[str, ...] = ()  # retired ops the TU names match
    names: Iterable[tuple[str, int, str]] = ()  # (raw name, size, what): may be lazy
    kernel_count: int = 0
    line_files: tuple[str, ...] = ()  # line-table file names naming a retired op


class _Tus:
    """Distinct translation-unit file names seen in windows of a string table or PTX text."""

    def __init__(self, limits: Limits, what: str, budget: Budget):
        self.found: dict[str, None] = {}
        self._limit, self._what, self._budget = limits.max_hits_per_member, what, budget

    def add(self, data: bytes, m: re.Match) -> None:
        self._budget.step(MATCH_STEPS, self._what)  # each match costs a little Python
        n = int(m.group(1))
        raw = data[m.end() : m.end() + n]
        if n == 0 or len(raw) != n or not _FILE_OK.match(raw):
            return
        name = raw.decode("ascii")
        for ext in ("_cu", "_cuh", "_cpp"):
            if name.endswith(ext):
                name = name[: -len(ext)] + "." + ext[1:]
                break
        if name not in self.found and len(self.found) >= self._limit:
            raise HostileArchiveError(f"{self._what}: more than {self._limit} translation units (hostile?)")
        self.found[name] = None

    def ops(self, rules: Rules) -> tuple[str, ...]:
        return tuple(dict.fromkeys(op for tu in self.found for op in rules.match(tu)))


def cubin_arch(elf: ElfFile) -> str:
    sm, specific = decode_sm(elf.abiversion, elf.flags)
    return f"sm_{sm}{'a' if specific else ''}"


def summarize_cubin(data, rules: Rules, limits: Limits, what: str, arch: str = "", budget=None) -> DeviceCode:
    """`data`: the cubin (bytes, or a `SpanStore` holding it). `names` is read lazily from
    `data`: consume it while `data` is open. `budget`: the wheel's `Budget`, if any."""
    budget = budget or Budget(limits=limits)
    elf = ElfFile(data, limits, what)
    strtab = elf.section(".strtab")
    tus = _Tus(limits, what, budget)
    if strtab is not None:
        for m in window_matches(_TU, context_windows(elf.chunks(strtab), OVERLAP)):
            tus.add(m.string, m)
    kernels = sum(1 for s in elf.sections if s.name.startswith(".text."))
    files = _line_files(elf, rules, limits, budget, what)
    ops = tuple(dict.fromkeys([*tus.ops(rules), *(op for f in files for op in rules.match(f))]))
    code = DeviceCode(
        "cubin", arch or cubin_arch(elf), tuple(tus.found), ops, kernel_count=kernels, line_files=files
    )
    code.names = _cubin_names(elf, code, rules, limits, what, budget)
    return code


def _line_files(elf: ElfFile, rules: Rules, limits: Limits, budget: Budget, what: str) -> tuple[str, ...]:
    """File and directory names in the cubin's line tables that name a retired op (each hit
    costs up to 8 KiB of look-around: counted as an item)."""
    found: dict[str, None] = {}
    for sec in elf.sections:
        if sec.name not in LINE_TABLES:
            continue
        for _, data, lo, hi in context_windows(elf.chunks(sec), 4096):
            find = rules.finder(data, lo, hi)
            pos = find.find(lo)
            while pos >= 0:
                budget.count(limits, what)
                first = pos - _FILE_NAME.match(data[max(0, pos - 4096) : pos][::-1]).end()
                end = _FILE_NAME.match(data, pos, pos + 4096).end()
                name = data[first:end].decode("latin-1")
                if rules.match(name) and len(found) < limits.max_hits_per_member:
                    found[name] = None
                pos = find.find(end)
    return tuple(found)


def _cubin_names(elf: ElfFile, code: DeviceCode, rules: Rules, limits: Limits, what: str, budget):
    """Kernels (`.text.<name>` sections) and defined symbols that may name a retired op; every
    kernel when the cubin's translation unit is retired. Each name once (by hash)."""
    seen: set[int] = set()

    def new(name: str) -> bool:
        if hash(name) in seen:
            return False
        if len(seen) >= limits.max_candidates:
            raise HostileArchiveError(f"{what}: more than {limits.max_candidates:,} candidate names")
        seen.add(hash(name))
        return True

    for s in elf.sections:
        name = s.name[6:]
        if s.name.startswith(".text.") and (code.tu_ops or rules.maybe(name.encode("latin-1"))) and new(name):
            yield name, s.size, "kernel"
    symtab = elf.section(".symtab")
    if symtab is None:
        return
    hits = HitStrings(elf, elf.linked(symtab), rules, limits, budget)
    if hits:
        for sym in elf.iter_symbols(symtab, hits, budget):
            name = sym.name.decode("latin-1")
            if sym.type != 3 and new(name):
                yield name, sym.size, "kernel" if sym.type == STT_FUNC else "symbol"


def summarize_ptx(data, rules: Rules, limits: Limits, what: str, arch: str = "", budget=None) -> DeviceCode:
    """`data`: the PTX text (bytes, or a `SpanStore` holding it), read twice: target and
    translation units first, then (lazily, in `names`) the entries and device functions. Every
    match is counted in the wheel's step budget."""
    budget = budget or Budget(limits=limits)
    target, count = None, 0
    tus = _Tus(limits, what, budget)
    for window in context_windows(_pieces(data), OVERLAP):
        if target is None:
            target = next((m.group(1) for m in window_matches(_PTX_TARGET, [window])), None)
        for m in window_matches(_TU, [window]):
            tus.add(m.string, m)
        entries = sum(1 for _ in window_matches(_PTX_ENTRY, [window]))
        budget.step(entries * MATCH_STEPS, what)
        count += entries
    code = DeviceCode(
        "ptx",
        arch or (target.decode().replace("sm_", "compute_") if target else "ptx"),
        tuple(tus.found),
        tus.ops(rules),
        kernel_count=count,
    )
    code.names = _ptx_names(data, code, rules, limits, what, budget)
    return code


def _ptx_names(data, code: DeviceCode, rules: Rules, limits: Limits, what: str, budget: Budget):
    """Entries (kernels) and defined device functions (`.func`, as a cubin's FUNC symbols count)
    that may name a retired op; all of them when the translation unit is retired."""
    for _, window, lo, hi in context_windows(_pieces(data), OVERLAP):
        for m in window_matches(_PTX_ENTRY, [(0, window, lo, hi)]):
            if code.tu_ops or rules.maybe(m.group(1)):
                yield m.group(1).decode("latin-1"), 0, "entry"
        funcs = 0
        for m in window_matches(_PTX_FUNC, [(0, window, lo, hi)]):
            funcs += 1
            if (code.tu_ops or rules.maybe(m.group(1))) and not _PTX_EXTERN.search(window, max(m.start() - 16, 0), m.start()):
                yield m.group(1).decode("latin-1"), 0, "function"
        budget.step(funcs * MATCH_STEPS, what)


def _pieces(data):
    if isinstance(data, SpanStore):
        return data.pieces(0, len(data))
    return ((at, data[at : at + WINDOW]) for at in range(0, len(data), WINDOW))
