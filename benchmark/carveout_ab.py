"""The shared-memory carveout A/B: SLIM_KERNEL_SMEM_ROOM=0 (the driver's carveout) against ``--room``, interleaved.

    python benchmark/carveout_ab.py --json carveout_ab.json [--room 32768] [--flashinfer 0.7.4] [--list]

At every named point M 1-16 of the routing table (``--table``, default the installed one) whose pick is a JIT
configuration whose carveout the room changes (one CTA per SM at the driver's smallest carveout that holds the
CTAs the grid puts on an SM, against ``jit/runtime.carveout_percent``), and at GLM-5's two shapes, the pick is
timed at both rooms (three rounds, the median) after three producers: ``plain`` and ``pdl`` (``timing.producers``)
and ``fadd``, flashinfer's ``fused_add_rmsnorm`` with PDL (what sglang runs before these GEMMs: 24-29 KB of shared
memory per CTA). On GLM-5's shapes every anchor of ``bench_gemm.py`` is timed too. ``--list`` prints the points
and stops (no GPU). The committed readings: ``benchmark/results/h200/carveout_ab_fi074.json.gz``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python"), str(ROOT / "benchmark")]

from slim_kernel import models, routing  # noqa: E402
from slim_kernel.jit import catalogue as cat  # noqa: E402
from slim_kernel.jit.catalogue import SMEM_PER_SM, SMEM_RESERVED_PER_CTA  # noqa: E402
from slim_kernel.jit.runtime import carveout_percent  # noqa: E402

CAPACITIES_KB = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)  # the SM90 shared-memory carveouts
GLM5 = [(models.ROUTER, (256, 6144, "float32"), m) for m in range(8, 14)] + \
       [(models.FUSED_A, (2624, 6144, "bfloat16"), m) for m in (1, 2, 4, 6, 8)]


def capacity(nbytes: float) -> int:
    return next((c for c in CAPACITIES_KB if c * 1024 >= nbytes), CAPACITIES_KB[-1])


def points(table: dict, flashinfer: str, room: int, sms: int, per_sm: int) -> dict:
    """``{(op, (n, k, out), m): {candidate}}``: the picks whose carveout ``room`` changes, and GLM-5's shapes."""
    out: dict = {}
    for e in routing.flat_entries(table):
        pick = min(e["us"], key=e["us"].get)
        if dict(e["versions"]).get("flashinfer") != flashinfer or e["m"] > 16 or not pick.startswith("jit:"):
            continue
        shape, op, m = e["shape"], e["op"], e["m"]
        n, k = shape.get("n", shape.get("e")), shape["k"]
        cfg = cat.VARIANTS[op].get(pick[4:])
        if cfg is None:
            continue
        smem, (grid, _, cluster) = cfg.smem(m, (n, k)), cfg.geometry(n, k, sms)
        ctas = grid[0] * grid[1] * grid[2]
        pct = carveout_percent(smem, ctas, sms, per_sm, room, cluster is not None)
        block = smem + SMEM_RESERVED_PER_CTA
        if pct is not None and capacity(min(per_sm // block, -(-ctas // sms)) * block) != capacity(pct * per_sm / 100):
            out.setdefault((op, (n, k, shape.get("out", "bfloat16")), m), set()).add(pick)
    for key in GLM5:
        out.setdefault(key, set()).add("jit:stream_r32w4p2" if key[0] == models.FUSED_A else "jit:narrow_r2t384k6c104")
    return out


def fadd_producer(tp, gen):
    """flashinfer's fused_add_rmsnorm with PDL writing the activation in place (values drift; timings do not)."""
    import flashinfer.norm as fi_norm
    import torch

    res = torch.randn(tp.x.shape, generator=gen, device=tp.x.device, dtype=torch.float32).to(tp.x.dtype)
    gamma = torch.randn(tp.x.shape[1], generator=gen, device=tp.x.device, dtype=torch.float32).to(tp.x.dtype)
    return lambda: fi_norm.fused_add_rmsnorm(tp.x, res, gamma, 1e-6, enable_pdl=True)


def set_room(room: int) -> None:
    """The room for the next plans, and every loaded kernel back at the driver's carveout."""
    from slim_kernel.jit import runtime

    os.environ["SLIM_KERNEL_SMEM_ROOM"] = str(room)
    for kernel in list(runtime._KERNELS.values()):
        if kernel.carveout != -1:
            kernel.impl.set_attribute(runtime.CARVEOUT_ATTR, -1)
            kernel.carveout = -1


def measure(todo: dict, room: int, sglang: str | None) -> list[dict]:
    import torch
    from anchors import Anchors, columns

    from slim_kernel import timing, tune

    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(0)
    anchors = Anchors([], sglang)
    rows = []
    for key, names in sorted(todo.items(), key=lambda kv: (kv[0] not in GLM5, kv[0])):
        op, (n, k, out), m = key
        shape = models.router(n, k, out) if op == models.ROUTER else models.fused_a(n, k)
        tp = tune.Workload(shape, m, dev, gen)
        extra = columns(anchors.for_shape(shape, tp)) if key in GLM5 else {}
        for producer, fn in (("plain", tp.producers["plain"]), ("pdl", tp.producers["pdl"]),
                             ("fadd", fadd_producer(tp, gen))):
            step = timing.DecodeStep(fn, len(tp.weights))
            reads: dict = {}
            for _ in range(3):
                for r in (0, room):
                    set_room(r)
                    fns = {**tune.candidates(tp, producer != "plain"), **extra}
                    for name in sorted(names | set(extra) if r == room else names):
                        reads.setdefault((name, r), []).append(step.time(tp.calls(fns[name])))
            rows += [{"op": op, "n": n, "k": k, "out": out, "m": m, "producer": producer, "name": name, "room": r,
                      "us": round(statistics.median(v), 3)} for (name, r), v in sorted(reads.items())]
            print(f"{shape.label()} M={m} {producer}: " + " ".join(
                f"{name}@{r}={statistics.median(v):.3f}" for (name, r), v in sorted(reads.items())), flush=True)
    os.environ.pop("SLIM_KERNEL_SMEM_ROOM", None)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="the readings to write (required unless --list)")
    ap.add_argument("--room", type=int, default=32768)
    ap.add_argument("--flashinfer", default="0.7.4", help="the table's flashinfer version whose picks are timed")
    ap.add_argument("--table", default=str(ROOT / "python" / "slim_kernel" / "tables" / "routing_sm90.json"))
    ap.add_argument("--sglang", help="a directory holding sglang's JIT kernels (else an installed sglang)")
    ap.add_argument("--list", action="store_true", help="print the points (an H200's 132 SMs, 228 KB) and stop")
    args = ap.parse_args(argv)
    if args.room <= 0:
        ap.error("--room must be a positive number of bytes")
    table = json.loads(Path(args.table).read_text())
    if args.list:
        for key, names in sorted(points(table, args.flashinfer, args.room, 132, SMEM_PER_SM).items()):
            print(key, sorted(names))
        return 0
    if not args.json:
        ap.error("--json is required")
    import torch

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    todo = points(table, args.flashinfer, args.room, props.multi_processor_count, props.shared_memory_per_multiprocessor)
    rows = measure(todo, args.room, args.sglang)
    Path(args.json).write_text(json.dumps({"command": " ".join(["python3", "benchmark/carveout_ab.py", *sys.argv[1:]]),
                                           "device": props.name, "flashinfer": args.flashinfer, "room": args.room,
                                           "rows": rows}, indent=0))
    print(f"{len(rows)} readings -> {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
