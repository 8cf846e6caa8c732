"""`slim-kernel size WHEEL [--baseline WHEEL] [--json] [--markdown F] [--png F] [--budget SIZE]`.

Exit 0: report written (and within budget); 1: the wheel file is over `--budget`;
2: a wheel could not be read, or a bad argument; 3: a package is missing (matplotlib for
--png: checked before the scan). Never imports torch (matplotlib only for --png).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from .cli import (  # EXIT_INTERNAL: `slim-kernel` reports a crash as 4, never as 1 (over budget)
    EXIT_FOUND,
    EXIT_INTERNAL,  # noqa: F401
    EXIT_MISSING,
    EXIT_UNREADABLE,
    add_common_arguments,
    context_from_args,
)
from .findings import SCHEMA
from .limits import AuditInputError, MissingDependencyError
from .runner import scan_wheel
from .size import compare, parse_size, size_summary
from .size_report import human, markdown, png

EXIT_OK, EXIT_OVER_BUDGET = 0, EXIT_FOUND


def add_arguments(parser) -> None:
    parser.add_argument("wheel", metavar="WHEEL", help="the wheel to measure")
    parser.add_argument("--baseline", metavar="WHEEL", help="wheel to compare against (e.g. the AOT build)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--json-file", metavar="FILE", help="also write the JSON report to FILE")
    parser.add_argument("--markdown", metavar="FILE", help="write a Markdown report")
    parser.add_argument("--png", metavar="FILE", help="write a PNG chart (needs matplotlib)")
    parser.add_argument(
        "--budget",
        metavar="SIZE",
        help="fail (exit 1) when the wheel file is larger, e.g. 5MB, 512KiB, 1048576",
    )
    add_common_arguments(parser)


def build_report(args) -> dict:
    """Scan the wheel(s) and assemble the report; raises ValueError / AuditInputError."""
    ctx = context_from_args(args)
    budget = parse_size(args.budget) if args.budget is not None else None
    subject = size_summary(scan_wheel(args.wheel, ctx, jobs=args.jobs, progress=args.progress))
    report = {"schema": SCHEMA, "subject": subject, "retired": ctx.rules.to_json(), "command": _command(args)}
    if args.baseline:
        base = size_summary(scan_wheel(args.baseline, ctx, jobs=args.jobs, progress=args.progress))
        report["baseline"] = base
        report["comparison"] = compare(subject, base)
    for summary in (subject, report.get("baseline")):
        if summary is not None:
            summary.pop("member_sizes")  # only needed for the diffs
            summary.pop("unit_sizes")
    if budget is not None:
        report["budget"] = {
            "limit": budget,
            "actual": subject["file_bytes"],
            "ok": subject["file_bytes"] <= budget,
        }
    return report


def _command(args) -> str:
    """The equivalent command line (recorded in the reports)."""
    parts = ["slim-kernel", "size", args.wheel]
    for flag, value in (("--baseline", args.baseline), ("--budget", args.budget)):
        if value is not None:
            parts += [flag, value]
    for value in args.retired or []:
        parts += ["--retired", value]
    return " ".join(shlex.quote(p) for p in parts)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def run(args) -> int:
    if args.png and not _has_matplotlib():
        print(
            "slim-kernel size: --png needs matplotlib, which is not installed: "
            "pip install 'slim-kernel[audit]' (or pip install matplotlib)",
            file=sys.stderr,
        )
        return EXIT_MISSING
    try:
        report = build_report(args)
    except ValueError as exc:
        print(f"slim-kernel size: error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except AuditInputError as exc:
        print(f"slim-kernel size: cannot read wheel: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    except MissingDependencyError as exc:
        print(f"slim-kernel size: {exc}", file=sys.stderr)
        return EXIT_MISSING
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(report, indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(report))
    if args.png:
        png(report, args.png)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print(human(report))
    budget = report.get("budget")
    if budget is not None and not budget["ok"]:
        print(
            f"slim-kernel size: {args.wheel} is {budget['actual']:,} bytes, over the budget of "
            f"{budget['limit']:,} bytes (--budget {args.budget})",
            file=sys.stderr,
        )
        return EXIT_OVER_BUDGET
    return EXIT_OK
