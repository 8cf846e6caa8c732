"""Hostile and broken input: every case exits 2 with a clear message, quickly, writing nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import pytest
from audit_fixtures import (
    fatbin_entry,
    fatbin_header,
    lying_size_zip,
    make_wheel,
    overlapping_zip,
    symlink_info,
    tiny_elf,
    zip_with_info,
)

import slim_kernel
from slim_kernel.audit import inflate as wheel_mod
from slim_kernel.audit.limits import HostileArchiveError, Limits
from slim_kernel.audit.wheel import WheelArchive
from slim_kernel.cli import main

# the slim_kernel under test (source tree or installed wheel), for subprocesses
PACKAGE_ROOT = str(Path(slim_kernel.__file__).resolve().parents[1])


def refused(capsys, wheel, *needles: str) -> dict:
    start = time.process_time()  # CPU, not wall time: CI is a loaded machine
    rc = main(["audit", "--json", "--no-progress", str(wheel)])
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1 and len(doc["wheels"]) == 1, doc
    out = doc["wheels"][0]
    assert rc == 2, out
    assert time.process_time() - start < 10
    for needle in needles:
        assert needle in out["error"], out["error"]
    return out


def unreadable(capsys, wheel, *needles: str) -> dict:
    """A member (or a part of one) that cannot be parsed: listed with its reason, and the
    rest of the wheel judged (exit 0 here: nothing else names a retired op)."""
    start = time.process_time()
    rc = main(["audit", "--json", "--no-progress", str(wheel)])
    out = json.loads(capsys.readouterr().out)["wheels"][0]
    assert rc == 0 and out["clean"] and out["unreadable"], out
    assert time.process_time() - start < 10
    reasons = " | ".join(f"{u['member']}: {u['reason']}" for u in out["unreadable"])
    for needle in needles:
        assert needle in reasons, reasons
    return out


def test_zero_filled_data_file_is_read_not_refused(tmp_path, capsys):
    """No ratio limit on zip members (a 64 MiB zero-filled file deflates 1000:1); the
    declared-size limits and the time limit bound the read."""
    wheel = tmp_path / "zeros.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("pkg/zeros.bin", b"\0" * (64 << 20))
    assert main(["audit", "--json", "--no-progress", str(wheel)]) == 0
    capsys.readouterr()


def test_zip_bomb_absolute_limits(tmp_path):
    wheel = make_wheel(
        tmp_path / "big.whl", {"pkg/a.bin": os.urandom(3 << 20), "pkg/b.bin": os.urandom(3 << 20)}
    )
    with pytest.raises(HostileArchiveError, match="pkg/.\\.bin.*over the limit"):
        WheelArchive(wheel, Limits(max_member_unpacked=2 << 20))
    with pytest.raises(HostileArchiveError, match="unpacks to more than"):
        WheelArchive(wheel, Limits(max_total_unpacked=5 << 20))


@pytest.fixture(params=["isal", "zipfile"])
def inflater(request, monkeypatch):
    """Run a test with the ISA-L inflater (when installed) and with plain zipfile."""
    if request.param == "zipfile":
        monkeypatch.setattr(wheel_mod, "_fast_inflater", lambda: None)
    elif wheel_mod._fast_inflater() is None:
        pytest.skip("isal not installed")
    return request.param


def test_data_expanding_past_declared_size(tmp_path, capsys, inflater):
    """Reading stops at the declared size and the member is refused: no unbounded read."""
    wheel = lying_size_zip(tmp_path / "lie.whl", "pkg/a.py", b"x = 1\n" * 100_000, declared=1000)
    refused(capsys, wheel, "pkg/a.py", "corrupt")


def test_bad_crc_and_short_data(tmp_path, capsys, inflater):
    data = os.urandom(50_000)
    wheel = make_wheel(tmp_path / "crc.whl", {"pkg/data.bin": data})
    raw = bytearray(wheel.read_bytes())
    at = raw.find(b"pkg/data.bin") + len("pkg/data.bin") + 2000  # inside the member's deflate data
    raw[at] ^= 0xFF
    wheel.write_bytes(bytes(raw))
    refused(capsys, wheel, "pkg/data.bin")
    short = lying_size_zip(tmp_path / "short.whl", "pkg/a.py", b"x = 1\n" * 100, declared=100_000)
    refused(capsys, short, "pkg/a.py")
    stored = lying_size_zip(
        tmp_path / "stored.whl", "pkg/a.py", b"x = 1\n" * 100, 100_000, zipfile.ZIP_STORED
    )
    refused(capsys, stored, "pkg/a.py", "stored member")


@pytest.mark.parametrize("step", [4097, 100_003, 1 << 20])
def test_deflated_member_read_in_any_steps(tmp_path, inflater, step):
    """After its last input the inflater may still hold output (a long run of zeros ends in a
    long match): that is not "data ends before the declared size", whatever the read size."""
    data = bytes(3 << 20) + b"tail"
    wheel = make_wheel(tmp_path / "z.whl", {"pkg/zeros.bin": data})
    with WheelArchive(wheel) as archive:
        (member,) = [m for m in archive.members if m.name == "pkg/zeros.bin"]
        stream, out = archive.open(member), bytearray()
        while len(out) < len(data):
            out += stream.read(step)
        assert out == data


def test_holes_of_a_sparse_wheel_are_zeros(tmp_path):
    """A stored member over a hole of a sparse wheel file: the hole is returned as zeros
    without being read (SEEK_DATA), the data around it as written, and the CRC-32 holds."""
    from audit_fixtures.crafted import _central_entry, _end_of_central, _local_header

    head, tail, hole = os.urandom(5000), os.urandom(7000), 3 << 20
    data = head + bytes(hole) + tail
    local = _local_header(b"pkg/data.bin", 0, zlib.crc32(data), len(data), len(data))
    path = tmp_path / "sparse.whl"
    with open(path, "wb") as f:
        f.write(local + head)
        f.seek(len(local) + len(head) + hole)  # never written: a hole where the file system has them
        f.write(tail)
        cd = _central_entry(b"pkg/data.bin", 0, zlib.crc32(data), len(data), len(data), 0)
        f.write(cd + _end_of_central(1, len(cd), len(local) + len(data)))
    with WheelArchive(path) as archive:
        stream, buf, out = archive.open(archive.members[0]), bytearray(2 << 20), bytearray()
        while len(out) < len(data):
            n = stream.readinto(buf)
            out += buf[:n]
    assert out == data
    assert main(["audit", "--json", "--no-progress", str(path)]) == 0


def test_inflaters_agree(tmp_path, monkeypatch, capsys):
    if wheel_mod._fast_inflater() is None:
        pytest.skip("isal not installed")
    wheel = make_wheel(
        tmp_path / "same.whl", {"pkg/a.py": b"import bmm_fp8\n" * 5_000, "pkg/b.bin": os.urandom(1 << 20)}
    )
    main(["audit", "--json", "--no-progress", str(wheel)])
    (fast,) = json.loads(capsys.readouterr().out)["wheels"]
    monkeypatch.setattr(wheel_mod, "_fast_inflater", lambda: None)
    main(["audit", "--json", "--no-progress", str(wheel)])
    (slow,) = json.loads(capsys.readouterr().out)["wheels"]
    assert fast["routed"] == slow["routed"] and fast["routed"][0]["count"] == 5_000


@pytest.mark.parametrize("name", ["../evil.py", "pkg/../../evil.py", "/etc/evil.py", "C:/evil.py"])
def test_path_traversal_and_absolute_names(tmp_path, capsys, name):
    wheel = zip_with_info(tmp_path / "trav.whl", [(zipfile.ZipInfo(name), b"x = 1\n")])
    refused(capsys, wheel, name)


def test_symlink_member(tmp_path, capsys):
    wheel = zip_with_info(
        tmp_path / "link.whl",
        [(zipfile.ZipInfo("pkg/a.py"), b"x\n"), (symlink_info("pkg/link.so"), b"/etc/passwd")],
    )
    refused(capsys, wheel, "symlink", "pkg/link.so")


def test_overlapping_members(tmp_path, capsys):
    refused(capsys, overlapping_zip(tmp_path / "overlap.whl"), "overlap")


def test_duplicate_names(tmp_path, capsys):
    wheel = tmp_path / "dup.whl"
    with pytest.warns(UserWarning):
        zip_with_info(wheel, [(zipfile.ZipInfo("pkg/a.py"), b"1"), (zipfile.ZipInfo("pkg/a.py"), b"2")])
    refused(capsys, wheel, "duplicate")


def test_not_a_zip_empty_and_missing(tmp_path, capsys):
    text = tmp_path / "text.whl"
    text.write_text("definitely not a zip\n")
    refused(capsys, text, "not a zip")
    empty = tmp_path / "empty.whl"
    zipfile.ZipFile(empty, "w").close()
    refused(capsys, empty, "empty wheel")
    refused(capsys, tmp_path / "missing.whl", "not found")
    refused(capsys, tmp_path, "directory")


def test_truncated_elf_is_unreadable_and_the_rest_judged(tmp_path, capsys):
    elf = Path(os.path.realpath(sys.executable)).read_bytes()
    wheel = make_wheel(
        tmp_path / "trunc.whl", {"pkg/_ops.so": elf[: len(elf) // 2], "pkg/_other.so": tiny_elf(["bmm_fp8"], machine=62)}
    )
    rc = main(["audit", "--json", "--no-progress", str(wheel)])
    out = json.loads(capsys.readouterr().out)["wheels"][0]
    assert rc == 1 and out["ops_found"] == ["bmm_fp8"], out
    assert [u["member"] for u in out["unreadable"]] == ["pkg/_ops.so"]
    assert "truncated" in out["unreadable"][0]["reason"]


@pytest.mark.parametrize(
    "blob, needle",
    [
        (fatbin_header(1 << 62), "declares"),
        (
            fatbin_header(80) + fatbin_entry(2, b"\0" * 16, header_size=1 << 30, pad=False),
            "absurd header size",
        ),
        (fatbin_header(64 + 16) + fatbin_entry(2, b"\0" * 16, stored=1 << 40), "payload"),
        (
            fatbin_header(64 + 16) + fatbin_entry(2, b"\0" * 16, flags=0x2011, csize=16, usize=1 << 40),
            "decompression bomb",
        ),
        (fatbin_header(64 + 16) + fatbin_entry(2, b"\xff" * 16, flags=0x8011, csize=16, usize=64), "zstd"),
        (fatbin_header(64 + 16) + fatbin_entry(2, b"\xff" * 16, flags=0x2011, csize=16, usize=64), "LZ4"),
        (fatbin_header(64 + 64) + fatbin_entry(2, b"NOTANELF" * 8), "not an ELF"),
        (fatbin_header(64 + 16) + fatbin_entry(8, b"\x33\x03" * 8), "(LTO IR)"),  # garbage to nvJitLink
    ],
)
def test_hostile_fatbin_headers(tmp_path, capsys, blob, needle):
    """A bound (a decompression bomb) refuses the wheel; a header that cannot be parsed makes
    its member unreadable and the rest is judged."""
    judge = refused if needle == "decompression bomb" else unreadable
    wheel = make_wheel(tmp_path / "fb.whl", {"pkg/k.fatbin": blob})
    judge(capsys, wheel, "pkg/k.fatbin", needle)
    # the same bytes embedded in a host library are judged just the same
    host = bytearray(Path(os.path.realpath(sys.executable)).read_bytes())
    host[64 + 4096 : 64 + 4096 + len(blob)] = blob
    judge(capsys, make_wheel(tmp_path / "host.whl", {"pkg/_ops.so": bytes(host)}), needle)


def test_bad_retired_argument(capsys):
    assert main(["audit", "--retired", "bad op!", "x.whl"]) == 2
    assert "--retired" in capsys.readouterr().err


def test_nothing_written_outside_private_tempdir(tmp_path):
    """The audit of a wheel never writes into the working directory or next to the wheel."""
    wheel = make_wheel(tmp_path / "w" / "ok.whl", {"pkg/a.py": b"x = 1\n"})
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "slim_kernel", "audit", str(wheel)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(cwd.iterdir()) == [] and list((tmp_path / "tmp").iterdir()) == []
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["ok.whl"]


def test_too_many_fatbin_headers_and_text_lines_are_bounded():
    import io

    from audit_fixtures import fatbin_of, tiny_elf

    from slim_kernel.audit.limits import AuditInputError
    from slim_kernel.audit.rules import Rules
    from slim_kernel.audit.scan import ScanContext, scan_member

    blob = fatbin_of([(tiny_elf(["k"]), 90, 0x11)] * 20)
    ctx = ScanContext(Rules(), Limits(max_items=10))
    with pytest.raises(AuditInputError, match="more than 10 items"):
        scan_member(io.BytesIO(blob), "k.fatbin", len(blob), len(blob), ctx)
    text = b"y = bmm_fp8(x)\n" * 30_000
    ctx = ScanContext(Rules(), Limits(max_text_lines=100))
    scan = scan_member(io.BytesIO(text), "pkg/a.py", len(text), len(text), ctx)
    assert scan.routed[0]["count"] == 100 and scan.stats["routed_truncated"] == 1
