"""Large-wheel audit speed: `slim-kernel audit` vs the naive pipeline, side by side in one run.

Naive pipeline (what one would type by hand): `unzip` the wheel to a temp dir, then for every
native library `nm -DC --defined-only`, `strings` and `cuobjdump -symbols` (pip package
`nvidia-cuda-cuobjdump`), grepping each output for the retired op names.

    python benchmark/bench_audit.py [--wheel PATH] [--out benchmark/results/audit]
    python benchmark/bench_audit.py --crafted [--tree DIR] [--label after] [--describe TEXT]
        [--case NAME ...] [--real WHEEL ...] [--no-cases] [--repeat N]
    python benchmark/bench_audit.py --crafted-table LABEL [LABEL ...]

Without --wheel, sgl-kernel 0.3.21 (535 MB, manylinux x86_64 cp310-abi3) is downloaded with
`pip download` into --download-dir (outside the repository).

--crafted: the crafted layout wheels (tests/audit_fixtures/layouts.py) and the --real wheels, each
audited by the package in --tree (a `python/` directory: this checkout's by default, or an
export of an older commit for a "before" column) in a subprocess (benchmark/audit_crafted.py):
exit code, ops found, wall and CPU seconds, peak RSS, load; merged into <out>/crafted-<label>.json.
--crafted-table: <out>/crafted.md from the crafted-<label>.json of the labels given, in order.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))  # the tree under test, as for the audit runs below
sys.path.insert(0, str(REPO / "tests"))  # _wheels.cached_download
from _wheels import cached_download  # noqa: E402

from slim_kernel.names import OPS  # noqa: E402 (torch-free)

DEFAULT_SPEC = "sgl-kernel==0.3.21"
CONTROL_SPEC = "flashinfer-python==0.7.2"
OP_RE = re.compile(r"(?<![A-Za-z0-9])(" + "|".join(map(re.escape, OPS)) + r")(?![A-Za-z0-9])")


def download(spec: str, dest: Path) -> Path:
    wheel, why = cached_download(spec, dest)
    if wheel is None:
        raise SystemExit(f"cannot download {spec}: {why}")
    return wheel


def find_cuobjdump() -> str | None:
    tool = shutil.which("cuobjdump")
    if tool:
        return tool
    spec = importlib.util.find_spec("nvidia")
    for root in list(spec.submodule_search_locations or []) if spec else []:
        hits = glob.glob(os.path.join(root, "*", "bin", "cuobjdump"))
        if hits:
            return hits[0]
    return None


def run_slim(wheel: Path, jobs: int | None, repeat: int) -> dict:
    cmd = [sys.executable, "-m", "slim_kernel", "audit", "--json", "--no-progress", str(wheel)]
    if jobs:
        cmd += ["--jobs", str(jobs)]
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    runs, loads = [], []
    for _ in range(repeat):
        loads.append(round(os.getloadavg()[0], 2))
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        runs.append(round(time.perf_counter() - start, 2))
    seconds = statistics.median(runs)
    peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    (res,) = json.loads(proc.stdout)["wheels"]
    per_layer = {}
    for f in res["findings"]:
        per_layer.setdefault(f["layer"], set()).add(f["op"])
    return {
        "command": " ".join(cmd[1:]).replace(sys.executable, "python"),
        "exit_code": proc.returncode,
        "wall_seconds": round(seconds, 2),
        "runs_seconds": runs,
        "load_average_before_runs": loads,
        "peak_rss_bytes_largest_process": peak_rss,
        "isal_inflate": importlib.util.find_spec("isal") is not None,
        "reported_seconds": res["seconds"],
        "ops_found": res["ops_found"],
        "findings": len(res["findings"]),
        "ops_per_layer": {k: sorted(v) for k, v in sorted(per_layer.items())},
        "findings_per_layer": {k: v["findings"] for k, v in res["layers"].items()},
        "routed_mentions": sum(r["count"] for r in res["routed"]),
    }


def run_control(wheel: Path) -> dict:
    """A wheel that names the ops only in Python, JIT sources and METADATA: must be clean."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    cmd = [sys.executable, "-m", "slim_kernel", "audit", "--json", "--no-progress", str(wheel)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    (res,) = json.loads(proc.stdout)["wheels"]
    kinds: dict[str, int] = {}
    for r in res["routed"]:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + r["count"]
    return {
        "wheel": wheel.name,
        "exit_code": proc.returncode,
        "clean": res["clean"],
        "seconds": res["seconds"],
        "members": res["members"],
        "findings": len(res["findings"]),
        "routed_by_kind": kinds,
    }


