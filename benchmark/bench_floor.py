"""How close to the DRAM floor can any kernel reading the fused-A / router weights get in the decode step?

A read-only probe (``benchmark/floor_probe.cuh``, compiled through slim_kernel.jit): a grid of one CTA per SM
(or two) streams its contiguous share of exactly the weight bytes into shared memory through a ring of bulk
copies and mbarriers (the copy path of a GEMM fed by bulk copies, without any math) and stores one folded word
per CTA (checked against the host's fold of the same bytes before it is timed). It is timed as bench_gemm times
the GEMMs: the decode-step pattern after the plain (PDL-unaware) producer, weights rotated over more than twice
the L2 (``slim_kernel/timing.py``). Swept in the same run: ring stages x bytes per stage x bytes per bulk
copy x CTAs per SM (the configurations whose shared memory fits). Per case: the bytes, the steady floor
(bytes / the bandwidth of a plain 1 GiB device copy, ``harness.copy_bandwidth``, measured in the same run), the
probe's best time and its configuration, and the graph launch floor. A short table last; everything to --json.

    python benchmark/bench_floor.py --json OUT.json [--stages 4,8,16] [--stage-kb 8,16,32] [--copy-kb 1,4]
                                    [--ctas-per-sm 1,2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROBE = Path(__file__).resolve().parent / "floor_probe.cuh"
THREADS = 160  # kProbeThreads in floor_probe.cuh: a loader warp and four reader warps
BARRIER_BYTES = 1024  # kProbeBarrierBytes
MAX_STAGES = 48


def cases() -> list[tuple[str, int, int]]:
    """(label, rows, K) of every weight read: the fused-A shapes of models.py, the router weights 256 and 384 x 7168."""
    from slim_kernel import models
    from slim_kernel.names import FUSED_A

    fused = dict.fromkeys((s.n, s.k) for s in models.all_shapes() if s.op == FUSED_A)
    return ([(f"fused-A {n} x {k}", n, k) for n, k in fused] +
            [(f"router {e} x 7168", e, 7168) for e in (256, 384)])


def _ints(name: str, lo: int, hi: int):
    def parse(text: str) -> tuple[int, ...]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items or not all(t.isdigit() and lo <= int(t) <= hi for t in items):
            raise argparse.ArgumentTypeError(f"{name} wants a comma-separated list of integers in {lo}..{hi}, "
                                             f"got {text!r}")
        return tuple(dict.fromkeys(int(t) for t in items))
    return parse


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--stages", type=_ints("--stages", 2, MAX_STAGES), default=(4, 8, 16), help="ring stages")
    ap.add_argument("--stage-kb", type=_ints("--stage-kb", 1, 227), default=(8, 16, 32), help="KiB per stage")
    ap.add_argument("--copy-kb", type=_ints("--copy-kb", 1, 227), default=(1, 4), help="KiB per bulk copy")
    ap.add_argument("--ctas-per-sm", type=_ints("--ctas-per-sm", 1, 8), default=(1, 2), help="CTAs per SM")
    return ap.parse_args(argv)


def configs(args: argparse.Namespace, lim) -> list[dict]:
    """Every swept (stages, stage bytes, copy bytes, CTAs per SM) whose CTAs fit an SM's shared memory (``lim``:
    slim_kernel.jit.arch limits), a copy no larger than its stage and dividing it."""
    out = []
    for cps in args.ctas_per_sm:
        for stages in args.stages:
            for skb in args.stage_kb:
                for ckb in args.copy_kb:
                    smem = BARRIER_BYTES + stages * skb * 1024
                    if (skb % ckb or smem > lim.smem_per_block
                            or cps * (smem + lim.smem_reserved_per_cta) > lim.smem_per_sm):
                        continue
                    out.append({"stages": stages, "stage_bytes": skb * 1024, "copy_bytes": ckb * 1024,
                                "ctas_per_sm": cps, "smem": smem})
    return out


def expected_folds(w, grid: int):
    """The xor of the 32-bit words of each CTA's share of ``w``'s bytes (floor_probe.cuh's split), as int32."""
    import torch

    words = w.reshape(-1).view(torch.int32)
    per = -(-(words.numel() // 4) // grid) * 4  # a CTA's 16-byte words, as 32-bit words
    folds = torch.zeros(grid * per, dtype=torch.int32, device=w.device)
    folds[:words.numel()] = words
    folds = folds.view(grid, per)
    while folds.shape[1] > 1:
        if folds.shape[1] % 2:
            folds = torch.nn.functional.pad(folds, (0, 1))
        folds = folds[:, 0::2] ^ folds[:, 1::2]
    return folds[:, 0]


def probe_case(label: str, rows: int, k: int, cfgs: list[dict], sms: int, dev: int, log) -> list[dict]:
    """The probe's decode-step µs per configuration for one weight (each checked first)."""
    import torch

    from slim_kernel import jit
    from slim_kernel.jit.spec import KernelInstance
    from slim_kernel.timing import DecodeStep, copies_for, producers, rotating

    w = torch.randn((rows, k), device="cuda", dtype=torch.float32).to(torch.bfloat16)
    nbytes = w.numel() * w.element_size()
    ws = rotating(w, copies_for(nbytes, True))
    step = DecodeStep(producers(torch.empty((1, k), device="cuda", dtype=torch.bfloat16))["plain"], len(ws))
    out = torch.empty(max(c["ctas_per_sm"] for c in cfgs) * sms, dtype=torch.int32, device="cuda")
    results = []
    for i, c in enumerate(cfgs):
        inst = KernelInstance.make(str(PROBE), "floor_probe", "plp", FP_STAGES=c["stages"], FP_STAGE=c["stage_bytes"],
                                   FP_COPY=c["copy_bytes"])
        kernel = jit.get_kernel(inst, dev)
        why = kernel.launch_reason(THREADS, c["smem"])
        if why is not None:
            results.append(c | {"skipped": why})
            continue
        grid, carveout = c["ctas_per_sm"] * sms, kernel.launch_carveout(100)

        def call(x, grid=grid, kernel=kernel, smem=c["smem"], carveout=carveout):
            kernel.launch((grid, 1, 1), (THREADS, 1, 1), (x.data_ptr(), nbytes, out.data_ptr()),
                          stream=torch.cuda.current_stream().cuda_stream, smem=smem, carveout=carveout)

        out.fill_(0)
        call(w)
        torch.cuda.synchronize()
        if not torch.equal(out[:grid], expected_folds(w, grid)):
            raise RuntimeError(f"floor_probe {c} read {label} wrong: its folded words differ from the host's")
        us = step.time([lambda x=x: call(x) for x in ws])
        results.append(c | {"grid": grid, "us": us})
        log(f"{label}: {i + 1}/{len(cfgs)} configurations, last {us:.2f} us")
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench_floor: needs a CUDA GPU", file=sys.stderr)
        return 2
    from slim_kernel import jit
    from slim_kernel.jit.arch import limits

    import harness as H

    t0 = last = time.time()

    def log(line: str) -> None:  # a line every few seconds
        nonlocal last
        if time.time() - last >= 5:
            print(f"[{time.time() - t0:5.0f} s] {line}", flush=True)
            last = time.time()

    dev = torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    cfgs = configs(args, limits(jit.arch_for_device(dev)))
    if not cfgs:
        print("bench_floor: no swept configuration fits this GPU's shared memory", file=sys.stderr)
        return 2
    copy_bw, launch_floor = H.copy_bandwidth(), H.graph_launch_floor()
    rows = []
    for label, n, k in cases():
        probes = probe_case(label, n, k, cfgs, sms, dev, log)
        timed = [p for p in probes if "us" in p]
        if not timed:
            raise RuntimeError(f"{label}: no configuration launched: {'; '.join(p['skipped'] for p in probes)}")
        best = min(timed, key=lambda p: p["us"])
        nbytes = n * k * 2
        floor = nbytes / copy_bw * 1e6
        rows.append({"case": label, "rows": n, "k": k, "bytes": nbytes, "steady_floor_us": floor,
                     "graph_launch_floor_us": launch_floor, "best": best, "best_over_floor": best["us"] / floor,
                     "probes": probes})
        print(f"{label}: best {best['us']:.2f} us ({best_label(best)}), floor {floor:.2f} us", flush=True)
    meta = {"device": H.device_name(), "torch": torch.__version__, "sms": sms, "copy_GBps": copy_bw / 1e9,
            "pattern": "decode step after the plain producer, weights cold (slim_kernel/timing.py)",
            "command": H.command_line(), "seconds": time.time() - t0}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\n{meta['device']}: device copy {copy_bw / 1e12:.2f} TB/s (read + write), graph launch floor "
          f"{launch_floor:.2f} us")
    print(f"{'case':<22}{'MB':>7}{'floor us':>10}{'probe us':>10}{'x floor':>9}  best configuration")
    for r in rows:
        print(f"{r['case']:<22}{r['bytes'] / 1e6:>7.1f}{r['steady_floor_us']:>10.2f}{r['best']['us']:>10.2f}"
              f"{r['best_over_floor']:>9.2f}  {best_label(r['best'])}")
    print(f"wrote {args.json}")
    return 0


def best_label(p: dict) -> str:
    return (f"{p['stages']} stages x {p['stage_bytes'] >> 10} KiB, {p['copy_bytes'] >> 10} KiB copies, "
            f"{p['ctas_per_sm']} CTA/SM")


if __name__ == "__main__":
    raise SystemExit(main())
