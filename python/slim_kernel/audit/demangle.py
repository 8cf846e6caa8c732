"""Readable evidence: C++ names demangled in-process by the `cpp_demangle` package (the audit
extra), which gives c++filt's output. Matching never needs it (`rules` reads the mangled form),
so without it the audit finds the same ops and only shows evidence names mangled; the report
says which. No external tool is run.

Demangled output can grow exponentially with back-references (``S_``, ``T_``), so only names
of at most `MAX_NAME` characters with at most `MAX_REFS` references are demangled (every
retired-op name seen in real wheels has at most 5); others are shown mangled.
"""

from __future__ import annotations

import functools
import re

MAX_NAME = 4096
MAX_REFS = 16
_REF = re.compile(r"[ST][0-9A-Z]*_")


@functools.lru_cache(maxsize=1)
def _library():
    try:
        import cpp_demangle
    except ImportError:
        return None
    return cpp_demangle


def name() -> str:
    """What the report says about demangling."""
    if _library() is not None:
        return "cpp_demangle"
    return "none: names shown mangled (pip install 'slim-kernel[audit]' for cpp-demangle; matching does not need it)"


def demangle(raw: str) -> str:
    """`raw` demangled, or `raw` itself (not a mangled name, no demangler, or too costly)."""
    lib = _library()
    start = raw.find("_Z")
    if lib is None or start < 0 or len(raw) > MAX_NAME or len(_REF.findall(raw)) > MAX_REFS:
        return raw
    try:
        return raw[:start] + lib.demangle(raw[start:])
    except (ValueError, TypeError):
        return raw
