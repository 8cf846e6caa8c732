"""Static per-instance kernel statistics, no GPU: registers, spills and SASS instruction counts.

    python benchmark/sass_stats.py --op dsv3_router_gemm --variants narrow_r2c72,ring_s8 --ms 1,5,8
    python benchmark/sass_stats.py --op dsv3_router_gemm --variants narrow_r2c72 --ms 5 --extra path/to/tiny.so

Each instance is compiled for sm_90a through the JIT cache (set SLIM_KERNEL_CACHE_DIR for a
private one) and disassembled with ``cuobjdump -sass`` (pip ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``,
both in the ``test`` extra). Columns:
registers and spill bytes from ptxas (for ``--extra``: local-memory bytes), the SASS instruction count and the counts of the classes
that separate designs on this hardware (FFMA, integer/logic, loads, shuffles, branches). The
instruction count is static: loops count once, so compare straight-line bodies, or bodies with the
same loop structure. ``--extra`` adds every kernel of a compiled binary (a cubin, or an
anchor's .so: sglang's JIT modules) with the same columns, for side-by-side reading; SASS numbers
are a hypothesis generator, the decode-step benchmark decides.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python"))

from bench_audit import find_cuobjdump  # noqa: E402 (on PATH, else the nvidia-cuda-cuobjdump wheel's)

from slim_kernel.audit.demangle import demangle  # noqa: E402
from slim_kernel.jit import (
    cache,  # noqa: E402
    rules,  # noqa: E402
)
from slim_kernel.jit import catalogue as cat  # noqa: E402

_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)[.\s;]")
_FUNC = re.compile(r"Function\s*:\s*(\S+)")
_RES = re.compile(r"Function (\S+):\s*REG:(\d+) .*?LOCAL:(\d+)", re.S)
CLASSES = {"ffma": ("FFMA",), "int": ("IMAD", "IADD3", "LOP3", "SHF", "LEA", "ISETP", "SEL", "MOV", "VIADD", "PRMT"),
           "loads": ("LDG", "LDS", "LDSM", "LDGSTS"), "shfl": ("SHFL",), "branch": ("BRA", "BSSY", "BSYNC")}


def cuobjdump() -> str:
    found = find_cuobjdump()
    if found is None:
        raise SystemExit("cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")
    return found


def sass_functions(binary: str) -> dict[str, collections.Counter]:
    """function name -> Counter of SASS opcodes (predicates and modifiers stripped)."""
    return {name: collections.Counter(ops) for name, ops in sass_sequences(binary).items()}


def sass_sequences(binary: str) -> dict[str, list[str]]:
    """function name -> its SASS opcodes in code order (predicates and modifiers stripped)."""
    proc = subprocess.run([cuobjdump(), "-sass", binary], capture_output=True, text=True)
    if proc.returncode:  # e.g. no nvdisasm next to it (pip nvidia-cuda-nvdisasm), which -sass runs
        raise SystemExit(f"cuobjdump -sass {binary} failed: {proc.stderr.strip()[-300:]}")
    text = proc.stdout
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        f = _FUNC.search(line)
        if f:
            current = out.setdefault(f.group(1), [])
            continue
        m = _INSN.match(line)
        if m and current is not None:
            current.append(m.group(1))
    return out


def register_usage(binary: str) -> dict[str, tuple[int, int]]:
    """function name -> (registers, local-memory bytes) from ``cuobjdump -res-usage``."""
    text = subprocess.run([cuobjdump(), "-res-usage", binary], capture_output=True, text=True, check=True).stdout
    return {name: (int(regs), int(local)) for name, regs, local in _RES.findall(text)}


def row(name: str, regs, spills, ops: collections.Counter) -> list:
    total = sum(v for k, v in ops.items() if k != "NOP")
    return [name, regs, spills, total] + [sum(ops[o] for o in group) for group in CLASSES.values()]


def instance_sass(op: str, cfg, m: int, out_dtype: str, compiler: str):
    """(cache entry, SASS opcodes in code order) of ``cfg``'s instance for M (the tuned shape)."""
    entry = cache.get_entry(cfg.instance(op, m, out_dtype), "9.0a", compiler)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(entry.cubin)
        return entry, next(iter(sass_sequences(path).values()))


def instance_rows(op: str, variants: list[str], ms: list[int], out_dtype: str, compiler: str) -> list[list]:
    rows = []
    for name in variants:
        cfg = cat.VARIANTS[op].get(name) or rules.parse_config(name)
        for m in ms:
            if not cat.variant_serves(cfg, op, m):
                continue
            entry, ops = instance_sass(op, cfg, m, out_dtype, compiler)
            usage = entry.usage
            rows.append(row(f"{name} M={m}", usage.registers if usage else "?",
                            usage.spill_bytes if usage else "?", collections.Counter(ops)))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default=cat.ROUTER, choices=list(cat.VARIANTS))
    ap.add_argument("--variants", action="append", default=[],
                    help="comma-separated VARIANTS names, or one kernel=... config (repeatable)")
    ap.add_argument("--ms", default="1,5,8", help="comma-separated M values")
    ap.add_argument("--out-dtype", default=None, help="default: the op's first output dtype")
    ap.add_argument("--compiler", default="nvcc", choices=("nvcc", "nvrtc"))
    ap.add_argument("--extra", action="append", default=[], help="a cubin or .so whose kernels are listed too")
    args = ap.parse_args(argv)
    variants = [v for arg in args.variants for v in ([arg] if arg.startswith("kernel=") else arg.split(",")) if v]
    try:
        ms = [int(m) for m in args.ms.split(",") if m]
    except ValueError:
        ap.error(f"--ms: want comma-separated integers, got {args.ms!r}")
    out_dtype = args.out_dtype or cat.OUT_DTYPES[args.op][0]
    if out_dtype not in cat.OUT_DTYPES[args.op]:
        ap.error(f"--out-dtype: {args.op} has {', '.join(cat.OUT_DTYPES[args.op])}")
    rows = instance_rows(args.op, variants, ms, out_dtype, args.compiler)
    for binary in args.extra:
        functions = sass_functions(binary)
        usage = register_usage(binary)
        names = {f: demangle(f) for f in functions}
        for name, ops in sorted(functions.items(), key=lambda kv: names[kv[0]]):
            regs, local = usage.get(name, ("?", "?"))
            rows.append(row(names[name][:100], regs, local, ops))
    header = ["instance", "regs", "spill B", "SASS"] + list(CLASSES)
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for r in [header] + rows:
        print("  ".join(str(v).rjust(w) if i else str(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
