"""LTO IR fatbin entries (`code=lto_90`): read through nvJitLink in its own process, or listed
unreadable with the reason when nvJitLink is missing, fails, hangs or the time share is spent."""

from __future__ import annotations

import json
import os
import struct
import sys
import time

import pytest
from audit_fixtures import GXX, NEUTRAL_CU, NVCC, host_lib, kernels_source, make_wheel, nvcc_fatbin

from slim_kernel.audit import ltoir, ltoir_child
from slim_kernel.audit.findings import audit_result
from slim_kernel.audit.limits import Budget, Limits
from slim_kernel.audit.rules import Rules
from slim_kernel.audit.runner import scan_wheel
from slim_kernel.audit.scan import ScanContext
from slim_kernel.cli import main

needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc")


def _nvjitlink() -> bool:
    try:
        from cuda.bindings import nvjitlink

        nvjitlink.version()
        return True
    except Exception:
        return False


# CI installs the audit extra: there a missing nvJitLink fails these tests instead of skipping them
STRICT = os.environ.get("CI", "").lower() in ("1", "true", "yes")
needs_nvjitlink = pytest.mark.skipif(
    not STRICT and not _nvjitlink(), reason="needs nvidia-nvjitlink with cuda-bindings"
)


def audit(capsys, wheel) -> tuple[int, dict]:
    rc = main(["audit", "--json", "--no-progress", str(wheel)])
    return rc, json.loads(capsys.readouterr().out)["wheels"][0]


@pytest.fixture(scope="module")
def lto(tmp_path_factory):
    """Fatbins holding only LTO IR (sm_90 and sm_100), uncompressed and compressed (nvcc then
    also obfuscates them): a retired kernel and a neutral one."""
    work = tmp_path_factory.mktemp("lto")
    if NVCC is None:
        pytest.skip("needs nvcc")
    out = {}
    for mode in ("no-compress", "size", "speed"):
        for name, source in (("retired", kernels_source("dsv3_router_gemm")), ("neutral", NEUTRAL_CU)):
            out[name, mode] = nvcc_fatbin(
                work, f"{name}.cu", source, mode=mode, arches=("sm_90", "sm_100"), code="lto"
            )
    return out


@needs_nvcc
@needs_nvjitlink
@pytest.mark.parametrize("mode", ["no-compress", "size", "speed"])
def test_lto_ir_kernels_are_read(tmp_path, capsys, lto, mode):
    wheel = make_wheel(tmp_path / "w.whl", {"pkg/k.fatbin": lto["retired", mode]})
    rc, out = audit(capsys, wheel)
    assert rc == 1 and out["ops_found"] == ["dsv3_router_gemm"], out
    assert not out["unreadable"], out["unreadable"]
    evidence = " ".join(f["evidence"] for f in out["findings"])
    assert "dsv3_router_gemm_kernel" in evidence and "dsv3_router_gemm_tile" in evidence, evidence
    assert out["layers"]["ltoir-entry"]["scanned"].startswith("2 LTO IR fatbin entries and 0 LTO IR files, 2 linked")

    rc, out = audit(capsys, make_wheel(tmp_path / "n.whl", {"pkg/k.fatbin": lto["neutral", mode]}))
    assert rc == 0 and out["clean"] and not out["unreadable"], out


@needs_nvcc
@needs_nvjitlink
@pytest.mark.skipif(GXX is None, reason="needs g++")
def test_lto_ir_in_a_host_library(tmp_path, capsys, lto):
    """Embedded in `.nv_fatbin` of a library with no other trace: found in the ltoir-entry layer."""
    lib = host_lib(tmp_path, "ops", fatbin=lto["retired", "size"], strip=True)
    rc, out = audit(capsys, make_wheel(tmp_path / "h.whl", {"pkg/_ops.so": lib.read_bytes()}))
    assert rc == 1 and out["ops_found"] == ["dsv3_router_gemm"], out
    layers = {f["layer"] for f in out["findings"]}
    assert layers == {"ltoir-entry"}, out["findings"]
    assert {a for f in out["findings"] for a in f["archs"]} == {"sm_90", "sm_100"}, out["findings"]


