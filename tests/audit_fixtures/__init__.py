"""Negative controls for `slim-kernel audit`/`size`, built at test time (never committed).

- `host_lib`: a g++ shared library whose only traces are the ones asked for: an exported C++
  entry point, a static (.symtab-only) function, a TORCH_LIBRARY schema string or a plain
  binding-name string in .rodata, and/or raw fatbin bytes placed in `.nv_fatbin`.
- `nvcc_fatbin`: a fatbin (cubins, PTX or LTO IR) from CUDA source under a given `-compress-mode`
  (or `-no-compress`).
- `make_wheel`: a wheel assembled with zipfile (dist-info included).
- hostile archives: zip bombs, traversal, symlinks, overlapping members, lying sizes.
"""

from __future__ import annotations

import hashlib
import io
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)
GXX = shutil.which("g++")

SCHEMAS = {
    "bmm_fp8": "bmm_fp8(Tensor A, Tensor B, Tensor! D, Tensor A_scale, Tensor B_scale, "
    "Tensor workspace_buffer, int cublas_handle) -> ()",
    "dsv3_router_gemm": "dsv3_router_gemm(Tensor! output, Tensor mat_a, Tensor mat_b) -> ()",
    "dsv3_fused_a_gemm": "dsv3_fused_a_gemm(Tensor! output, Tensor mat_a, Tensor mat_b) -> ()",
    "dsv4_router_gemm": "dsv4_router_gemm(Tensor! output, Tensor mat_a, Tensor mat_b) -> ()",
}

# Device code: kernels named like ops (extern "C" and mangled templates), and a TU marker
# (an internal-linkage device variable makes nvcc emit _INTERNAL_<hash>_<n>_<file>_cu names).
KERNELS_CU = r"""
extern "C" __global__ void {op}_kernel(float* o, const float* a) {{ o[threadIdx.x] = a[threadIdx.x] * 2.f; }}
template <int N> __global__ void {op}_tile(float* o) {{ o[threadIdx.x] = N; }}
template __global__ void {op}_tile<4>(float*);
"""
NEUTRAL_CU = r"""
namespace { __device__ int counter; }
__global__ void gemm_kernel(int* p) { atomicAdd(&counter, *p); }
"""


def _run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")


def _cxx_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def host_lib(
    workdir: Path,
    name: str,
    *,
    exported: list[str] = (),
    static: list[str] = (),
    schemas: list[str] = (),
    strings: list[str] = (),
    fatbin: bytes | None = None,
    strip: bool = False,
) -> Path:
    """Build lib<name>.so with g++ carrying exactly the requested traces."""
    lines = ["namespace at { struct Tensor { void* impl; }; }", "static volatile int sink;"]
    for op in exported:  # exported C++ entry point with an aten-like signature
        lines.append(
            f'__attribute__((visibility("default"))) void {op}(at::Tensor& out, const at::Tensor& a, '
            "const at::Tensor& b) { sink = sink + 1; }"
        )
    for op in static:  # defined, not exported: visible in .symtab only (unless stripped)
        lines.append(f"__attribute__((noinline, used)) static void {op}_impl() {{ sink = sink + 2; }}")
    texts = [SCHEMAS[s] if s in SCHEMAS else s for s in schemas] + list(strings)
    for i, text in enumerate(texts):
        lines.append(f"__attribute__((used)) static const char text_{i}[] = {_cxx_string(text)};")
    if texts:
        lines.append('extern "C" __attribute__((visibility("default"))) const char* registry(int i) {')
        lines.append(
            "  static const char* all[] = {" + ", ".join(f"text_{i}" for i in range(len(texts))) + "};"
        )
        lines.append(f"  return all[i % {len(texts)}];" + " }")
    if fatbin is not None:
        data = ", ".join(str(b) for b in fatbin)
        lines.append(
            '__attribute__((section(".nv_fatbin"), aligned(8), used)) '
            f"static const unsigned char fatbin_blob[] = {{{data}}};"
        )
    lines.append('extern "C" __attribute__((visibility("default"))) int plain_entry() { return sink; }')
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / f"{name}.cpp"
    src.write_text("\n".join(lines) + "\n")
    out = workdir / f"lib{name}.so"
    cmd = [GXX, "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-o", str(out), str(src)]
    _run(cmd + (["-s"] if strip else []), workdir)
    return out


