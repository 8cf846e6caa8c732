"""DRAM-read, L2 and CTA-launch series of each kernel from an ncu PM-sampling report (benchmark/gpu_run.sh PM_ARGS).

    ncu -i pm.ncu-rep --page raw --csv --print-metric-instances values > pm.csv
    python3 benchmark/pm_series.py pm.csv > pm_series.json

Keeps, per profiled kernel, its NVTX label (profile_gemm.py's case and implementation), duration, sampling
interval and the samples around it (two before the first DRAM read above 0.5% of peak, two after the last).
Prints one summary line per kernel to stderr: the DRAM samples, in % of peak.
"""

from __future__ import annotations

import csv
import json
import re
import sys

SERIES = {
    "dram_read_pct": "FBSP.TriageCompute.dramc__read_throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_throughput_pct": "LTS.TriageCompute.lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "ctas_launched": "FE_B.TriageCompute.gr__ctas_launched_realtime.sum",
}
LABEL = re.compile(r"<default domain>:(.*?)(?::none)*\"?\s*$")


def values(cell: str) -> list[float]:
    """``'12 (0; 3.5; ...)'`` (a total, then the instance values) or ``'(0; 3.5)'`` -> the instance values;
    ValueError for a cell ncu could not fill (``no data``, ``n/a``: a result whose replay failed)."""
    inner = re.search(r"\(([^)]*)\)", cell)
    return [float(v) if v.strip() else 0.0 for v in (inner.group(1) if inner else cell).split(";")]


def kernels(rows: list[list[str]]) -> list[dict]:
    head = {name: i for i, name in enumerate(rows[0])}
    missing = [m for m in (*SERIES.values(), "gpu__time_duration.sum", "profiler__pmsampler_interval_time")
               if m not in head]
    if missing:
        raise ValueError(f"not a PM-sampling raw page (--page raw --print-metric-instances values): no {missing[0]}")
    nvtx = next(i for name, i in head.items() if name.startswith("thread Domain:Push/Pop_Range"))
    out = []
    for r in rows[2:]:  # row 1: units
        try:
            series = {key: values(r[head[name]]) for key, name in SERIES.items()}
            duration = float(r[head["gpu__time_duration.sum"]])
        except ValueError:
            print(f"skipped (no samples: its replay failed?): {r[nvtx].strip()[:80]}", file=sys.stderr)
            continue
        busy = [i for i, v in enumerate(series["dram_read_pct"]) if v > 0.5] or [0]
        lo, hi = max(busy[0] - 2, 0), busy[-1] + 3
        label = LABEL.search(r[nvtx])
        out.append({"nvtx": label.group(1) if label else r[nvtx].strip(), "kernel": r[head["Kernel Name"]][:60],
                    "duration_us": duration,
                    "interval_us": values(r[head["profiler__pmsampler_interval_time"]].split()[0])[0],
                    "samples_from": lo, **{k: [round(v, 2) for v in s[lo:hi]] for k, s in series.items()}})
    return out


def main(path: str) -> int:
    with open(path, newline="") as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    found = kernels(rows)
    for k in found:
        print(f"{k['nvtx'][:70]:<70} {k['duration_us']:6.2f} us  DRAM % " + " ".join(f"{v:.0f}" for v in k["dram_read_pct"]),
              file=sys.stderr)
    json.dump({"source": "ncu --section PmSampling (benchmark/gpu_run.sh PM_ARGS), then "
               "python3 benchmark/pm_series.py on its raw page", "kernels": found}, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
