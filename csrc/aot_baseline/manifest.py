"""Write the AOT-baseline instance manifest: every kernel instantiation the JIT backend can launch.

    python csrc/aot_baseline/manifest.py -o manifest.json [--subset]

Reads the kernel catalogue (``slim_kernel/jit/catalogue.py``, torch-free) of this source tree,
not an installed copy, so the baseline always compiles the instance list of the sources it is
built from: every configuration the routing tables may pick. Needs no torch and no GPU.
``--subset``: the first instance of each op, kernel family and output dtype (a few of the catalogue's
hundreds; ``selection`` counts both): what the main job builds by default, in about a minute; the size
report says so.

Format (read by csrc/aot_baseline/CMakeLists.txt with string(JSON)):
    {"format": 1, "selection": {"set": "full"|"subset", "instances", "catalogue", "rule", "per_op", "catalogue_per_op"},
     "instances": [{"op", "source", "entry", "signature", "key", "defines": [[name, value], ...]}]}
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


SUBSET_RULE = "the first instance of each op, kernel family and output dtype"


def _subset(pairs: list) -> list:
    """One instance per (op, kernel family, output dtype): every kernel body the baseline would ship."""
    seen, out = set(), []
    for op, inst in pairs:
        defines = dict(inst.defines)
        group = (op, defines.get("SK_FAMILY"), defines.get("SK_OUT_BF16"))
        if group not in seen:
            seen.add(group)
            out.append((op, inst))
    return out


def _count(pairs: list) -> dict[str, int]:
    counts: dict[str, int] = {}
    for op, _ in pairs:
        counts[op] = counts.get(op, 0) + 1
    return counts


def build_manifest(subset: bool = False) -> dict:
    sys.path.insert(0, str(ROOT / "python"))
    from slim_kernel.jit.catalogue import all_instances

    catalogue = all_instances()
    pairs = _subset(catalogue) if subset else catalogue
    rows = []
    for op, inst in pairs:
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
    selection = {"set": "subset" if subset else "full", "instances": len(rows), "catalogue": len(catalogue),
                 "rule": SUBSET_RULE if subset else "every instance of the catalogue",
                 "per_op": _count(pairs), "catalogue_per_op": _count(catalogue)}
    return {"format": FORMAT, "selection": selection, "instances": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", required=True, help="manifest JSON to write")
    parser.add_argument("--subset", action="store_true", help=f"only {SUBSET_RULE}")
    args = parser.parse_args()
    manifest = build_manifest(args.subset)
    text = json.dumps(manifest, indent=1) + "\n"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists() or out.read_text() != text:  # unchanged manifest: keep the mtime
        out.write_text(text)
    sel = manifest["selection"]
    print(f"{sel['instances']} of {sel['catalogue']} instances ({sel['set']}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
