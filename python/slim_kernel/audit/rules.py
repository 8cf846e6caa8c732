"""Which op names are retired, and how a name or string is matched against them.

An op pattern is an exact name (``bmm_fp8``) or a glob with a literal prefix (``dsv3_*``).
A name matches where the op appears as an identifier word: not preceded or followed by a letter
or digit (``_`` and ``::`` are boundaries, so ``flashinfer::bmm_fp8::Layout``,
``dsv3_router_gemm_float_out.cu`` and ``_INTERNAL_..._29_dsv3_router_gemm_..`` match, while
``dsv4_router_gemm`` and ``xbmm_fp8`` do not). In an Itanium-mangled name (anything holding
``_Z``: symbols, kernel names, ``$kernel$_Z...``) each source name is also read in its
``<length><name>`` form, so ``_Z16dsv3_router_gemmRN2at6TensorE`` and template arguments
match without a demangler. Exact ops win over globs.

A string found in a library's data is a finding when it is a registration (an op schema, a
bare or call-form name such as a binding name, a kernel or symbol name, a source path) and a
mention when the name only sits inside a longer text (an error message, an embedded source
string) or is another library's qualified op name (``flashinfer::bmm_fp8``): see `string_kind`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..names import RETIRED_PATTERNS

DEFAULT_RETIRED = RETIRED_PATTERNS

_WORD = "A-Za-z0-9"
_PATTERN_OK = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\*?$")
# A TorchScript/TORCH_LIBRARY schema: [ns::]name[.overload](args) -> returns
_SCHEMA = re.compile(r"^(?:[A-Za-z_]\w*::)?([A-Za-z_]\w*)(?:\.\w+)?\((.*)\)\s*->\s*\S.*$", re.S)
# <length><source name> inside a mangled name (searched from the end of the previous name, so
# a length right after a name ending in a digit, as in "3__467_GLOBAL__N_...", is whole)
_DIGITS = re.compile(r"[0-9]+")  # a length: the digit run is read once, then what follows it
_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_$")
_IDENT = re.compile(r"[A-Za-z0-9_$]+")
# another library's op named by its qualified name: ns::op, ns.op (the op ends the string)
_QUALIFIED = re.compile(r"^(?:[A-Za-z_]\w*(?:::|\.))+([A-Za-z_]\w*)$")
# a function signature or call form: [ns::]name(...
_CALL = re.compile(r"^(?:[A-Za-z_]\w*::)*[A-Za-z_]\w*\(")


def parse_retired(values: list[str] | None) -> tuple[str, ...]:
    """`--retired` values (repeatable, comma-separated) -> patterns; None -> defaults."""
    if not values:
        return DEFAULT_RETIRED
    ops: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if not item:
                continue
            if not _PATTERN_OK.match(item):
                raise ValueError(
                    f"--retired: {item!r} is not an op name or a prefix glob like 'dsv3_*' "
                    "(letters, digits and '_', optionally ending in '*')"
                )
            ops.append(item)
    if not ops:
        raise ValueError("--retired: no op names given")
    return tuple(dict.fromkeys(ops))


@dataclass(frozen=True)
class Rules:
    patterns: tuple[str, ...] = DEFAULT_RETIRED
    _exact: re.Pattern = field(init=False, repr=False, compare=False)
    _glob: re.Pattern | None = field(init=False, repr=False, compare=False)
    _tokens: tuple[bytes, ...] = field(init=False, repr=False, compare=False)
    _words: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        exact = sorted((p for p in self.patterns if not p.endswith("*")), key=len, reverse=True)
        globs = [p[:-1] for p in self.patterns if p.endswith("*")]
        left, right = f"(?<![{_WORD}])", f"(?![{_WORD}])"
        never = "(?!x)x"
        exact_re = "|".join(map(re.escape, exact)) or never
        object.__setattr__(self, "_exact", re.compile(f"{left}({exact_re}){right}"))
        glob_re = "|".join(re.escape(g) for g in globs)
        object.__setattr__(
            # a name ending in "_" is a prefix, not an op (a bare "dsv3_" names nothing)
            self, "_glob", re.compile(f"{left}((?:{glob_re})[A-Za-z0-9_]*(?<!_)){right}") if globs else None
        )
        # literals every match contains; a literal containing a shorter one is redundant
        lits = {p.rstrip("*").encode() for p in self.patterns}
        tokens = tuple(sorted(t for t in lits if not any(o != t and o in t for o in lits)))
        object.__setattr__(self, "_tokens", tokens)
        object.__setattr__(self, "_words", tuple(t.decode() for t in tokens))

    # -- cheap byte-level prefilter (before demangling) -----------------------------------
    def finder(self, data, lo: int = 0, hi: int | None = None) -> Finder:
        """Finds, in `data`, the literals every match must contain (`bytes.find`, far faster
        than a regex over hundreds of MB), starting in [lo, hi)."""
        return Finder(data, self._tokens, lo, len(data) if hi is None else hi)

    @property
    def longest_literal(self) -> int:
        return max((len(t) for t in self._tokens), default=0)

    def maybe(self, data: bytes) -> bool:
        return any(tok in data for tok in self._tokens)

    # -- exact matching --------------------------------------------------------------------
    def match(self, text: str) -> list[str]:
        """Retired ops named in `text`, or in a source name of the mangled name it holds."""
        mangled = text.find("_Z")
        if mangled < 0:
            return list(dict.fromkeys(self._match_words(text)))
        found = self._match_words(text[:mangled])  # a prefix such as "$kernel$" or "kernel "
        for name in source_names(text, mangled):
            if any(tok in name for tok in self._words):
                found += self._match_words(name)
        return list(dict.fromkeys(found))

    def _match_words(self, text: str) -> list[str]:
        """Retired ops appearing as identifier words in `text`, exact ops before glob matches."""
        found: list[str] = []
        spans: list[tuple[int, int]] = []
        for m in self._exact.finditer(text):
            found.append(m.group(1))
            spans.append(m.span(1))
        if self._glob is not None:
            for m in self._glob.finditer(text):
                start = m.start(1)
                if any(a <= start < b for a, b in spans):
                    continue
                found.append(m.group(1))
        return found

    def op_named(self, name: str) -> str | None:
        """The op if `name` is exactly a retired op name (or matches a glob in full)."""
        hits = self.match(name)
        return name if name in hits else None

    def schema_op(self, text: str) -> str | None:
        """The retired op whose TORCH_LIBRARY schema `text` is, if it is one."""
        m = _SCHEMA.match(text.strip())
        return self.op_named(m.group(1)) if m else None

    def string_kind(self, text: str) -> tuple[str, list[str]]:
        """What a string from a library's data says: ("schema", [op]) for an op schema,
        ("name", ops) for a registration-like string (one token, or a call form
        ``op(...)``), ("mention", ops) for a name inside a longer text or another library's
        qualified op name, ("", []) when it names no retired op."""
        op = self.schema_op(text)
        if op:
            return "schema", [op]
        ops = self.match(text)
        if not ops:
            return "", []
        token = text.strip()
        if not any(c.isspace() for c in token):
            qualified = _QUALIFIED.match(token)
            if qualified and self.op_named(qualified.group(1)):
                return "mention", ops
            return "name", ops
        return ("name" if _CALL.match(token) else "mention"), ops

    def to_json(self) -> list[str]:
        return list(self.patterns)


def source_names(text: str, at: int = 0):
    """The ``<length><name>`` source names of the mangled name starting at `at`, left to right,
    in linear time: a name's own bytes are skipped (digits inside it are not lengths), and the
    end of the identifier run a length points into is found once per run."""
    run_end = -1
    while True:
        m = _DIGITS.search(text, at)
        if m is None:
            return
        start = m.end()
        if start >= len(text) or text[start] not in _NAME_START:
            at = start  # digits not followed by a name: skipped whole (no rescan of the run)
            continue
        n = int(m.group()[:7])
        if start >= run_end:
            run_end = _IDENT.match(text, start).end()
        if start + n <= run_end:
            yield text[start : start + n]
            at = start + n
        else:
            at = start


class Finder:
    """`find(at)`: the first literal occurrence starting in [at, hi), or -1. Each literal's next
    occurrence is cached, so a scan that skips ahead (past a string or a line) reads every
    byte once per literal: linear in the data, whatever the number of hits."""

    def __init__(self, data, tokens: tuple[bytes, ...], lo: int, hi: int):
        self._data = data
        self._tokens = tokens
        self._ends = [min(len(data), hi + len(tok) - 1) for tok in tokens]
        self._next = [data.find(tok, lo, end) for tok, end in zip(tokens, self._ends)]

    def find(self, at: int) -> int:
        best = -1
        for i, n in enumerate(self._next):
            if 0 <= n < at:
                n = self._next[i] = self._data.find(self._tokens[i], at, self._ends[i])
            if n >= 0 and (best < 0 or n < best):
                best = n
        return best

    def last(self, lo: int, hi: int) -> int:
        """The last literal occurrence starting in [lo, hi) (-1 if none)."""
        best = -1
        for tok in self._tokens:
            best = max(best, self._data.rfind(tok, lo, min(len(self._data), hi + len(tok) - 1)))
        return best
