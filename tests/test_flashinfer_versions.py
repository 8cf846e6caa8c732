"""flashinfer releases that run the same kernels as a measured one read its measurements as their own:
0.7.2 (what sglang 0.5.23 pins) is 0.7.2.post1 for these ops (routing.SAME_KERNELS; the evidence, file and
function hashes of both wheels, is benchmark/results/flashinfer_0.7.2_vs_post1.md). Any other unmeasured
release still falls to the nearest measured one, with a note."""

import random

import pytest

from slim_kernel import routing

TABLE = routing.table("sm_90")


def _measured_points(n: int):
    """``n`` points of the shipped table measured on 0.7.2.post1, drawn afresh each run."""
    points = [p for p in TABLE.points if dict(p.versions).get("flashinfer") == "0.7.2.post1"]
    return random.sample(points, n)


@pytest.mark.parametrize("point", _measured_points(6), ids=lambda p: f"{p.op}-m{p.m}-pdl{int(p.pdl)}")
def test_0_7_2_reads_the_post1_measurements_as_its_own(point):
    shape = dict(point.shape)
    got = TABLE.lookup(point.op, shape, point.m, (("flashinfer", "0.7.2"),), point.pdl)
    assert got.point == point and got.match == "exact"
    assert TABLE.lookup(point.op, shape, point.m, (("flashinfer", "0.7.2.post1"),), point.pdl).match == "exact"


@pytest.mark.parametrize("installed", ["0.7.1", "0.7.3", "0.7.2.post2"])
def test_other_unmeasured_releases_say_whose_numbers_they_use(installed):
    (point,) = _measured_points(1)
    got = TABLE.lookup(point.op, dict(point.shape), point.m, (("flashinfer", installed),), point.pdl)
    assert got.match.startswith(f"flashinfer {installed}: using the ") and "measurements" in got.match


def test_the_equivalence_names_measured_releases_only():
    for name, same in routing.SAME_KERNELS.items():
        measured = set(TABLE.versions_of(name))
        assert set(same.values()) <= measured
        assert not set(same) & measured  # a measured release is never redirected
    assert routing.measured_as("flashinfer", "0.7.2") == "0.7.2.post1"
    assert routing.measured_as("flashinfer", "0.7.4") == "0.7.4"
    assert routing.measured_as("flashinfer", None) is None
