"""Copy a flashinfer bundle (``../shared/device/make-bundle.py``) without sub-packages the GPU runs never import,
so the bundle, the anchors and the tracked tree fit the device's 64 MiB per command.

    python3 benchmark/trim_bundle.py .devwheels74 .devwheels74s flashinfer/moe_ep/kernel_src/

``flashinfer/moe_ep/kernel_src/`` (2.7 MB: vendored MoE expert-parallel kernels) is imported only by
``flashinfer.moe_ep`` and ``flashinfer.aot``, neither of which ``import flashinfer`` loads.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import sys
import zipfile
from pathlib import Path


def trim_wheel(src: Path, dst: Path, drop: tuple[str, ...]) -> int:
    """Rewrite ``src`` to ``dst`` without members under ``drop``, with a RECORD that matches; returns members dropped."""
    dropped = 0
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        record = []
        for info in zin.infolist():
            if info.filename == record_name:
                continue
            if info.filename.startswith(drop):
                dropped += 1
                continue
            data = zin.read(info)
            zout.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{info.filename},sha256={digest},{len(data)}")
        record.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(record) + "\n")
    return dropped


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst, drop = Path(argv[0]), Path(argv[1]), tuple(argv[2:])
    dst.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(src.glob("*.whl")):
        if wheel.name.startswith("flashinfer_python-"):
            n = trim_wheel(wheel, dst / wheel.name, drop)
            print(f"{wheel.name}: {n} members dropped, {wheel.stat().st_size >> 10} -> "
                  f"{(dst / wheel.name).stat().st_size >> 10} KiB")
        else:
            shutil.copy2(wheel, dst / wheel.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
