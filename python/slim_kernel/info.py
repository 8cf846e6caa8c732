"""`slim-kernel info`: versions, devices, and per op which backends can serve and why not."""

from __future__ import annotations

import json
from importlib import metadata


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def collect() -> dict:
    import torch

    from . import __version__, registry
    from .ops import OPS

    devices = [torch.device("cpu")]
    if torch.cuda.is_available():
        devices += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    report = {
        "slim_kernel": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "flashinfer": _version("flashinfer-python"),
        "devices": [],
    }
    for dev in devices:
        entry = {"device": str(dev)}
        if dev.type == "cuda":
            entry["name"] = torch.cuda.get_device_name(dev)
            entry["capability"] = "{}.{}".format(*torch.cuda.get_device_capability(dev))
        entry["ops"] = {
            op: [{"backend": spec.backend.value, "eligible": reason is None, "reason": reason, "note": spec.note}
                 for spec, reason in registry.explain(op, dev)]
            for op in OPS
        }
        report["devices"].append(entry)
    from .jit import runtime_info

    report["jit"] = runtime_info()
    return report


def run(args) -> int:
    report = collect()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"slim-kernel {report['slim_kernel']}  torch {report['torch']} (CUDA {report['torch_cuda']})  "
          f"flashinfer {report['flashinfer'] or 'not installed'}")
    for key, value in report["jit"].items():
        print(f"  jit.{key}: {value}")
    for dev in report["devices"]:
        extra = f"  {dev['name']} (SM {dev['capability']})" if "name" in dev else ""
        print(f"\n{dev['device']}{extra}")
        for op, rows in dev["ops"].items():
            print(f"  {op}")
            for i, row in enumerate(rows, 1):
                state = "eligible" if row["eligible"] else f"no: {row['reason']}"
                print(f"    {i}. {row['backend']:<10} {state}   [{row['note']}]")
    return 0
