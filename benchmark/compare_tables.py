"""How two routing tables' picks compare where both measured a point (same op, shape, M, launch context,
flashinfer version): how often they agree, and what each one's pick costs by the other's times.

    python3 benchmark/compare_tables.py A.json B.json

A and B: tables `slim-kernel tune` writes (the cache directory's ``routing/``), or the shipped
``python/slim_kernel/tables/routing_sm90.json``. Two tune runs on one GPU give the run-to-run spread
that any difference against the shipped table has to be read against. No GPU needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from slim_kernel import routing, tune  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    data, tables = {}, {}
    for path in (args.a, args.b):
        try:
            data[path] = json.loads(path.read_text())
            tables[path] = routing.parse(data[path], str(path))[0]
        except (OSError, ValueError, TypeError, KeyError) as exc:
            print(f"compare_tables: {path}: {exc}", file=sys.stderr)
            return 2
    lines = []
    for mine, other in ((args.a, args.b), (args.b, args.a)):
        costs = tune.pick_costs(routing.flat_entries(data[mine]), tables[other])
        lines.append(f"{mine.name}: " + (tune.describe_costs(costs, other.name) if costs
                                         else f"no point in common with {other.name}"))
    print("\n".join(lines))  # one write: `| head -1` does not break the pipe mid-way
    return 0


if __name__ == "__main__":
    sys.exit(main())
