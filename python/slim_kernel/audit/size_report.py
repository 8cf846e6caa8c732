"""Render a size report (from `size.size_summary`/`size.compare`) as Markdown or a PNG chart."""

from __future__ import annotations

import os


def fmt_bytes(n: int) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{sign}{n:,.0f} {unit}" if unit == "B" else f"{sign}{n:,.1f} {unit}"
        n /= 1024
    return f"{sign}{n} B"


def _name(path: str) -> str:
    return os.path.basename(path)


def markdown(report: dict) -> str:
    s = report["subject"]
    out = [f"# Wheel size: `{_name(s['wheel'])}`", ""]
    wheels = [s] + ([report["baseline"]] if report.get("baseline") else [])
    out += ["| wheel | file | unpacked | native | device code | members |", "|---|---:|---:|---:|---:|---:|"]
    for w in wheels:
        out.append(
            f"| `{_name(w['wheel'])}` | {fmt_bytes(w['file_bytes'])} | {fmt_bytes(w['unpacked'])} | "
            f"{fmt_bytes(w['native_bytes'])} | {fmt_bytes(w['device_bytes'])} | {w['members']} |"
        )
    cmp = report.get("comparison")
    if cmp:
        out += ["", "## Reduction vs baseline", "", "| measure | reduction | percent |", "|---|---:|---:|"]
        for key in ("file_bytes", "unpacked", "native_bytes"):
            d = cmp[key]
            out.append(f"| {key.replace('_', ' ')} | {fmt_bytes(d['bytes'])} | {d['percent']:.1f}% |")
        out.append(
            f"\nMembers: {cmp['members_added']} added, {cmp['members_removed']} removed, "
            f"{cmp['members_changed']} changed. Translation units with device code: "
            f"{cmp['units_added']} added, {cmp['units_removed']} removed."
        )
    if report.get("budget") is not None:
        b = report["budget"]
        verdict = "within" if b["ok"] else "OVER"
        out.append(
            f"\nBudget: {fmt_bytes(b['limit'])} for the wheel file: {verdict} ({fmt_bytes(b['actual'])})."
        )
    for w in wheels:
        out += ["", f"## Retired ops in `{_name(w['wheel'])}` (native bytes)", ""]
        if not w["per_op"]:
            out.append("None found.")
        else:
            out += ["| op | device | host | total | archs | per member |", "|---|---:|---:|---:|---|---|"]
            for op, v in w["per_op"].items():
                per_member = ", ".join(f"`{m}` {fmt_bytes(n)}" for m, n in v["members"].items() if n)
                out.append(
                    f"| `{op}` | {fmt_bytes(v['device'])} | {fmt_bytes(v['host'])} | "
                    f"{fmt_bytes(v['total'])} | {', '.join(v['archs'])} | {per_member} |"
                )
        if w["per_arch"]:
            out += ["", "| arch | entries | stored | unpacked |", "|---|---:|---:|---:|"]
            for arch, v in w["per_arch"].items():
                out.append(
                    f"| {arch} | {v['entries']} | {fmt_bytes(v['stored'])} | {fmt_bytes(v['unpacked'])} |"
                )
    out += [
        "",
        f"## Largest members of `{_name(s['wheel'])}`",
        "",
        "| member | compressed | unpacked |",
        "|---|---:|---:|",
    ]
    for m in s["largest"]:
        out.append(f"| `{m['member']}` | {fmt_bytes(m['compressed'])} | {fmt_bytes(m['unpacked'])} |")
    if s["per_translation_unit"]:
        out += [
            "",
            "## Largest translation units (device code)",
            "",
            "| unit | stored | archs |",
            "|---|---:|---|",
        ]
        for u in s["per_translation_unit"]:
            out.append(f"| `{u['unit']}` | {fmt_bytes(u['stored'])} | {', '.join(u['archs'])} |")
    if cmp:
        for key, title in (("member", "Member"), ("unit", "Translation-unit (device code)")):
            rows = cmp[f"{key}_diff"]
            if not rows:
                continue
            out += [
                "",
                f"## {title} diff vs baseline (largest changes)",
                "",
                f"| {key} | status | baseline | subject | delta |",
                "|---|---|---:|---:|---:|",
            ]
            for c in rows:
                out.append(
                    f"| `{c[key]}` | {c['status']} | {fmt_bytes(c['baseline'])} | "
                    f"{fmt_bytes(c['subject'])} | {fmt_bytes(c['delta'])} |"
                )
    if report.get("command"):
        out += ["", f"Command: `{report['command']}`"]
    return "\n".join(out) + "\n"


