"""Cold start of N ranks on one JIT cache: time to first result per rank, compiles across ranks.

    python3 benchmark/cold_start.py [--procs N] [--json F] [--sglang DIR] [--ms 1-16] [--rotate] [--skip-anchors]

N processes start at once (default one per visible GPU; ``--procs N`` places them round-robin, so all on
the one GPU of a single-GPU machine) with torch.distributed-style RANK / WORLD_SIZE / LOCAL_RANK and no
process group (nothing waits on NCCL). Role ``ours``: each rank makes the first call of every routed
instance, each (op, DeepSeek-V3 shape, M, launch context) the routing table picks (``slim-kernel info``'s
picks: router E=256 K=7168 fp32/bf16, fused-A N=2112 K=7168), with the PDL knob set to that context.
Role ``anchors``: flashinfer's and sglang's GEMMs (benchmark/anchors.py; an installed sglang or
``--sglang DIR``): import, then the first call of each at every M. Every result is checked against
float64. Each role runs cold (empty caches), then warm: ours on a ``slim-kernel precompile``d
SLIM_KERNEL_CACHE_DIR, the anchors on the caches their cold run filled. Compiles are counted from the
JIT cache's trace (SLIM_KERNEL_JIT_TRACE): cold, each routed JIT instance exactly once across ranks; warm,
none. Exit 1 when a rank failed, a result was wrong or a count broke that rule.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests")]
SCHEMA = 1
T0_ENV = "COLD_START_T0"  # time.monotonic() of the parent when it launched the rank (system-wide clock)
MAX_M = 64
COLUMNS = {"torch_import_s": "torch", "cuda_init_s": "cuda", "import_s": "import", "first_result_s": "first",
           "all_results_s": "all"}  # a rank's milestones, seconds from its launch


def ms_list(text: str) -> list[int]:
    """``"1-16"`` or ``"1,4,8"`` -> M values in 1..MAX_M (argparse reports the error as ``argument --ms``)."""
    from slim_kernel.tune import parse_ms

    try:
        return parse_ms(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ms must list M values in 1..{MAX_M} like '1-16' or '1,4,8', got {text!r}") from None


def parse_args(argv=None) -> argparse.Namespace:
    def procs(text):
        if not text.strip().isdigit() or int(text) < 1:
            raise argparse.ArgumentTypeError(f"--procs must be a positive int, got {text!r}")
        return int(text)

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=procs, help="ranks (default: one per visible GPU)")
    p.add_argument("--ms", type=ms_list, default=list(range(1, 17)), help="M values (default 1-16)")
    p.add_argument("--json", help="write the report here")
    p.add_argument("--sglang", help="a standalone copy of sglang's JIT kernels (else an installed sglang)")
    p.add_argument("--skip-anchors", action="store_true", help="no flashinfer/sglang phase")
    p.add_argument("--other-caches", choices=("fresh", "inherit"), default="fresh",
                   help="flashinfer's and sglang's JIT caches: fresh per role (default) or the environment's")
    p.add_argument("--rotate", action="store_true",
                   help="rank r starts its call list r/N of the way in (ranks compile different instances at once)")
    p.add_argument("--work-dir", help="caches, traces and rank logs go here (default: a temporary dir, removed)")
    p.add_argument("--timeout", type=float, default=540.0, help="seconds a phase may take (default 540)")
    args = p.parse_args(argv)
    if args.sglang and not Path(args.sglang).is_dir():
        p.error(f"--sglang: {args.sglang!r} is not a directory")
    if args.timeout <= 0:
        p.error(f"--timeout must be positive, got {args.timeout}")
    return args


# ---- the launcher ----------------------------------------------------------------------------

def _progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"[cold_start] {message}", file=sys.stderr, flush=True)


def count_compiles(trace: Path) -> dict:
    """What the JIT cache's compile trace says: compiles, distinct cache keys, keys compiled more than once."""
    events = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()] if trace.exists() else []
    compiles = [e for e in events if e.get("event") == "compile"]
    per_key = Counter(e["key"] for e in compiles)
    return {"count": len(compiles), "keys": len(per_key), "more_than_once": sorted(k for k, n in per_key.items() if n > 1),
            "pids": len({e["pid"] for e in compiles}), "seconds": round(sum(e["seconds"] for e in compiles), 3),
            "invalid_entries": sum(e.get("event") == "invalid" for e in events)}