def _grep(text: str) -> set[str]:
    return set(OP_RE.findall(text))


def run_naive(wheel: Path, cuobjdump: str | None) -> dict:
    load = round(os.getloadavg()[0], 2)
    stages = {"unzip": 0.0, "nm -DC": 0.0, "strings": 0.0, "cuobjdump -symbols": 0.0}
    found: dict[str, set[str]] = {k: set() for k in stages}
    with tempfile.TemporaryDirectory(prefix="naive-audit-") as tmp:
        t = time.perf_counter()
        subprocess.run(["unzip", "-q", str(wheel), "-d", tmp], check=True)
        stages["unzip"] = time.perf_counter() - t
        libs = [p for p in Path(tmp).rglob("*") if p.is_file() and _is_elf(p)]
        for lib in libs:
            for stage, cmd in (
                ("nm -DC", ["nm", "-DC", "--defined-only", str(lib)]),
                ("strings", ["strings", str(lib)]),
                ("cuobjdump -symbols", [cuobjdump, "-symbols", str(lib)] if cuobjdump else None),
            ):
                if cmd is None:
                    continue
                t = time.perf_counter()
                out = subprocess.run(cmd, capture_output=True, text=True, errors="replace").stdout
                stages[stage] += time.perf_counter() - t
                found[stage] |= _grep(out)
    return {
        "load_average_before": load,
        "native_files": len(libs),
        "stage_seconds": {k: round(v, 2) for k, v in stages.items()},
        "wall_seconds": round(sum(stages.values()), 2),
        "ops_per_stage": {k: sorted(v) for k, v in found.items()},
        "ops_found": sorted(set().union(*found.values())),
        "cuobjdump": cuobjdump or "not found",
    }


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