def human(report: dict) -> str:
    s = report["subject"]
    lines = [
        f"{_name(s['wheel'])}: {fmt_bytes(s['file_bytes'])} file, {fmt_bytes(s['unpacked'])} unpacked, "
        f"{fmt_bytes(s['native_bytes'])} native ({fmt_bytes(s['device_bytes'])} device code), "
        f"{s['members']} members, scanned in {s['seconds']:.1f} s"
    ]
    for op, v in s["per_op"].items():
        lines.append(
            f"  retired op {op}: {fmt_bytes(v['total'])} native "
            f"({fmt_bytes(v['device'])} device, {fmt_bytes(v['host'])} host)"
        )
    cmp = report.get("comparison")
    if cmp:
        b = report["baseline"]
        lines.append(
            f"vs {_name(b['wheel'])} ({fmt_bytes(b['file_bytes'])} file, {fmt_bytes(b['unpacked'])} unpacked): "
            f"file {fmt_bytes(cmp['file_bytes']['bytes'])} smaller ({cmp['file_bytes']['percent']:.1f}%), "
            f"unpacked {fmt_bytes(cmp['unpacked']['bytes'])} smaller ({cmp['unpacked']['percent']:.1f}%)"
        )
    if report.get("budget") is not None:
        b = report["budget"]
        lines.append(
            f"budget {fmt_bytes(b['limit'])}: {'ok' if b['ok'] else 'EXCEEDED'} "
            f"(wheel file is {fmt_bytes(b['actual'])})"
        )
    return "\n".join(lines)


def png(report: dict, path: str) -> None:
    """Stacked bar per wheel: retired-op native bytes, other device code, host code, other files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    wheels = [report["subject"]] + ([report["baseline"]] if report.get("baseline") else [])
    parts = ("retired ops (native)", "other device code", "other host native code", "non-native files")
    colors = ("#d62728", "#1f77b4", "#9467bd", "#bbbbbb")
    rows = []
    for w in wheels:
        retired = sum(v["total"] for v in w["per_op"].values())
        device = max(w["device_bytes"] - sum(v["device"] for v in w["per_op"].values()), 0)
        host = max(w["host_native_bytes"] - sum(v["host"] for v in w["per_op"].values()), 0)
        other = max(w["unpacked"] - w["native_bytes"], 0)
        rows.append([retired, device, host, other])
    fig, ax = plt.subplots(figsize=(10, 1.8 + 0.9 * len(wheels)))
    labels = [_name(w["wheel"]) for w in wheels]
    left = [0.0] * len(wheels)
    for i, (part, color) in enumerate(zip(parts, colors)):
        vals = [r[i] / 2**20 for r in rows]
        ax.barh(labels, vals, left=left, color=color, label=part)
        left = [a + b for a, b in zip(left, vals)]
    for y, w in enumerate(wheels):
        ax.text(
            left[y],
            y,
            f"  {fmt_bytes(w['unpacked'])} unpacked / {fmt_bytes(w['file_bytes'])} file",
            va="center",
            fontsize=8,
        )
    ax.set_xlabel("MiB unpacked")
    ax.set_xlim(0, max(left) * 1.45 if max(left) else 1)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, frameon=False)
    ax.set_title("Wheel size by content", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
