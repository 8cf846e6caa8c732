"""Summarise `ncu --csv` output of benchmark/profile_gemm.py: one line per profiled kernel.

    python3 benchmark/ncu_table.py ncu.csv     (or a gzipped ncu.csv.gz, as committed)
"""

from __future__ import annotations

import csv
import gzip
import sys
from collections import defaultdict

SHORT = {
    "gpu__time_duration.sum": "us",
    "dram__bytes_read.sum": "DRAM MB",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %",
    "lts__t_bytes.sum": "L2 MB",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "stall lsb",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "stall bar",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio": "stall lg",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": "stall mio",
    "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio": "stall sleep",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 %",
    "lts__t_sector_hit_rate.pct": "L2 hit %",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed": "L1 %",
    "smsp__inst_executed.sum": "insts",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
    "launch__registers_per_thread": "regs",
    "launch__shared_mem_config_size": "smem KB",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "stall wait",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": "stall ssb",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": "stall math",
    "smsp__warps_active.avg.pct_of_peak_sustained_active": "occup %",
    "l1tex__t_sector_hit_rate.pct": "L1 hit %",
    "sm__cycles_active.avg": "SM act cy",
    "gpc__cycles_elapsed.max": "cycles",
}
SCALE = {"gpu__time_duration.sum": ("nsecond", 1e-3), "dram__bytes_read.sum": ("byte", 1e-6),
         "lts__t_bytes.sum": ("byte", 1e-6), "launch__shared_mem_config_size": ("byte", 1e-3)}
UNITS = {"usecond": 1e3, "msecond": 1e6, "nsecond": 1, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def main(path: str) -> int:
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    rows = list(csv.DictReader(lines))
    kernels: dict = defaultdict(dict)
    for r in rows:
        key = (r.get("ID"), r.get("Kernel Name", "?"))
        name, unit, value = r.get("Metric Name"), r.get("Metric Unit", ""), r.get("Metric Value", "")
        try:
            v = float(value.replace(",", ""))
        except ValueError:
            continue
        if name in SCALE:
            base, factor = SCALE[name]
            v = v * UNITS.get(unit, 1) / UNITS.get(base, 1) * factor
        kernels[key][name] = v
    cols = list(SHORT)
    print(f"{'kernel (nvtx label)':<70}" + "".join(f"{SHORT[c]:>10}" for c in cols))
    for (_, name), vals in kernels.items():
        print(f"{name[:69]:<70}" + "".join(f"{vals.get(c, float('nan')):>10.2f}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