def nvcc_fatbin(
    workdir: Path,
    filename: str,
    source: str,
    *,
    mode: str | None = None,
    arches: tuple[str, ...] = ("sm_90a",),
    code: str = "sass",
) -> bytes:
    """Compile `source` (saved as `filename`, which names the TU) to a fatbin.

    mode: a `-compress-mode` value (size/speed/balance/default/none) or "no-compress";
    code: "sass" (cubins), "ptx", "both" or "lto" (LTO IR, as `code=lto_90`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / filename
    src.write_text(source)
    key = hashlib.sha1(f"{filename}{source}{mode}{arches}{code}".encode()).hexdigest()[:10]
    out = workdir / f"{key}.fatbin"
    cmd = [NVCC, "-fatbin", "-o", str(out), str(src)]
    for arch in arches:
        num = arch.split("_", 1)[1]
        targets = {"sass": arch, "ptx": f"compute_{num}", "both": f"[{arch},compute_{num}]", "lto": f"lto_{num}"}[code]
        cmd += ["-gencode", f"arch=compute_{num},code={targets}"]
    if mode == "no-compress":
        cmd.append("-no-compress")
    elif mode:
        cmd.append(f"-compress-mode={mode}")
    _run(cmd, workdir)
    return out.read_bytes()


def kernels_source(op: str) -> str:
    return KERNELS_CU.format(op=op)


def make_wheel(
    path: Path,
    members: dict[str, bytes],
    *,
    dist: str = "demo",
    version: str = "0.1",
    metadata_extra: str = "",
) -> Path:
    """Assemble a wheel (deflated members plus dist-info) with zipfile."""
    info = f"{dist}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n\n{metadata_extra}\n"
    ).encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\nTag: py3-none-any\n"
    )
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


class Unseekable(io.RawIOBase):
    """A write-only stream: zipfile then writes every member's sizes after its data (data
    descriptors, as jars and TorchScript archives have them)."""

    def __init__(self):
        self.buf = io.BytesIO()

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        return self.buf.write(b)


# -- hostile archives ----------------------------------------------------------------------
def zip_with_info(
    path: Path, infos: list[tuple[zipfile.ZipInfo, bytes]], method: int = zipfile.ZIP_DEFLATED
) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for info, data in infos:
            zf.writestr(info, data, compress_type=method)
    return path


def symlink_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = 0o120777 << 16
    return info


def _central_entries(raw: bytes) -> list[int]:
    eocd = raw.rfind(b"PK\x05\x06")
    count, _, cd_off = struct.unpack_from("<HII", raw, eocd + 10)
    offs, at = [], cd_off
    for _ in range(count):
        offs.append(at)
        n, m, k = struct.unpack_from("<HHH", raw, at + 28)
        at += 46 + n + m + k
    return offs


def overlapping_zip(path: Path) -> Path:
    """Two members whose central entries point at the same local data."""
    zip_with_info(
        path, [(zipfile.ZipInfo("a.py"), b"x = 1\n" * 10), (zipfile.ZipInfo("b.py"), b"x = 1\n" * 10)]
    )
    raw = bytearray(path.read_bytes())
    first, second = _central_entries(bytes(raw))
    struct.pack_into("<I", raw, second + 42, struct.unpack_from("<I", raw, first + 42)[0])
    path.write_bytes(bytes(raw))
    return path


def lying_size_zip(
    path: Path, name: str, data: bytes, declared: int, method: int = zipfile.ZIP_DEFLATED
) -> Path:
    """A member whose headers declare another unpacked size than its data has."""
    zip_with_info(path, [(zipfile.ZipInfo(name), data)], method)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 22, declared)  # local header uncompressed size
    for off in _central_entries(bytes(raw)):
        struct.pack_into("<I", raw, off + 24, declared)
    path.write_bytes(bytes(raw))
    return path


def fatbin_header(fat_size: int) -> bytes:
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, fat_size)


def fatbin_entry(
    kind: int,
    payload: bytes,
    *,
    header_size: int = 64,
    flags: int = 0x11,
    sm: int = 90,
    csize: int = 0,
    usize: int = 0,
    stored: int | None = None,
    pad: bool = True,
) -> bytes:
    """One hand-made fatbin entry (for malformed-input tests and fuzz seeds); `pad=False`
    leaves out the header extension (for a header size that lies)."""
    stored = len(payload) if stored is None else stored
    head = struct.pack(
        "<HHIQIIHHIIIQQQ", kind, 0x101, header_size, stored, csize, 0, 8, 1, sm, 0, 0, flags, 0, usize
    )
    return head + (b"\x00" * (header_size - 64) if pad else b"") + payload


def tiny_elf(
    kernels: list[str], *, machine: int = 190, extra_symbols: list[str] = (), flags: int = 0x5A04
) -> bytes:
    """A small, valid ELF64 (a cubin when machine=190) with one `.text.<name>` section and one
    FUNC symbol per kernel, plus OBJECT symbols: built without nvcc, for fuzz seeds and size tests."""
    shstr = bytearray(b"\0")
    strtab = bytearray(b"\0")

    def add(table: bytearray, s: str) -> int:
        off = len(table)
        table.extend(s.encode() + b"\0")
        return off

    sections = [(0, 0, b"", 0, 0, 0)]  # (name_off, type, data, link, info, entsize)
    texts = []
    for k in kernels:
        texts.append((add(shstr, f".text.{k}"), k))
    names = [add(shstr, n) for n in (".shstrtab", ".strtab", ".symtab")]
    syms = [struct.pack("<IBBHQQ", 0, 0, 0, 0, 0, 0)]
    for i, (_, k) in enumerate(texts):
        syms.append(struct.pack("<IBBHQQ", add(strtab, k), (1 << 4) | 2, 0, 4 + i, 0, 128))
    for s in extra_symbols:
        syms.append(struct.pack("<IBBHQQ", add(strtab, s), (1 << 4) | 1, 0, 1, 0, 4))
    sections.append((names[0], 3, bytes(shstr), 0, 0, 0))
    sections.append((names[1], 3, bytes(strtab), 0, 0, 0))
    sections.append((names[2], 2, b"".join(syms), 2, 1, 24))
    for name_off, _ in texts:
        sections.append((name_off, 1, b"\x00" * 128, 0, 0, 0))
    body = bytearray(b"\0" * 64)
    offsets = []
    for _, _, data, _, _, _ in sections:
        while len(body) % 8:
            body.append(0)
        offsets.append(len(body))
        body.extend(data)
    while len(body) % 8:
        body.append(0)
    shoff = len(body)
    for (name, typ, data, link, info, ent), off in zip(sections, offsets):
        body.extend(
            struct.pack("<IIQQQQIIQQ", name, typ, 0, 0, off if typ else 0, len(data), link, info, 8, ent)
        )
    ident = b"\x7fELF\x02\x01\x01\x41\x08" + b"\0" * 7
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 1, machine, 1, 0, 0, shoff, flags, 64, 0, 0, 64, len(sections), 1
    )
    body[:64] = header
    return bytes(body)


def fatbin_of(cubins: list[tuple[bytes, int, int]]) -> bytes:
    """A plain fatbin container from (cubin, sm, flags) triples."""
    entries = b""
    for cubin, sm, flags in cubins:
        padded = cubin + b"\0" * (-len(cubin) % 8)
        entries += fatbin_entry(2, padded, sm=sm, flags=flags)
    return fatbin_header(len(entries)) + entries


def tiny_tar(name: str, data: bytes) -> bytes:
    """An uncompressed tar holding one file."""
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()
