"""Write the AOT-baseline instance manifest: every kernel instantiation the JIT backend can launch.

    python csrc/aot_baseline/manifest.py -o manifest.json

Reads the kernel catalogue (``slim_kernel/jit/catalogue.py``, torch-free) of this source tree,
not an installed copy, so the baseline always compiles the instance list of the sources it is
built from: every configuration the routing tables may pick. Needs no torch and no GPU.

Format (read by csrc/aot_baseline/CMakeLists.txt with string(JSON)):
    {"format": 1, "instances": [{"op", "source", "entry", "signature", "key", "defines": [[name, value], ...]}]}
``key`` ("SK_NT=1,SK_RT=4,...") is what the module's host entry points take to pick an instance.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORMAT = 1


def instance_key(defines) -> str:
    """The lookup key of one instance (also built by tests/test_aot_baseline_gpu.py)."""
    return ",".join(f"{name}={value}" for name, value in defines)


def build_manifest() -> dict:
    sys.path.insert(0, str(ROOT / "python"))
    from slim_kernel.jit.catalogue import all_instances

    rows = []
    for op, inst in all_instances():
        if Path(inst.source).is_absolute():
            raise SystemExit(f"manifest: instance source {inst.source!r} is not a shipped kernel under "
                             "slim_kernel/jit/kernels/")
        for name, value in inst.defines:
            if not isinstance(value, int) and not str(value).replace("_", "").isalnum():
                raise SystemExit(f"manifest: define {name}={value!r} is not an int or identifier")
        rows.append({"op": op, "source": inst.source,
                     "entry": inst.entry, "signature": inst.signature, "key": instance_key(inst.defines),
                     "defines": [[name, value] for name, value in inst.defines]})
    if not rows:
        raise SystemExit("manifest: slim_kernel.jit.catalogue.all_instances() returned no instances")
    return {"format": FORMAT, "instances": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", required=True, help="manifest JSON to write")
    args = parser.parse_args()
    manifest = build_manifest()
    text = json.dumps(manifest, indent=1) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != text:  # unchanged manifest: keep the mtime
        out.write_text(text)
    print(f"{len(manifest['instances'])} instances -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