def run_phase(args, role: str, cache: str, dirs: dict, procs: int, gpus: int, work: Path) -> dict:
    trace = work / f"{cache}-{role}.trace"
    trace.unlink(missing_ok=True)
    env = {**os.environ, "SLIM_KERNEL_CACHE_DIR": str(dirs["slim"]), "SLIM_KERNEL_JIT_TRACE": str(trace),
           "WORLD_SIZE": str(procs), "LOCAL_WORLD_SIZE": str(procs)}
    if args.other_caches == "fresh":
        env.update(FLASHINFER_WORKSPACE_BASE=str(dirs["flashinfer"]), SGLANG_JIT_CACHE_DIR=str(dirs["sglang"]))
    cmd = [sys.executable, str(HERE / "cold_start_rank.py"), role, "--ms", ",".join(map(str, args.ms))]
    cmd += (["--sglang", args.sglang] if args.sglang else []) + (["--rotate"] if args.rotate else [])
    _progress(f"{cache} {role}: {procs} ranks on {gpus} GPU(s)")
    start, running = time.monotonic(), []
    for rank in range(procs):
        out, log = work / f"{cache}-{role}-rank{rank}.json", work / f"{cache}-{role}-rank{rank}.log"
        out.unlink(missing_ok=True)
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), T0_ENV: repr(time.monotonic())}
        with open(log, "w") as f:
            running.append((rank, out, log, subprocess.Popen(
                [*cmd, "--out", str(out), "--device", str(rank % gpus)], env=rank_env, stdout=f, stderr=subprocess.STDOUT)))
    ranks = []
    for rank, out, log, proc in running:
        try:
            proc.wait(timeout=max(1.0, args.timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        entry = json.loads(out.read_text()) if out.exists() else {"rank": rank, "calls": [], "notes": []}
        if proc.returncode and "error" not in entry:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            entry["error"] = f"exit status {proc.returncode}: {' | '.join(tail)}"
        ranks.append(entry)
    phase = {"cache": cache, "role": role, "wall_s": round(time.monotonic() - start, 3), "ranks": ranks,
             "compiles": count_compiles(trace),
             "routed_jit_instances": len({c["instance"] for r in ranks for c in r["calls"] if c.get("instance")})}
    phase["problems"] = problems(phase)
    _progress(f"{cache} {role}: {phase['wall_s']:.1f} s, {len(phase['problems'])} problem(s)")
    return phase


def problems(phase: dict) -> list[str]:
    """What makes the phase fail: a rank error, a wrong result, a compile count off the rule."""
    out = [f"rank {r['rank']}: {r['error']}" for r in phase["ranks"] if r.get("error")]
    out += [f"rank {r['rank']}: WRONG {c['pick']} {c['op']} {c['shape']} M={c['m']} rel err {c['rel_err']}"
            for r in phase["ranks"] for c in r["calls"] if not c["ok"]]
    comp = phase["compiles"]
    if phase["role"] == "ours" and phase["cache"] == "cold":
        if comp["more_than_once"]:
            out.append(f"{len(comp['more_than_once'])} cache keys compiled more than once across ranks")
        if comp["keys"] != phase["routed_jit_instances"]:
            out.append(f"{comp['keys']} instances compiled, {phase['routed_jit_instances']} routed JIT instances")
    if phase["role"] == "ours" and phase["cache"] == "warm" and comp["count"]:
        out.append(f"{comp['count']} compiles with a precompiled cache")
    return out


def precompile(cache_dir: Path) -> dict:
    from slim_kernel.names import FUSED_A, ROUTER

    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "slim_kernel", "precompile", "--cache-dir", str(cache_dir),
                           "--no-progress", "--ops", ROUTER, FUSED_A], capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return {"seconds": round(time.monotonic() - start, 3), "exit": proc.returncode, "summary": lines[-1] if lines else ""}


def render(report: dict) -> str:
    """The table printed last: per phase and rank, seconds from the rank's launch to each milestone."""
    lines = [f"cold start: {report['procs']} ranks on {report['gpus']} GPU(s) ({report['device']}), M {report['ms'][0]}-"
             f"{report['ms'][-1]}; seconds from each rank's launch",
             f"{'phase':<14}{'rank':>5} {'device':<8}" + "".join(f"{h:>8}" for h in COLUMNS.values()) + "   calls wrong"]
    for ph in report["phases"]:
        for r in ph["ranks"]:
            cells = "".join("       -" if r.get(k) is None else f"{r[k]:>8.2f}" for k in COLUMNS)
            lines.append(f"{ph['cache'] + ' ' + ph['role']:<14}{r['rank']:>5} {r.get('device', '?'):<8}{cells}"
                         f"{len(r['calls']):>8}{sum(not c['ok'] for c in r['calls']):>6}"
                         + (f"  ERROR {r['error']}" if r.get("error") else ""))
    for ph in report["phases"]:
        c, pre, by = ph["compiles"], ph.get("precompile"), Counter()
        for call in ph["ranks"][0]["calls"] if ph["ranks"] else ():
            by[call["pick"].partition(":")[0]] += call["seconds"]
        lines.append(f"{ph['cache']} {ph['role']}: wall {ph['wall_s']:.1f} s; {c['count']} compiles of {c['keys']} "
                     f"instances in {c['pids']} ranks ({c['seconds']:.1f} s); {ph['routed_jit_instances']} routed JIT "
                     f"instances" + (f"; precompile {pre['seconds']:.1f} s" if pre else "")
                     + (f"; rank 0 calls by backend: {', '.join(f'{k} {v:.2f} s' for k, v in by.items())}" if by else "")
                     + "".join(f"\n  PROBLEM {p}" for p in ph["problems"]))
        if ph["role"] == "anchors" and ph["ranks"]:
            r = ph["ranks"][0]
            firsts = {f"{c['pick']} {c['op']}{' ' + c['shape']['out'] if 'out' in c['shape'] else ''}": c["seconds"]
                      for c in reversed(r["calls"])}
            lines.append(f"  rank 0 imports {r.get('imports')}; first calls: "
                         + ", ".join(f"{k} {v:.2f}" for k, v in reversed(firsts.items())))
    return "\n".join(lines + [f"note: {n}" for n in report["notes"]])


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not gpus:
        print("cold_start: no CUDA device is visible", file=sys.stderr)
        return 2
    procs = args.procs or gpus
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="cold_start."))
    report = {"schema": SCHEMA, "command": " ".join(sys.argv), "procs": procs, "gpus": gpus,
              "device": torch.cuda.get_device_name(0), "ms": args.ms, "other_caches": args.other_caches,
              "rotate": args.rotate, "phases": [], "notes": []}
    roles = ("ours",) if args.skip_anchors else ("ours", "anchors")
    for cache in ("cold", "warm"):
        for role in roles:
            dirs = {name: work / role / name for name in ("slim", "flashinfer", "sglang")}
            pre = None
            if cache == "cold" or role == "ours":
                shutil.rmtree(dirs["slim"] if cache == "warm" else work / role, ignore_errors=True)
            if cache == "warm" and role == "ours":
                _progress("slim-kernel precompile")
                pre = precompile(dirs["slim"])
            phase = run_phase(args, role, cache, dirs, procs, gpus, work)
            if pre is not None:
                phase["precompile"] = pre
                if pre["exit"]:
                    phase["problems"].append(f"precompile exited {pre['exit']}: {pre['summary']}")
            report["phases"].append(phase)
    report["notes"] += sorted({n for ph in report["phases"] for r in ph["ranks"] for n in r["notes"]})
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    print(render(report))
    return 1 if any(ph["problems"] for ph in report["phases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
