"""Compile one instance of every JIT configuration (at its largest M: the most registers and shared memory)
for each given arch with one compiler, in parallel, and write what ptxas reported as JSON
(tests/test_jit_compile_archs.py).

    python compile_archs.py nvrtc|nvcc OUT.json sm_100a,sm_120a

Run in its own process: the NVRTC it compiles with is the first libnvrtc on sys.path. The cache is
$SLIM_KERNEL_CACHE_DIR.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from slim_kernel.jit import cache, compiler, precompile
from slim_kernel.jit import catalogue as cat
from slim_kernel.jit.resources import check_limits
from slim_kernel.jit.sources import declared_limits


def largest_m_instances() -> list:
    """The last instance (largest M) of every configuration of every op, each once."""
    seen = []
    for op, named in cat.VARIANTS.items():
        for cfg in named.values():
            last = cat.instances(op, cfg)[-1:]
            seen += [inst for inst in last if inst not in seen]
    return seen


def main() -> int:
    name, out, archs = sys.argv[1], Path(sys.argv[2]), sys.argv[3].split(",")
    comp = compiler.get_compiler(name)
    instances = largest_m_instances()
    start = time.monotonic()
    results = precompile.compile_all([(inst, arch) for arch in archs for inst in instances], comp.name,
                                     os.cpu_count() or 1, None)
    report = {"compiler": comp.fingerprint(), "seconds": round(time.monotonic() - start, 1), "archs": {}}
    for arch in archs:
        got = report["archs"][arch] = {}
        for inst in instances:
            why = results[(inst, arch)][1]
            if why is not None:
                got[inst.label] = {"error": why}
                continue
            entry = cache.get_entry(inst, arch, comp)
            usage = entry.usage
            got[inst.label] = {"usage": usage.to_dict() if usage else None, "header_arch": entry.header["arch"],
                               "problems": check_limits(usage, declared_limits(inst)) if usage else
                               ["no ptxas resource report"]}
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
