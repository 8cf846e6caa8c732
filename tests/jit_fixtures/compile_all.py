"""Compile every shipped kernel instance and the runtime's fixture kernels for sm_90a with one
compiler, in parallel, and write what ptxas reported for each as JSON (tests/test_jit_compile.py).

    python compile_all.py nvrtc|nvcc OUT.json

Run in its own process: the NVRTC it compiles with is the first libnvrtc on sys.path (PYTHONPATH
names the one to check), and a process keeps the first it loads. The cache is $SLIM_KERNEL_CACHE_DIR.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jit_fixtures import instances as fx  # noqa: E402

from slim_kernel.jit import cache, compiler, precompile  # noqa: E402
from slim_kernel.jit.catalogue import all_instances  # noqa: E402
from slim_kernel.jit.resources import check_limits  # noqa: E402
from slim_kernel.jit.sources import declared_limits  # noqa: E402

ARCH = "sm_90a"


def main() -> int:
    name, out = sys.argv[1], Path(sys.argv[2])
    comp = compiler.get_compiler(name)
    instances = [inst for _, inst in all_instances()] + [make() for make in fx.ALL] + fx.k_fitted()
    results = precompile.compile_all([(inst, ARCH) for inst in instances], comp.name, os.cpu_count() or 1, None)
    report = {"compiler": comp.fingerprint(), "instances": {}}
    for inst in instances:
        why = results[(inst, ARCH)][1]
        if why is not None:
            report["instances"][inst.label] = {"error": why}
            continue
        entry = cache.get_entry(inst, ARCH, comp)
        usage = entry.usage
        report["instances"][inst.label] = {
            "usage": usage.to_dict() if usage else None, "limits": declared_limits(inst),
            "problems": check_limits(usage, declared_limits(inst)) if usage else ["no ptxas resource report"],
            "elf": entry.cubin[:4] == b"\x7fELF", "header_arch": entry.header["arch"]}
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
