"""`slim-kernel audit WHEEL... [--json] [--retired OPS] [--time-limit S]`.

Exit 0: no retired AOT code in any wheel; 1: some found; 2: a wheel could not be read
(missing, not a regular file, not a zip, empty, hostile, over a limit or the time limit) or a
bad argument; 3: a package the audit needs is missing; 4: an internal error (the JSON still
holds the wheel with its error). The worst code over all wheels wins. A member that cannot be
parsed is listed as `unreadable` and the rest of the wheel is judged.
`--json` prints one object, ``{"schema": 1, "wheels": [...]}`` (see audit/README.md).
Never imports torch.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

from .findings import SCHEMA, audit_result, error_result, human_report
from .limits import AuditInputError, Limits, MissingDependencyError
from .rules import Rules, parse_retired
from .runner import scan_wheel
from .scan import ScanContext

EXIT_CLEAN, EXIT_FOUND, EXIT_UNREADABLE, EXIT_MISSING, EXIT_INTERNAL = 0, 1, 2, 3, 4
EXIT_CODES = (
    "exit codes: 0 no retired AOT code in any wheel; 1 retired AOT code found; 2 a wheel cannot "
    "be audited (missing, not a zip, hostile, over a limit or --time-limit) or a bad argument; "
    "3 a needed package is missing; 4 an internal error of the audit (a bug: please report it; "
    "the JSON still names the wheel and the error). The highest code over all wheels wins."
)


def add_arguments(parser) -> None:
    parser.epilog = EXIT_CODES
    parser.add_argument("wheels", nargs="+", metavar="WHEEL", help="wheel files to audit")
    parser.add_argument(
        "--json", action="store_true", help='print JSON: {"schema": 1, "wheels": [one object per wheel]}'
    )
    add_common_arguments(parser)


def add_common_arguments(parser) -> None:
    """Options shared with `slim-kernel size`."""
    parser.add_argument(
        "--retired",
        action="append",
        metavar="OPS",
        help="retired op names or prefix globs, comma-separated or repeated "
        "(default: bmm_fp8,dsv3_router_gemm,dsv3_fused_a_gemm,dsv3_*)",
    )
    parser.add_argument(
        "--jobs", type=int, default=None, metavar="N", help="worker processes (default: all cores)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=Limits.max_seconds,
        metavar="S",
        help=f"give up on a wheel (exit 2) after S seconds (default {Limits.max_seconds:g})",
    )
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="always show the progress bar on stderr",
    )
    bar.add_argument(
        "--no-progress", dest="progress", action="store_false", help="never show the progress bar"
    )


def context_from_args(args) -> ScanContext:
    """Build the scan context; raises ValueError naming the bad argument."""
    if args.jobs is not None and args.jobs < 1:
        raise ValueError(f"--jobs: expected a positive number of workers, got {args.jobs}")
    if not args.time_limit > 0:
        raise ValueError(f"--time-limit: expected a positive number of seconds, got {args.time_limit}")
    return ScanContext(Rules(parse_retired(args.retired)), Limits(max_seconds=args.time_limit))


def audit_one(path: str, ctx: ScanContext, jobs=None, progress=None) -> tuple[dict, int]:
    start = time.perf_counter()
    try:
        scan = scan_wheel(path, ctx, jobs=jobs, progress=progress)
    except AuditInputError as exc:
        return error_result(path, str(exc), time.perf_counter() - start, EXIT_UNREADABLE), EXIT_UNREADABLE
    except MissingDependencyError as exc:
        return error_result(path, str(exc), time.perf_counter() - start, EXIT_MISSING), EXIT_MISSING
    except Exception as exc:  # a bug of the audit (MemoryError included): never read as "found"
        message = f"internal error: {type(exc).__name__}: {exc}"
        traceback.print_exc(file=sys.stderr)
        return error_result(path, message, time.perf_counter() - start, EXIT_INTERNAL), EXIT_INTERNAL
    result = audit_result(scan, ctx.rules)
    return result, result["exit_code"]


def run(args) -> int:
    try:
        ctx = context_from_args(args)
    except ValueError as exc:
        print(f"slim-kernel audit: error: {exc}", file=sys.stderr)
        return EXIT_UNREADABLE
    results, code = [], EXIT_CLEAN
    for path in args.wheels:
        result, rc = audit_one(path, ctx, args.jobs, args.progress)
        results.append(result)
        code = max(code, rc)
        if not args.json:
            print(human_report(result), flush=True)
        elif "error" in result:
            print(f"slim-kernel audit: {path}: {result['error']}", file=sys.stderr)
    if args.json:
        json.dump({"schema": SCHEMA, "wheels": results}, sys.stdout, indent=2)
        print()
    return code
