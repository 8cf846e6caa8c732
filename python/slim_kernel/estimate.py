"""Estimated µs per call for a shape no table measured (or a GPU with another SM count).

Torch-free. These GEMMs stream a weight of ``W = N * K * 2`` bytes once. How fast a kernel
configuration streams it depends on its grid on the device: ``G`` CTAs, of which ``slots`` run at
a time (CTAs per SM from its block size, shared memory and registers, times the SM count). Each
running CTA pulls at most ``B_cta`` bytes/ns (what its loads in flight allow), all of them
together at most the HBM's ``B_hbm``; the SM that gets a CTA in every wave finishes last:

    us = a + waves * (W / G) / min(B_cta, B_hbm / min(G, slots))      waves = ceil(G / slots)

``G``, ``slots`` and ``waves`` come from ``jit/catalogue.py`` (geometry, shared memory) for JIT
configurations; flashinfer's and torch's grids are unknown, so theirs is one CTA per SM.
``B_hbm`` is the read bandwidth the table's run measured. Per candidate (and body: narrow's
straight-line body for one K is fitted apart from its generic one), ``a`` (the fixed cost: launch,
ramp, reduction) and ``B_cta`` are fitted on every measured shape of the op at the same M and
launch context (least squares over a grid of ``B_cta``).

The estimate must never pick a candidate that can be far slower than the others, so each
prediction is made conservative by how well the candidate's fit generalizes: times (1 + its largest
leave-one-out error over the measured shapes; 10% where only two shapes were measured), and 5% more
where the shape's weight lies outside the measured ones' range (an extrapolation). A candidate
whose time depends on choices we cannot see (flashinfer picking its own program per shape) shows
up as a large leave-one-out error and loses to the ones whose geometry predicts them, or, where the
measured shapes all fell in its windows, gets ``OPAQUE_MARGIN`` (5%) on top. Only
candidates measured at two or more shapes are estimated; selection ranks the eligible backends by
these conservative times as it does by measurements, and ``slim-kernel info`` shows how each was made.
"""

from __future__ import annotations

import math

from .routing import Decision, Device, Point, Table, _shape_items

EXTRAPOLATION_MARGIN = 1.05
UNTESTED_FIT_MARGIN = 0.10
# flashinfer's tinygemm_bf16 picks its own program per shape from windows it measured (0.7.4 on SM90):
# on a shape it was not measured at, what it runs, and so its time, cannot be told from the others
OPAQUE_MARGIN = {("dsv3_fused_a_gemm", "flashinfer"): 0.05}
DEFAULT_HBM_GBPS = 4000.0  # where a table does not say (GB/s = bytes/ns)
MAX_THREADS_PER_SM = 2048
REGS_PER_SM = 65536
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED = 1024  # the driver's per-CTA reservation
ASSUMED_REGS = 128  # an uncapped kernel's registers per thread where the catalogue does not say
B_CTA_GRID = [2.0 * 1.12 ** i for i in range(64)]  # 2 .. ~2500 bytes/ns


def _nk(op: str, shape: dict) -> tuple[int, int] | None:
    n = shape.get("e", shape.get("n"))
    k = shape.get("k")
    return (n, k) if isinstance(n, int) and isinstance(k, int) else None


