"""Estimated routing for a shape no table measured (or a GPU with another SM count).

Torch-free, and it imports no backend: every candidate's grid comes through the backend interface
(``backend.Geometry``). What carries over from the measured shapes to a new one is not which candidate
won at the nearest shape but how each candidate's grid lands on the device: these GEMMs stream a
weight read once, and a configuration is fast or slow by how many CTAs it runs at a time, in how many
waves, each streaming how many bytes. The JIT backend knows every configuration's grid, block, shared
memory and registers (``jit/catalogue.py``); the flashinfer backend the tiles of its pinned fused-A
programs, and where the installed flashinfer is the one the points were measured on, the program its
own call runs at each shape; a grid a backend does not know is taken as one CTA per SM.

So for the call's shape, each candidate's *regret* (its time over the fastest candidate's) at every
measured shape of the op (same M and launch context) is averaged in log space with weights
``exp(-d / TAU)``, where ``d`` compares the candidate's grid at the two shapes on this device's SMs:

    d = |log(bytes per CTA ratio)| + 2 |waves difference| + |log(CTAs at a time ratio)|
        + 2 |log(lane fill ratio)| (+ 0.1 for another output dtype)

(lane fill: the share of a narrow kernel's thread-chunks that hold data in its rounds over K; two
448-thread rounds fill 7168 exactly and 4096 to 57%; a fitted straight-line body fills every K it serves)

and the candidate with the smallest weighted regret serves. A grid that runs in another number of waves
is another regime (flashinfer's ``PACKED_U4_IL`` at M 9-16: 1.00x the best anchor at 896 x 4096 in one
wave, 1.2-1.4x at every N=2112 shape in two), so it barely counts. Evidence from grids unlike the call's
is weak, so every candidate's average also holds a prior regret ``PRIOR_REGRET`` with a weight of
``PRIOR_WEIGHT`` of the best-supported candidate's: a candidate known only from far-off grids ranks near
that prior, not at the regret it had there. A candidate whose total weight is below MIN_WEIGHT of the
best-supported candidate's is not estimated; the threshold is relative, so far from every measured shape
the candidates still rank by their regrets rather than falling back to the priority order. Different
compiled bodies of one candidate (narrow's straight-line body and its generic one; the programs
flashinfer's own call picks) never stand in for each other. A call whose program cannot be known
carries its backend's margin (``Backend.margin``).

Scored on the H200 runs (shapes the table lacks, and each shape left out of the table in turn; the
pick's measured time) by ``benchmark/score_estimate.py``; the method and its score are in
``benchmark/DESIGN.md``. The estimate's µs (what ``info`` shows) is the weighted regret times the
similarity-weighted best time of the measured shapes.
"""

from __future__ import annotations

import math

from .backend import Geometry
from .decision import Decision, Device, Point, shape_items

TAU = 0.2
ACTIVE_WEIGHT = 1.0
FILL_WEIGHT = 2.0  # of the lanes a narrow kernel's rounds keep busy at K (catalogue Narrow.lane_fill)
MIN_WEIGHT = 1e-3
PRIOR_WEIGHT = 0.01  # of the best-supported candidate's weight: 0.003-0.02 score alike (benchmark/DESIGN.md)
PRIOR_REGRET = math.log(1.2)  # 1.15-1.3 score alike
OUT_DTYPE_DISTANCE = 0.1
WAVES_WEIGHT = 2.0  # per wave of difference: 1.5-4 score alike, 1/2 and 1 worse (benchmark/DESIGN.md)


def _nk(op: str, shape: dict) -> tuple[int, int] | None:
    n = shape.get("e", shape.get("n"))
    k = shape.get("k")
    return (n, k) if isinstance(n, int) and isinstance(k, int) else None