def markdown(result: dict) -> str:
    s, n = result["slim_kernel"], result["naive"]
    lines = [
        "# Audit speed on a large AOT kernel wheel",
        "",
        f"Wheel: `{result['wheel']}` ({result['wheel_bytes'] / 1e6:,.0f} MB file, {result['cpus']} CPUs: {result['cpu']})",
        "",
        f"Command: `{result['command']}`",
        "",
        "| pipeline | wall s | ops found |",
        "|---|---:|---|",
        f"| `slim-kernel audit` (median of runs {s['runs_seconds']}) | {s['wall_seconds']:.1f} "
        f"| {', '.join(s['ops_found'])} |",
        f"| naive (unzip, nm -DC, strings, cuobjdump -symbols) | {n['wall_seconds']:.1f} | {', '.join(n['ops_found'])} |",
        "",
        f"Speed-up: {result['speedup']:.1f}x. Peak RSS of the largest audit process: "
        f"{s['peak_rss_bytes_largest_process'] / 2**20:,.0f} MiB; ISA-L inflate: {s['isal_inflate']}. "
        f"Load average before the runs: {s['load_average_before_runs']} (audit), "
        f"{n['load_average_before']} (naive; other work shared this 2-core machine).",
        "",
        "Naive stages (s): " + ", ".join(f"{k} {v}" for k, v in n["stage_seconds"].items()),
        "",
        "Findings per layer (slim-kernel audit): "
        + ", ".join(f"{k} {v}" for k, v in s["findings_per_layer"].items() if v),
        "",
        "Ops per layer: " + "; ".join(f"{k}: {', '.join(v)}" for k, v in s["ops_per_layer"].items()),
        "",
        "Controls (must be clean; op names there are routed/info only): "
        + "; ".join(
            f"`{c['wheel']}` clean={c['clean']} (exit {c['exit_code']}, {c['seconds']} s, "
            f"{c['members']} members, routed mentions {c['routed_by_kind']})"
            for c in result["controls"]
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--crafted", action="store_true", help="measure the crafted layout wheels instead")
    p.add_argument("--tree", type=Path, default=REPO / "python", help="--crafted: the package tree to run")
    p.add_argument("--label", default="after", help="--crafted: name of the result file")
    p.add_argument("--describe", default="", help="--crafted: the column's title (default: the label)")
    p.add_argument("--case", action="append", default=[], help="--crafted: only these cases")
    p.add_argument("--no-cases", action="store_true", help="--crafted: only the --real wheels")
    p.add_argument("--real", action="append", type=Path, default=[], help="--crafted: real wheels to audit")
    p.add_argument("--timeout", type=float, default=60.0, help="--crafted: seconds per case")
    p.add_argument("--python", default=sys.executable, help="--crafted: interpreter that runs the audit")
    p.add_argument("--crafted-table", nargs="+", metavar="LABEL", help="write <out>/crafted.md")
    p.add_argument("--wheel", type=Path, help=f"wheel to audit (default: download {DEFAULT_SPEC})")
    p.add_argument("--download-dir", type=Path, default=Path(tempfile.gettempdir()) / "wheels")
    p.add_argument("--out", type=Path, default=REPO / "benchmark" / "results" / "audit")
    p.add_argument("--jobs", type=int, default=None)
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--repeat", type=int, default=3, help="audit runs of a (real) wheel, median reported")
    p.add_argument(
        "--control",
        action="append",
        default=None,
        metavar="SPEC_OR_WHEEL",
        help=f"wheels that must audit clean (op names only in Python/JIT/METADATA; default {CONTROL_SPEC})",
    )
    args = p.parse_args(argv)
    command = "python benchmark/bench_audit.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.crafted_table or args.crafted:
        import audit_crafted  # the fixtures' tree on sys.path: only when needed

        command = audit_crafted.scrub(argv if argv is not None else sys.argv[1:])
    if args.crafted_table:
        (args.out / "crafted.md").write_text(audit_crafted.table(args.out, args.crafted_table))
        return 0
    if args.crafted:
        tree = args.tree.resolve()
        cases = {} if args.no_cases else audit_crafted.run_cases(tree, args.case, args.timeout, args.python)
        real = audit_crafted.run_real(tree, args.real, args.timeout, args.python, args.repeat)
        print("wrote", audit_crafted.record(args.out, args.label, args.describe, command, cases, real))
        return 0
    wheel = args.wheel or download(DEFAULT_SPEC, args.download_dir)
    slim = run_slim(wheel, args.jobs, args.repeat)
    print(f"slim-kernel audit: {slim['wall_seconds']} s, ops {slim['ops_found']}", flush=True)
    controls = [
        run_control(c if Path(c).exists() else download(c, args.download_dir))
        for c in (args.control or [CONTROL_SPEC])
    ]
    for c in controls:
        print(f"control {c['wheel']}: clean={c['clean']} routed={c['routed_by_kind']}", flush=True)
    naive = None if args.skip_naive else run_naive(wheel, find_cuobjdump())
    if naive:
        print(f"naive pipeline: {naive['wall_seconds']} s, ops {naive['ops_found']}", flush=True)
    cpu = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""
    )
    result = {
        "command": command,
        "wheel": wheel.name,
        "wheel_bytes": wheel.stat().st_size,
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "slim_kernel": slim,
        "naive": naive,
        "speedup": round(naive["wall_seconds"] / slim["wall_seconds"], 2) if naive else None,
        "controls": controls,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    if naive:
        (args.out / f"{stem}.md").write_text(markdown(result))
    print(f"wrote {args.out / (stem + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
