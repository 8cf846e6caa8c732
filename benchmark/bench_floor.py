"""How fast can one short kernel read the fused-A / router weights from HBM at all?

The "HBM floor" in bench_gemm divides bytes by the bandwidth of a 2 GiB torch sum (steady
state). A decode GEMM reads only 3.7-30 MB per call, so ramp-up and tail weigh in. This
times plain torch reads of exactly those bytes the way bench_gemm times the GEMMs (same
harness: CUDA-graph replay, weights rotated over > 60 MB L2): a sum over the weights and a
device-to-device copy, so the GEMM numbers can be read against what the memory system gives
a single launch of that size.

    python benchmark/bench_floor.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

import harness as H

CASES = {"fused_a weights (2112 x 7168 bf16)": (2112, 7168), "router weights (256 x 7168 bf16)": (256, 7168),
         "router weights (384 x 7168 bf16)": (384, 7168)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    bw = H.hbm_read_bandwidth()
    rows = []
    for name, shape in CASES.items():
        w = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        nbytes = w.numel() * w.element_size()
        row = {"case": name, "bytes": nbytes, "steady_floor_us": nbytes / bw * 1e6}
        for cache in ("cold", "hot"):
            ws = H.rotating(w, H.copies_for(nbytes, cache == "cold"))
            out = torch.empty((), device="cuda", dtype=torch.float32)
            dst = torch.empty_like(w)
            row[f"torch_sum_{cache}_us"] = H.time_graph(
                [lambda x=x, o=out: torch.sum(x.view(-1), dim=0, dtype=torch.float32, out=o) for x in ws])
            row[f"d2d_copy_{cache}_us"] = H.time_graph([lambda x=x, d=dst: d.copy_(x) for x in ws])
        row["graph_launch_floor_us"] = H.graph_launch_floor()
        rows.append(row)
    meta = {"device": H.device_name(), "torch": torch.__version__, "steady_read_GBps": bw / 1e9,
            "command": " ".join(["python", *sys.argv])}
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(f"steady read bandwidth {bw / 1e12:.2f} TB/s")
    print(f"{'case':<36} {'steady floor':>12} {'sum cold':>9} {'copy cold':>9} {'sum hot':>8}")
    for r in rows:
        print(f"{r['case']:<36} {r['steady_floor_us']:12.2f} {r['torch_sum_cold_us']:9.2f} "
              f"{r['d2d_copy_cold_us']:9.2f} {r['torch_sum_hot_us']:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
