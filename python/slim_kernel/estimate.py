"""Estimated routing for a shape no table measured (or a GPU with another SM count).

Torch-free. What carries over from the measured shapes to a new one is not which candidate won at
the nearest shape but how each candidate's grid lands on the device: these GEMMs stream a weight
read once, and a configuration is fast or slow by how many CTAs it runs at a time, in how many
waves, each streaming how many bytes (``jit/catalogue.py`` gives every JIT configuration's grid,
block and shared memory, and a narrow kernel's registers; ``PINNED_ROWS_PER_CTA`` the tiles of flashinfer's
pinned fused-A programs; the grids flashinfer picks itself and torch's are unknown and taken as one CTA per SM).

So for the call's shape, each candidate's *regret* (its time over the fastest candidate's) at every
measured shape of the op (same M and launch context) is averaged in log space with weights
``exp(-d / TAU)``, where ``d`` compares the candidate's grid at the two shapes on this device's SMs:

    d = |log(bytes per CTA ratio)| + 2 |waves difference| + |log(CTAs at a time ratio)|
        + 2 |log(lane fill ratio)| (+ 0.1 for another output dtype)

(lane fill: the share of a narrow kernel's thread-chunks that hold data in its rounds over K; two
448-thread rounds fill 7168 exactly and 4096 to 57%; a fitted straight-line body fills every K it serves)

and the candidate with the smallest weighted regret serves. A grid that runs in another number of waves is another
regime (flashinfer's ``PACKED_U4_IL`` at M 9-16: 1.00x the best anchor at 896 x 4096 in one wave, 1.2-1.4x at every
N=2112 shape in two), so it barely counts (the waves term's weight was 1/2 up to run 135; with 2, each shape left out
in turn, 0.7.4: fused-A points over 1.10x after the plain producer 11 -> 5 of 445, after the PDL-aware one 27 -> 24,
routers 2 -> 1 and 5 -> 4 of 530).
Evidence from grids unlike the call's is weak, so
every candidate's average also holds a prior regret ``PRIOR_REGRET`` with a weight of ``PRIOR_WEIGHT`` of the
best-supported candidate's: a candidate known only from far-off grids ranks near that prior, not at the regret
it had there (run 128: narrow configurations that win GLM-5's router in one wave, picked at 768x6144 where they
run three, 1.24-1.35x the best anchor). A candidate whose total weight is below
MIN_WEIGHT of the best-supported candidate's is not estimated. The threshold is relative: far from every
measured shape all weights are small, and the candidates still rank by their regrets rather than falling
back to the priority order (run 126: fused-A 1056x2560, whose weights were all below 1e-3, ran the JIT
backend's own default there at 1.18-1.51x the best anchor). Narrow's straight-line body (its own K
and the smaller ones it is fitted to) and its generic body are different kernels and never stand in for
each other.
flashinfer's ``tinygemm_bf16`` picks its own program per shape from a window table (0.7.4 on SM90: 1.0x the
best anchor at one M, 1.2-1.5x at the next where it switches to a program that runs in two or three waves).
Where the table's points were measured on the installed flashinfer, ``tiles`` (the flashinfer backend's
``fused_a_tile``, which asks that table) gives the program and tile of its call at each shape and M: its grid
is placed like a JIT configuration's, and only points where it ran the same program stand in (as for narrow's
bodies; letting its other programs stand in at alike grids scored worse after the PDL-aware producer, 24 -> 33 of
445). Otherwise its program is unknown: one CTA per SM is assumed and its regret carries ``OPAQUE_MARGIN`` more.

Scored on the H200 runs (shapes the table lacks, and each shape left out of the table in turn; the
pick's measured time) by ``benchmark/score_estimate.py``; numbers in
``benchmark/DESIGN.md``. The estimate's µs (what ``info`` shows) is the
weighted regret times the similarity-weighted best time of the measured shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from .names import FUSED_A
from .routing import Decision, Device, Point, Table, _shape_items

TAU = 0.2
ACTIVE_WEIGHT = 1.0
FILL_WEIGHT = 2.0  # of the lanes a narrow kernel's rounds keep busy at K (catalogue Narrow.lane_fill)
MIN_WEIGHT = 1e-3
PRIOR_WEIGHT = 0.01  # of the best-supported candidate's weight: 0.003-0.02 score alike (benchmark/DESIGN.md)
PRIOR_REGRET = math.log(1.2)  # 1.15-1.3 score alike
OUT_DTYPE_DISTANCE = 0.1
WAVES_WEIGHT = 2.0  # per wave of difference: 1.5-4 score alike, 1/2 and 1 worse (benchmark/DESIGN.md)
# flashinfer's fused-A call chooses its own program per shape: unpredictable where it was not measured
OPAQUE_MARGIN = {(FUSED_A, "flashinfer"): 0.2}
# rows of N per CTA of each of flashinfer's pinned fused-A programs (names.FLASHINFER_FUSED_A_PROGRAMS) where
# ``tiles`` cannot say: grids of 164 and 41 CTAs at N=2624 (ncu, H200 run 80), one CTA per SM assumed
PINNED_ROWS_PER_CTA = {"s8il": 16, "cn16": 64}
MAX_THREADS_PER_SM = 2048
REGS_PER_SM = 65536
ASSUMED_REGS = 128  # an uncapped kernel's registers per thread where the catalogue does not say
# (M, N, K, pinned variant or None) -> the tile of flashinfer's fused-A program (backends.flashinfer.fused_a_tile)
Tiles = Callable[[int, int, int, "str | None"], object]


def _nk(op: str, shape: dict) -> tuple[int, int] | None:
    n = shape.get("e", shape.get("n"))
    k = shape.get("k")
    return (n, k) if isinstance(n, int) and isinstance(k, int) else None


def _config(op: str, candidate: str):
    backend, _, variant = candidate.partition(":")
    if backend != "jit":
        return None
    from .jit.catalogue import VARIANTS

    return VARIANTS.get(op, {}).get(variant)


def _flashinfer_tile(op: str, candidate: str, n: int, k: int, m: int, tiles: Tiles | None):
    backend, _, variant = candidate.partition(":")
    if tiles is None or (op, backend) != (FUSED_A, "flashinfer"):
        return None
    return tiles(m, n, k, variant or None)


def grid(op: str, candidate: str, n: int, k: int, m: int, sms: int, tiles: Tiles | None = None) -> tuple[int, int]:
    """(CTAs, CTAs running at once) of ``candidate`` at (N, K, M) on ``sms`` SMs."""
    from .jit.catalogue import SMEM_PER_SM, SMEM_RESERVED_PER_CTA

    tile = _flashinfer_tile(op, candidate, n, k, m, tiles)
    if tile is not None:  # a flashinfer program whose tile the installed flashinfer names
        ctas = tile.cluster * -(-m // tile.tokens) * -(-n // tile.rows)
        return ctas, sms * max(1, SMEM_PER_SM // (tile.smem + SMEM_RESERVED_PER_CTA))
    backend, _, variant = candidate.partition(":")
    rows = PINNED_ROWS_PER_CTA.get(variant) if (op, backend) == (FUSED_A, "flashinfer") else None
    if rows:  # a pinned flashinfer program: its tile is known, one CTA per SM at a time (ncu, run 80)
        return -(-n // rows), sms
    cfg = _config(op, candidate)
    if cfg is None:  # flashinfer's own choice, torch: a grid we do not know, assumed one CTA per SM
        return sms, sms
    dims, block, _ = cfg.geometry(n, k, sms)
    ctas = dims[0] * dims[1] * dims[2]
    threads = block[0] * block[1] * block[2]
    registers = getattr(cfg, "registers", None)
    regs = registers(m, (n, k)) if registers else ASSUMED_REGS
    per_sm = max(1, min(MAX_THREADS_PER_SM // threads, REGS_PER_SM // (threads * regs),
                        SMEM_PER_SM // (cfg.smem(m, (n, k)) + SMEM_RESERVED_PER_CTA), 32))
    return ctas, sms * per_sm


def body(op: str, candidate: str, n: int, k: int, m: int, tiles: Tiles | None = None) -> str:
    """Which compiled body ``candidate`` runs at (N, K, M): narrow configurations have a straight-line
    one for the K they are fitted to (catalogue ``Narrow.exact_for``) and a generic one; flashinfer's
    fused-A call runs the program its window table picks (where ``tiles`` can say)."""
    tile = _flashinfer_tile(op, candidate, n, k, m, tiles)
    if tile is not None:
        return tile.name
    exact_for = getattr(_config(op, candidate), "exact_for", None)
    return "exact" if exact_for is not None and exact_for((n, k)) else ""


def geometry_distance(op: str, candidate: str, a: tuple[int, int, int], b: tuple[int, int, int], sms: int,
                      tiles: Tiles | None = None) -> float:
    """How differently ``candidate``'s grid lands on ``sms`` SMs at (N, K, M) ``a`` and ``b``."""
    (ga, sa), (gb, sb) = grid(op, candidate, *a, sms, tiles), grid(op, candidate, *b, sms, tiles)
    bytes_a, bytes_b = a[0] * a[1] / ga, b[0] * b[1] / gb
    waves_a, waves_b = -(-ga // sa), -(-gb // sb)
    return (abs(math.log(bytes_a / bytes_b)) + WAVES_WEIGHT * abs(waves_a - waves_b)
            + ACTIVE_WEIGHT * abs(math.log(min(ga, sa) / min(gb, sb)))
            + FILL_WEIGHT * abs(math.log(_lane_fill(op, candidate, a[1]) / _lane_fill(op, candidate, b[1]))))


def _lane_fill(op: str, candidate: str, k: int) -> float:
    fill = getattr(_config(op, candidate), "lane_fill", None)
    return fill(k) if fill else 1.0


def _training(tables: list[Table], op: str, m: int, pdl: bool, flashinfer: str | None) -> list[Point]:
    """The measured points to learn from: per table, its flashinfer version nearest the installed
    one and the measured M nearest ``m``, every shape of the op (the first table wins a shape both have)."""
    points: dict[tuple, Point] = {}
    for tab in tables:
        for version in tab.versions_by_distance(flashinfer)[:1]:
            cands = [p for p in tab.points if p.op == op and p.pdl == pdl and p.flashinfer == version]
            if not cands:
                continue
            near = min({p.m for p in cands}, key=lambda x: (abs(x - m), x))
            for p in cands:
                if p.m == near:
                    points.setdefault(p.shape, p)
    return list(points.values())


def estimate(op: str, shape: dict, m: int, pdl: bool, device: Device, tables: list[Table],
             flashinfer: str | None, tiles: Tiles | None = None) -> Decision | None:
    """A synthetic point ranking every estimable candidate, or None (nothing to learn from). ``tiles``:
    the installed flashinfer's fused-A programs (used where every point learnt from was measured on it)."""
    nk = _nk(op, shape)
    train = _training(tables, op, m, pdl, flashinfer) if nk else []
    if not train:
        return None
    if any(p.flashinfer != (flashinfer or "not installed") for p in train):
        tiles = None  # its programs at the measured shapes were another release's
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
            if body(op, cand, *there, tiles) != body(op, cand, *here, tiles):
                continue
            w = math.exp(-(geometry_distance(op, cand, here, there, device.sms, tiles) + extra) / TAU)
            log_regret[cand] = log_regret.get(cand, 0.0) + w * math.log(us / best)
            weight[cand] = weight.get(cand, 0.0) + w
    ref = math.exp(best_log / best_w) if best_w > 0 else 1.0  # ~ the best µs here (display only)
    most = max(weight.values(), default=0.0)
    prior = PRIOR_WEIGHT * most
    margin = {} if tiles is not None else OPAQUE_MARGIN  # flashinfer's programs are known
    predicted = {c: round(ref * math.exp((log_regret[c] + prior * PRIOR_REGRET) / (weight[c] + prior)
                                         + margin.get((op, c), 0.0)), 3)
                 for c in log_regret if weight[c] > 0 and weight[c] >= MIN_WEIGHT * most}
    if not predicted:
        return None
    point = Point(op, _shape_items(shape), m, train[0].flashinfer, pdl,
                  tuple(sorted(predicted.items(), key=lambda cu: (cu[1], cu[0]))))
    match = (f"estimate: each candidate's regret at the {len(train)} measured shapes (M={train[0].m}), weighted by "
             f"how alike its grid lands on {device.sms} SMs (estimate.py); `slim-kernel tune` measures it")
    own = _flashinfer_tile(op, "flashinfer", *here, tiles)
    if own is not None:
        ctas, at_once = grid(op, "flashinfer", *here, device.sms, tiles)
        match += f"; flashinfer {flashinfer} runs its {own.name} program here ({ctas} CTAs, {at_once} at a time)"
    return Decision(point, match, "estimate")
