"""The contract of the flashinfer backend with each supported flashinfer release: every private read it
makes (the fused-A programs' dispatch and tiles, bmm_fp8's internals) works on that release. Runs against
the installed flashinfer where it is that release; skips, saying so, otherwise. A read that stops working
fails here, and at run time gives an `info` line and one warning (never a silent degrade)."""

from __future__ import annotations

from importlib import metadata

import pytest

from slim_kernel import backend
from slim_kernel.names import FUSED_A

SUPPORTED = ("0.7.2.post1", "0.7.4")  # the releases the shipped routing table measured


def _installed() -> str | None:
    try:
        return metadata.version("flashinfer-python")
    except metadata.PackageNotFoundError:
        return None


@pytest.fixture(params=SUPPORTED)
def release(request):
    installed = _installed()
    if installed != request.param:
        pytest.skip(f"flashinfer {request.param} is not installed (installed: {installed or 'none'})")
    try:
        import flashinfer.gemm  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (no CUDA runtime here, say)
        pytest.skip(f"flashinfer {request.param} does not import here: {type(exc).__name__}: {exc}")
    return request.param


def test_fused_a_programs_are_readable(release):
    from slim_kernel.backends import flashinfer as fb

    fb.fused_a_tile.cache_clear()
    reader = fb.BACKEND.reader(FUSED_A, "sm_90")
    assert reader is fb.fused_a_tile
    tile = reader(1, 2112, 7168)
    assert tile is not None and tile.tokens > 0 and tile.rows > 0 and tile.smem > 0
    if release != "0.7.2.post1":  # the generated sm_90a programs: named by the release itself
        assert reader(1, 2112, 7168, "s8il") is not None
    assert fb.BACKEND.health() == []


def test_bmm_fp8_internals_are_found(release):
    import flashinfer

    from slim_kernel.backends import flashinfer_fastpath as fp

    found = fp.find_internals(flashinfer)
    assert callable(found.workspace) and found.workspace_size > 0


def test_the_backend_is_registered_and_says_its_version():
    unit = backend.get("flashinfer")
    assert unit.name == "flashinfer" and unit.version() == _installed()
    assert unit.probe() is None or "not installed" in unit.probe()