def grid(op: str, candidate: str, n: int, k: int, m: int, sms: int) -> tuple[int, int]:
    """(CTAs, CTAs running at once) of ``candidate`` at (N, K, M) on ``sms`` SMs."""
    backend, _, variant = candidate.partition(":")
    cfg = None
    if backend == "jit":
        from .jit.catalogue import VARIANTS

        cfg = VARIANTS.get(op, {}).get(variant)
    if cfg is None:  # flashinfer, torch: a grid we do not know, assumed one CTA per SM
        return sms, sms
    dims, block, _ = cfg.geometry(n, k, sms)
    ctas = dims[0] * dims[1] * dims[2]
    threads = block[0] * block[1] * block[2]
    regs = getattr(cfg, "regs", 0) or ASSUMED_REGS
    per_sm = max(1, min(MAX_THREADS_PER_SM // threads, REGS_PER_SM // (threads * regs),
                        SMEM_PER_SM // (cfg.smem(m) + SMEM_RESERVED), 32))
    return ctas, sms * per_sm


def stream_us(weight: float, ctas: int, slots: int, b_cta: float, b_hbm: float) -> float:
    waves = -(-ctas // slots)
    return waves * (weight / ctas) / min(b_cta, b_hbm / min(ctas, slots)) / 1e3


def _fit(samples: list[tuple[float, int, int, float]], b_hbm: float) -> tuple[float, float]:
    """(a, B_cta) minimising the squared error of ``a + stream_us`` over (W, G, slots, us) samples."""
    best = (math.inf, 0.0, B_CTA_GRID[0])
    for b_cta in B_CTA_GRID:
        xs = [stream_us(w, g, s, b_cta, b_hbm) for w, g, s, _ in samples]
        a = max(0.0, sum(y - x for x, (_, _, _, y) in zip(xs, samples)) / len(samples))
        sse = sum((a + x - y) ** 2 for x, (_, _, _, y) in zip(xs, samples))
        if sse < best[0]:
            best = (sse, a, b_cta)
    return best[1], best[2]


def body(op: str, candidate: str, n: int, k: int, m: int) -> str:
    """Which compiled body ``candidate`` runs at (N, K, M): narrow configurations have a straight-line
    one for their K alone (catalogue ``Narrow.exact_for``) and a generic one, timed apart."""
    backend, _, variant = candidate.partition(":")
    if backend != "jit":
        return ""
    from .jit.catalogue import VARIANTS

    cfg = VARIANTS.get(op, {}).get(variant)
    exact_for = getattr(cfg, "exact_for", None)
    return "exact" if exact_for is not None and exact_for(m, (n, k)) else ""


def _predict(rows, weight: float, grid_: tuple[int, int], b_hbm: float) -> float:
    a, b_cta = _fit(rows, b_hbm)
    return a + stream_us(weight, *grid_, b_cta, b_hbm)


def _loo_error(rows, b_hbm: float) -> float:
    """The largest relative error predicting one measured shape from the others (leave-one-out):
    how far this candidate's fit generalizes. With two shapes there is nothing to hold out:
    UNTESTED_FIT_MARGIN."""
    if len(rows) < 3:
        return UNTESTED_FIT_MARGIN
    worst = 0.0
    for i, (w, g, sl, y) in enumerate(rows):
        rest = rows[:i] + rows[i + 1:]
        worst = max(worst, abs(_predict(rest, w, (g, sl), b_hbm) - y) / y)
    return worst


def _training(tables: list[Table], op: str, m: int, pdl: bool, flashinfer: str | None,
              shape: dict) -> list[Point]:
    """The measured points to fit on: per table, its flashinfer version nearest the installed one,
    the measured M nearest ``m``; for the router, the same output dtype where two shapes have it."""
    points: dict[tuple, Point] = {}
    for tab in tables:
        for version in tab.versions_by_distance(flashinfer)[:1]:
            cands = [p for p in tab.points if p.op == op and p.pdl == pdl and p.flashinfer == version]
            if not cands:
                continue
            near = min({p.m for p in cands}, key=lambda x: (abs(x - m), x))
            for p in cands:
                if p.m == near:
                    points.setdefault(p.shape, p)  # the first table (tuned) wins a shape both have
    chosen = list(points.values())
    out = shape.get("out")
    same = [p for p in chosen if dict(p.shape).get("out") == out]
    return same if out is not None and len({p.shape for p in same}) >= 2 else chosen


def estimate(op: str, shape: dict, m: int, pdl: bool, device: Device, tables: list[Table],
             flashinfer: str | None) -> Decision | None:
    """A synthetic point with every estimable candidate's predicted µs, or None (nothing to fit)."""
    nk = _nk(op, shape)
    if nk is None:
        return None
    train = _training(tables, op, m, pdl, flashinfer, shape)
    b_hbm = next((t.hbm_gbps for t in tables if t.hbm_gbps), DEFAULT_HBM_GBPS)
    samples: dict[tuple[str, str], list[tuple[float, int, int, float]]] = {}
    for p in train:
        pnk = _nk(op, dict(p.shape))
        if pnk is None:
            continue
        for cand, us in p.us:
            samples.setdefault((cand, body(op, cand, *pnk, p.m)), []).append(
                (pnk[0] * pnk[1] * 2, *grid(op, cand, *pnk, p.m, device.sms), us))
    predicted = {}
    weight, slots = nk[0] * nk[1] * 2, {}
    for (cand, kind), rows in samples.items():
        if kind != body(op, cand, *nk, m) or len({w for w, *_ in rows}) < 2:
            continue  # another body than this shape would run (narrow's straight-line one), or too few shapes
        slots[cand] = grid(op, cand, *nk, m, device.sms)
        us = _predict(rows, weight, slots[cand], b_hbm) * (1 + _loo_error(rows, b_hbm) + OPAQUE_MARGIN.get((op, cand), 0))
        if not min(w for w, *_ in rows) <= weight <= max(w for w, *_ in rows):
            us *= EXTRAPOLATION_MARGIN
        predicted[cand] = round(us, 3)
    if not predicted:
        return None
    version = train[0].flashinfer if train else (flashinfer or "not installed")
    point = Point(op, _shape_items(shape), m, version, pdl,
                  tuple(sorted(predicted.items(), key=lambda cu: (cu[1], cu[0]))))
    shapes = len({p.shape for p in train})
    match = (f"estimate: each candidate's fixed cost and per-CTA bandwidth fitted on {shapes} measured shapes "
             f"at M={train[0].m}, its grid on {device.sms} SMs, plus its leave-one-out error (estimate.py); "
             f"`slim-kernel tune` measures it")
    return Decision(point, match, "estimate")