def _fake_child(body: str) -> list[str]:
    """A stand-in for the nvJitLink process: `body` runs after the READY frame is written."""
    ready = struct.pack("<BQ", ltoir_child.READY, 4) + b"fake"
    code = f"import sys, time, struct; out = sys.stdout.buffer; out.write({ready!r}); out.flush()\n{body}"
    return [sys.executable, "-c", code]


UNAVAILABLE = [
    sys.executable,
    "-c",
    "import sys, struct; m = b'ImportError: no nvJitLink'; "
    f"sys.stdout.buffer.write(struct.pack('<BQ', {ltoir_child.UNAVAILABLE}, len(m)) + m)",
]


def judged(wheel, linker=None, **limits) -> dict:
    """The audit's JSON object for `wheel`, under `limits`, with `linker` as the nvJitLink process."""
    ctx = ScanContext(Rules(), Limits(**limits))
    old = ltoir.LINKER
    ltoir.LINKER = linker or ltoir.Linker()
    try:
        return audit_result(scan_wheel(str(wheel), ctx, jobs=1, progress=False), ctx.rules)
    finally:
        ltoir.LINKER = old


@needs_nvcc
@pytest.mark.parametrize(
    "command, needle",
    [
        (UNAVAILABLE, "pip install nvidia-nvjitlink"),
        ([sys.executable, "-c", "import sys; sys.exit(3)"], "did not start"),
        (_fake_child("sys.stdin.buffer.read(1); sys.exit(9)"), "process ended on it (exit code 9"),
        (_fake_child("time.sleep(60)"), "took longer than 1 s"),
        (
            _fake_child(
                f"sys.stdin.buffer.read({ltoir_child.REQUEST.size}); "
                f"out.write(struct.pack('<BQ', {ltoir_child.FAILED}, 4) + b'nope')"
            ),
            "nvJitLink fake: nope",
        ),
    ],
    ids=["unavailable", "no-start", "crash", "hang", "refused"],
)
def test_nvjitlink_failures_leave_the_entry_unreadable(tmp_path, lto, command, needle):
    """Whatever happens to nvJitLink, the entry is unreadable with the reason and the rest of the
    wheel is judged, in bounded time."""
    wheel = make_wheel(tmp_path / "f.whl", {"pkg/k.fatbin": lto["retired", "size"]})
    start = time.monotonic()
    out = judged(wheel, ltoir.Linker(command), max_lto_entry_seconds=1.0)
    assert time.monotonic() - start < 20
    assert out["clean"], out
    reasons = [u["reason"] for u in out["unreadable"]]
    assert len(reasons) == 2 and all("(LTO IR)" in r for r in reasons), reasons
    assert needle in reasons[0], reasons


@needs_nvcc
@needs_nvjitlink
def test_linking_time_share_per_wheel(tmp_path, lto):
    """Past `max_lto_seconds` the remaining entries are unreadable: the verdict still comes."""
    out = judged(make_wheel(tmp_path / "t.whl", {"pkg/k.fatbin": lto["retired", "size"]}), max_lto_seconds=0.0)
    assert out["clean"] and len(out["unreadable"]) == 2, out
    assert "nvJitLink time is spent" in out["unreadable"][0]["reason"]


def test_time_share_is_at_most_half_the_time_limit():
    """With a short --time-limit, linking stops at half of it and the scan keeps the rest."""
    limits = Limits(max_seconds=10.0)
    budget = Budget.starting_now(limits)
    budget.lto_seconds = 5.0
    got = []
    ltoir.Linker(UNAVAILABLE).submit("sm_90", b"", limits, budget, lambda ptx, why: got.append(why))
    assert got == ["not linked: this wheel's 5 s of nvJitLink time is spent"]