def geometry_distance(op: str, candidate: str, a: tuple[int, int, int], b: tuple[int, int, int], sms: int,
                      geometry: Geometry) -> float:
    """How differently ``candidate``'s grid lands on ``sms`` SMs at (N, K, M) ``a`` and ``b``."""
    (ga, sa), (gb, sb) = geometry.grid(op, candidate, *a, sms), geometry.grid(op, candidate, *b, sms)
    bytes_a, bytes_b = a[0] * a[1] / ga, b[0] * b[1] / gb
    waves_a, waves_b = -(-ga // sa), -(-gb // sb)
    fill_a, fill_b = geometry.lane_fill(op, candidate, a[1]), geometry.lane_fill(op, candidate, b[1])
    return (abs(math.log(bytes_a / bytes_b)) + WAVES_WEIGHT * abs(waves_a - waves_b)
            + ACTIVE_WEIGHT * abs(math.log(min(ga, sa) / min(gb, sb)))
            + FILL_WEIGHT * abs(math.log(fill_a / fill_b)))


def _training(tables: list, op: str, m: int, pdl: bool, versions: tuple) -> list[Point]:
    """The measured points to learn from: per table, its version set nearest the installed
    one and the measured M nearest ``m``, every shape of the op (the first table wins a shape both have)."""
    points: dict[tuple, Point] = {}
    for tab in tables:
        for key in tab.versions_by_distance(versions)[:1]:
            cands = [p for p in tab.points if p.op == op and p.pdl == pdl and p.versions == key]
            if not cands:
                continue
            near = min({p.m for p in cands}, key=lambda x: (abs(x - m), x))
            for p in cands:
                if p.m == near:
                    points.setdefault(p.shape, p)
    return list(points.values())


def estimate(op: str, shape: dict, m: int, pdl: bool, device: Device, tables: list,
             versions: tuple, geometry: Geometry | None = None) -> Decision | None:
    """A synthetic point ranking every estimable candidate, or None (nothing to learn from). ``geometry``:
    the backends' grids (``backend.Geometry``; its readers of the installed libraries are used where every
    point learnt from was measured on them)."""
    nk = _nk(op, shape)
    train = _training(tables, op, m, pdl, versions) if nk else []
    if not train:
        return None
    geometry = geometry or Geometry()
    if any(p.versions != versions for p in train):
        geometry = geometry.opaque()  # the library's programs at the measured shapes were another release's
    here = (*nk, m)
    log_regret: dict[str, float] = {}
    weight: dict[str, float] = {}
    best_log, best_w = 0.0, 0.0
    for p in train:
        pshape = dict(p.shape)
        pnk = _nk(op, pshape)
        if pnk is None:
            continue
        there = (*pnk, p.m)
        extra = OUT_DTYPE_DISTANCE if pshape.get("out") != shape.get("out") else 0.0
        best = p.us[0][1]
        w_shape = math.exp(-(abs(math.log(nk[0] / pnk[0])) + abs(math.log(nk[1] / pnk[1])) + extra) / TAU)
        best_log, best_w = best_log + w_shape * math.log(best * nk[0] * nk[1] / (pnk[0] * pnk[1])), best_w + w_shape
        for cand, us in p.us:
            if geometry.body(op, cand, *there) != geometry.body(op, cand, *here):
                continue
            w = math.exp(-(geometry_distance(op, cand, here, there, device.sms, geometry) + extra) / TAU)
            log_regret[cand] = log_regret.get(cand, 0.0) + w * math.log(us / best)
            weight[cand] = weight.get(cand, 0.0) + w
    ref = math.exp(best_log / best_w) if best_w > 0 else 1.0  # ~ the best µs here (display only)
    most = max(weight.values(), default=0.0)
    prior = PRIOR_WEIGHT * most
    predicted = {c: round(ref * math.exp((log_regret[c] + prior * PRIOR_REGRET) / (weight[c] + prior)
                                         + geometry.margin(op, c)), 3)
                 for c in log_regret if weight[c] > 0 and weight[c] >= MIN_WEIGHT * most}
    if not predicted:
        return None
    point = Point(op, shape_items(shape), m, train[0].versions, pdl,
                  tuple(sorted(predicted.items(), key=lambda cu: (cu[1], cu[0]))))
    match = (f"estimate: each candidate's regret at the {len(train)} measured shapes (M={train[0].m}), weighted by "
             f"how alike its grid lands on {device.sms} SMs (estimate.py); `slim-kernel tune` measures it")
    for note in geometry.describe(op, *here, device.sms):
        match += f"; {note}"
    return Decision(point, match, "estimate", True)
