"""Fuzz the ELF, cubin, fatbin and whole-member readers: on any bytes they either succeed or
raise `AuditInputError` (exit 2), within a deadline. The default run is a few seconds; the
`slow` variant runs many more examples."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from audit_fixtures import fatbin_entry, fatbin_header, fatbin_of, tiny_elf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slim_kernel.audit.device import summarize_cubin
from slim_kernel.audit.elf import ElfFile
from slim_kernel.audit.limits import AuditInputError, Limits
from slim_kernel.audit.rules import Rules
from slim_kernel.audit.scan import ScanContext, scan_member

LIMITS = Limits(max_entry_unpacked=8 << 20, retained_in_memory=1 << 20)
CTX = ScanContext(Rules(), LIMITS)
CUBIN = tiny_elf(
    ["dsv3_router_gemm_kernel", "_Z7bmm_fp8v"],
    extra_symbols=["_ZN34_INTERNAL_5e4f58f6_10_bmm_fp8_cu_6ca8d4177counterE"],
)
FATBIN = fatbin_of([(CUBIN, 90, 0x100011), (CUBIN, 100, 0x1100011)])
# an x86-64 library with a fatbin in its data: built here, so the seed is the same whatever Python runs the tests
HOST_WITH_FATBIN = tiny_elf(["host_main"], machine=62, flags=0) + bytes(4096) + FATBIN + bytes(4096)
LZ4_ENTRY = fatbin_header(64 + 24) + fatbin_entry(
    2, b"\x80\x7fELF\x02\x01\x01\x41" + b"\0" * 16, flags=0x2011, csize=24, usize=64
)


def mutated(seed: bytes):
    """Seed bytes with a few byte-range overwrites (keeps most structure, breaks some)."""
    patch = st.tuples(st.integers(0, max(len(seed) - 1, 0)), st.binary(min_size=1, max_size=16))
    return st.lists(patch, max_size=6).map(lambda ps: _apply(seed, ps))


def _apply(seed: bytes, patches) -> bytes:
    out = bytearray(seed)
    for off, data in patches:
        out[off : off + len(data)] = data
    return bytes(out)


def inputs(*seeds: bytes):
    return st.one_of(
        st.binary(max_size=512),
        *[mutated(s) for s in seeds],
        st.builds(lambda s, n: s[:n], st.sampled_from(seeds), st.integers(0, 4096)),
    )


def _must_be_clean_error(fn, data: bytes) -> None:
    try:
        fn(data)
    except AuditInputError:
        pass


def _scan(name: str):
    return lambda data: scan_member(io.BytesIO(data), name, len(data), len(data), CTX)


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(inputs(CUBIN))
def test_fuzz_elf_and_cubin(data):
    _must_be_clean_error(lambda d: ElfFile(d, LIMITS), data)
    _must_be_clean_error(lambda d: list(summarize_cubin(d, Rules(), LIMITS, "fuzz").names), data)


@FAST
@given(inputs(FATBIN, LZ4_ENTRY))
def test_fuzz_fatbin_member(data):
    _must_be_clean_error(_scan("pkg/k.fatbin"), data)


@FAST
@given(inputs(HOST_WITH_FATBIN))
def test_fuzz_host_elf_member(data):
    _must_be_clean_error(_scan("pkg/_ops.so"), data)


@SLOW
@given(inputs(CUBIN, FATBIN, LZ4_ENTRY, HOST_WITH_FATBIN))
def _fuzz_all_readers_long(data):
    for name in (
        "pkg/k.cubin",
        "pkg/k.fatbin",
        "pkg/_ops.so",
        "pkg/lib.a",
        "pkg/k.ptx",
        "pkg/data.bin",
        "pkg/v.zip",
        "pkg/v.tar.gz",
        "pkg/v.tar.xz",
    ):
        _must_be_clean_error(_scan(name), data)


@pytest.mark.slow
def test_fuzz_all_readers_long(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("long fuzz run: select with -m slow")
    _fuzz_all_readers_long()


WHEEL = None


def _wheel_seed() -> bytes:
    global WHEEL
    if WHEEL is None:
        import tempfile

        from audit_fixtures import make_wheel

        with tempfile.TemporaryDirectory() as tmp:
            path = make_wheel(Path(tmp) / "f.whl", {"pkg/k.fatbin": FATBIN, "pkg/a.py": b"import bmm_fp8\n"})
            WHEEL = path.read_bytes()
    return WHEEL


@FAST
@given(st.data())
def test_fuzz_whole_wheel(tmp_path_factory, data):
    """Corrupted archives: the audit answers 0, 1 or 2, never crashes."""
    from slim_kernel.audit.cli import audit_one

    blob = data.draw(mutated(_wheel_seed()))
    path = tmp_path_factory.mktemp("fz") / "f.whl"
    path.write_bytes(blob)
    _, rc = audit_one(str(path), CTX, jobs=1, progress=False)
    assert rc in (0, 1, 2)


def test_seeds_are_meaningful():
    """The fuzz seeds parse and carry the retired names (so mutations start from real structure)."""
    scan = _scan("pkg/_ops.so")(HOST_WITH_FATBIN)
    assert scan.stats["cubins"] == 2
    assert {h.op for h in scan.hits} == {"bmm_fp8", "dsv3_router_gemm"}
    assert {b.arch for b in scan.blobs} == {"sm_90a", "sm_100a"}


def _archives():
    import gzip
    import io
    import tarfile

    from audit_fixtures import make_wheel

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("k.fatbin")
        info.size = len(FATBIN)
        tf.addfile(info, io.BytesIO(FATBIN))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        whl = make_wheel(Path(tmp) / "v.whl", {"k.fatbin": FATBIN}).read_bytes()
    return buf.getvalue(), gzip.compress(buf.getvalue()), whl


TAR, TGZ, ZIP = _archives()


@FAST
@given(inputs(TAR, TGZ, ZIP))
def test_fuzz_nested_archives(data):
    for name in ("pkg/v.tar", "pkg/v.tar.gz", "pkg/v.zip"):
        _must_be_clean_error(_scan(name), data)


def test_archive_seeds_are_meaningful():
    for name, blob in (("pkg/v.tar", TAR), ("pkg/v.tar.gz", TGZ), ("pkg/v.zip", ZIP)):
        scan = _scan(name)(blob)
        assert scan.kind in ("tar", "zip") and {h.op for h in scan.hits} == {"bmm_fp8", "dsv3_router_gemm"}, (
            name
        )
