"""The crafted layout wheels and real AOT wheels, audited in a subprocess under resource limits
(tests/audit_fixtures/bounded.py), and the markdown table of several such runs.

Each run records, per crafted case: exit code, ops found, wall and CPU seconds and peak RSS of
the audit's process tree, the 1-minute load average before it, the refusal message; per real
wheel, the same as the median of --repeat runs, with and without `c++filt` on PATH, plus a
digest of the findings and mentions (the same digest: the same findings, to the byte).
A run is kept in <out>/crafted-<label>.json (rows measured again replace older ones);
`table` writes the columns of several labels as markdown. Used by `bench_audit.py --crafted`
and `bench_audit.py --crafted-table`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from audit_fixtures import GXX, NVCC  # noqa: E402
from audit_fixtures.bounded import audit_cmd, run_bounded  # noqa: E402
from audit_fixtures.layouts import BENCH_ONLY, CASES  # noqa: E402
from audit_fixtures.verdicts import CASES as VERDICTS  # noqa: E402

# the verdict cases in the layout cases' shape: (builder, tools needed, exit code, ops, phrase)
VERDICT_CASES = {name: (build, (), code, ops, None) for name, (build, code, ops, _) in VERDICTS.items()}

ADDRESS_SPACE = 16 << 30  # per process: generous, the "before" code of some cases needs GiBs
NOTE = 160  # characters of a refusal message kept
TOOLS = {"g++": GXX, "nvcc": NVCC}  # what the fixtures build with, where found


def _env(tree: Path, python: str, cxxfilt: bool) -> dict:
    """The audit's environment: `tree` on PYTHONPATH; PATH without c++filt (nor any binutils:
    a slim image) unless `cxxfilt`."""
    path = os.environ["PATH"] if cxxfilt else os.path.dirname(python)
    return dict(os.environ, PYTHONPATH=str(tree), PATH=path)


def _audit(wheel: Path, python: str, env: dict, timeout: float) -> tuple[dict, dict | None]:
    """One audit: its measurements, and its JSON result (None when it printed none)."""
    load = os.getloadavg()[0]
    cmd = [python, *audit_cmd(wheel, "--time-limit", str(timeout))[1:]]
    run = run_bounded(cmd, timeout=timeout + 30, address_space=ADDRESS_SPACE, env=env, keep_stdout=1 << 30)
    try:
        res = json.loads(run.stdout)["wheels"][0]
        note = res.get("error", "").replace(f"{wheel.parent}/", "")  # no machine paths in results
    except (ValueError, KeyError, IndexError):
        res, note = None, (run.stderr.strip().splitlines() or ["-"])[-1]
    row = {
        "exit": run.rc,
        "ops": res["ops_found"] if res else None,
        "wall_s": round(run.wall, 2),
        "cpu_s": round(run.cpu, 2),
        "peak_rss_mib": round(run.peak_mib),
        "load_1m": round(load, 2),
        "note": note[:NOTE],
    }
    return row, res


def run_cases(tree: Path, names: list[str], timeout: float, python: str) -> dict:
    """Each crafted case (all of CASES, BENCH_ONLY and the verdict cases by default), built in a
    temporary directory and audited once without c++filt on PATH."""
    cases = {**CASES, **BENCH_ONLY, **VERDICT_CASES}
    env = _env(tree, python, cxxfilt=False)
    rows = {}
    with tempfile.TemporaryDirectory(prefix="crafted-") as tmp:
        for name in names or cases:
            build, needs, code, ops, _ = cases[name]
            if not all(TOOLS[t] for t in needs):
                rows[name] = {"skipped": f"needs {needs}"}
                continue
            work = Path(tmp) / name
            work.mkdir()
            wheel = build(work)
            row, _ = _audit(wheel, python, env, timeout)
            rows[name] = {
                "wheel_bytes": wheel.stat().st_size,
                **row,
                "expected_exit": code,
                "expected_ops": ops,
            }
            print(name, rows[name], flush=True)
            shutil.rmtree(work)
    return rows


def _digest(res: dict) -> str:
    doc = json.dumps([res["findings"], res.get("mentions", [])], sort_keys=True).encode()
    return hashlib.sha256(doc).hexdigest()[:16]


def run_real(tree: Path, wheels: list[Path], timeout: float, python: str, repeat: int) -> dict:
    """Each real wheel, `repeat` times without and with c++filt on PATH: the medians of wall
    and CPU seconds, the largest peak RSS, the findings per layer and their digest."""
    rows = {}
    for wheel in wheels:
        for cxxfilt in (False, True):
            key = f"{wheel.name} ({'c++filt on PATH' if cxxfilt else 'no c++filt'})"
            env = _env(tree, python, cxxfilt)
            if cxxfilt and shutil.which("c++filt", path=env["PATH"]) is None:
                rows[key] = {"skipped": "no c++filt on this machine"}
                continue
            runs = [_audit(wheel, python, env, timeout) for _ in range(repeat)]
            (row, res), meas = runs[-1], [r for r, _ in runs]
            layers: dict[str, int] = {}
            for f in res["findings"] if res else []:
                layers[f["layer"]] = layers.get(f["layer"], 0) + 1
            rows[key] = {
                **row,
                "wall_s": statistics.median(r["wall_s"] for r in meas),
                "cpu_s": statistics.median(r["cpu_s"] for r in meas),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in meas),
                "runs": [{k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_mib", "load_1m")} for r in meas],
                "findings": len(res["findings"]) if res else None,
                "findings_per_layer": layers,
                "mentions": len(res.get("mentions", [])) if res else None,  # older trees report no mentions
                "digest": _digest(res) if res else None,
            }
            print(key, rows[key], flush=True)
    return rows


def scrub(args: list[str]) -> str:
    """The command line with no machine paths: repository paths relative, others `DIR/NAME`."""
    out = []
    for arg in map(str, args):
        path = Path(arg)
        if path.is_absolute():
            arg = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else f"DIR/{path.name}"
        out.append(arg)
    return shlex.join(["python", "benchmark/bench_audit.py", *out])


def record(out: Path, label: str, describe: str, command: str, cases: dict, real: dict) -> Path:
    """Merge a run into <out>/crafted-<label>.json (rows measured now replace older ones)."""
    path = out / f"crafted-{label}.json"
    doc = json.loads(path.read_text()) if path.exists() else {"label": label, "cases": {}, "real": {}}
    doc.update(describe=describe or doc.get("describe", label), cpus=os.cpu_count())
    doc.setdefault("runs", []).append(
        {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "load_average": os.getloadavg()}
    )
    doc["cases"].update(cases)
    doc["real"].update(real)
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def _cell(row: dict | None) -> str:
    if not row:
        return "-"
    if "skipped" in row:
        return f"skipped ({row['skipped']})"
    cell = f"{row['exit']}, {row['ops'] or '-'}, {row['wall_s']}, {row['cpu_s']}, {row['peak_rss_mib']}"
    wrong = "expected_exit" in row and (row["exit"], row["ops"]) != (
        row["expected_exit"],
        row["expected_ops"],
    )
    return ("✗ " if wrong else "") + cell + (f" ({row['note'][:70]})" if row.get("note") else "")


def _real_cell(row: dict | None) -> str:
    if not row or "skipped" in row:
        return _cell(row)
    loads = ", ".join(str(r["load_1m"]) for r in row["runs"])
    return (
        f"{row['exit']}, {len(row['ops'] or [])} ops, {row['findings']} findings "
        f"(`{row['digest']}`), {row['wall_s']}, {row['cpu_s']}, {row['peak_rss_mib']} (load {loads})"
    )


def table(out: Path, labels: list[str]) -> str:
    """crafted.md: one column per label (in order), a row per crafted case and per real wheel."""
    docs = [json.loads((out / f"crafted-{label}.json").read_text()) for label in labels]
    lines = [
        "# Crafted layout wheels: " + " / ".join(d["describe"] for d in docs),
        "",
        "Produced by `python benchmark/bench_audit.py --crafted-table " + " ".join(labels) + "` from",
        "`crafted-<label>.json` here, each written by `python benchmark/bench_audit.py --crafted` "
        "(commands below). The audit runs in a subprocess under `RLIMIT_AS` with no c++filt on PATH "
        "(a slim image) unless a row says otherwise; wall and CPU seconds and the peak RSS are those "
        "of its process tree. The machine has "
        f"{docs[-1]['cpus']} cores and is shared: wall times grow with the load average (given per "
        "real-wheel run; per case in the JSON), CPU times are the comparable figure. ✗: the exit code or "
        "the ops are not what the case should give.",
        "",
    ]
    for d in docs:
        for r in d["runs"]:
            load = ", ".join(f"{x:.1f}" for x in r["load_average"])
            lines.append(f"- {d['describe']}: `{r['command']}` ({r['date']}, load after: {load})")
    head = " | ".join(f"{d['describe']}: exit, ops, wall s, CPU s, RSS MiB" for d in docs)
    lines += ["", f"| case | {head} |", "|---" * (len(docs) + 1) + "|"]
    names = list(dict.fromkeys(n for d in docs for n in d["cases"]))
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_cell(d["cases"].get(name)) for d in docs) + " |")
    real = list(dict.fromkeys(n for d in docs for n in d["real"]))
    if real:
        head = " | ".join(
            f"{d['describe']}: exit, ops, findings (digest), wall s, CPU s, RSS MiB" for d in docs
        )
        lines += [
            "",
            "Real wheels (medians of the runs; the digest covers every finding and mention: the same "
            "digest, the same findings):",
            "",
            f"| wheel | {head} |",
            "|---" * (len(docs) + 1) + "|",
        ]
        for name in real:
            lines.append(f"| {name} | " + " | ".join(_real_cell(d["real"].get(name)) for d in docs) + " |")
    return "\n".join(lines) + "\n"