@needs_nvcc
def test_memory_limit_applies_to_the_child(tmp_path, lto):
    """The child runs under `max_lto_memory`: too little to start Python fails cleanly."""
    out = judged(make_wheel(tmp_path / "m.whl", {"pkg/k.fatbin": lto["retired", "size"]}), max_lto_memory=16 << 20)
    assert out["clean"] and len(out["unreadable"]) == 2, out
    assert "nvJitLink" in out["unreadable"][0]["reason"], out["unreadable"]


def _nvrtc_ltoir(source: str, arch: str) -> bytes:
    """A raw LTO IR module from NVRTC (`-dlto`), as a package would ship it."""
    try:
        from cuda.bindings import nvrtc

        err, prog = nvrtc.nvrtcCreateProgram(source.encode(), b"k.cu", 0, [], [])
    except Exception as exc:  # no NVRTC here
        pytest.skip(f"needs NVRTC: {exc}")
    opts = [b"-dlto", f"--gpu-architecture=compute_{arch}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    err, size = nvrtc.nvrtcGetLTOIRSize(prog)
    out = b" " * size
    (err,) = nvrtc.nvrtcGetLTOIR(prog, out)
    nvrtc.nvrtcDestroyProgram(prog)
    return out


@needs_nvjitlink
def test_shipped_raw_lto_ir(tmp_path, capsys):
    """A raw LTO IR file (its arch unknown: targets tried oldest first) is read as the PTX it links
    to; garbage behind the magic is unreadable with nvJitLink's reason."""
    kernel = kernels_source("dsv3_router_gemm")
    members = {f"pkg/k{arch}.ltoir": _nvrtc_ltoir(kernel, arch) for arch in ("80", "90", "100a")}
    members["pkg/neutral.bin"] = _nvrtc_ltoir(NEUTRAL_CU, "90")
    members["pkg/bad.ltoir"] = ltoir.NVVM_MAGIC + b"\x01" * 60
    rc, out = audit(capsys, make_wheel(tmp_path / "r.whl", members))
    assert rc == 1 and out["ops_found"] == ["dsv3_router_gemm"], out
    found = {(f["member"], f["layer"]) for f in out["findings"] if "dsv3_router_gemm_kernel" in f["evidence"]}
    assert found == {(m, "shipped-ltoir") for m in members if m.startswith("pkg/k")}, out["findings"]
    assert {a for f in out["findings"] for a in f["archs"]} == {"compute_80", "compute_90", "compute_100"}
    assert [u["member"] for u in out["unreadable"]] == ["pkg/bad.ltoir"], out["unreadable"]
    assert "raw LTO IR: nvJitLink" in out["unreadable"][0]["reason"]


@needs_nvcc
@needs_nvjitlink
def test_a_bound_mid_link_drops_the_requests_in_flight(lto):
    """An exception while answers are pending (a bound stopping the scan) kills the processes
    with requests in flight; the next scan starts clean and gets its own answers."""
    linker, limits = ltoir.Linker(), Limits()
    budget = Budget.starting_now(limits)
    data = ltoir.wrap(*_first_entry(lto["retired", "size"]))

    def boom(ptx, reason):
        raise RuntimeError("a bound")

    linker.submit("sm_90", data, limits, budget, boom)
    linker.submit("sm_90", data, limits, budget, boom)
    with pytest.raises(RuntimeError):
        linker.drain()
    assert not any(c.job for c in linker.children)
    got = []
    linker.submit("sm_90", data, limits, budget, lambda ptx, reason: got.append((ptx, reason)))
    linker.drain()
    linker.close()
    assert len(got) == 1 and b".entry dsv3_router_gemm_kernel" in got[0][0], got


def _first_entry(blob: bytes) -> tuple[bytes, bytes]:
    """The header and stored payload of a fatbin's first entry."""
    hsize, stored = struct.unpack_from("<IQ", blob, 16 + 4)
    return blob[16 : 16 + hsize], blob[16 + hsize : 16 + hsize + stored]
