"""The package's layout rules (CPU, no torch needed): no import cycle and no import up the layers
(tools/import_graph.py), every run-time ``SLIM_KERNEL_*`` variable declared in knobs.py, no module over
500 lines."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "slim_kernel"


def test_no_import_cycle_and_no_upward_import(capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    import import_graph

    assert import_graph.main([]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "cycles: 0" in out and "upward imports: 0" in out


def test_a_cycle_is_found():
    sys.path.insert(0, str(ROOT / "tools"))
    import import_graph

    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_graph.cycles(graph) == [["a", "b", "c"]]
    assert import_graph.upward({"slim_kernel.routing": {"slim_kernel.backends.jit"}}) == [
        ("slim_kernel.routing", "slim_kernel.backends.jit")]


def test_every_run_time_variable_is_declared_in_knobs():
    from slim_kernel import knobs

    declared = {v for v in vars(knobs).values() if isinstance(v, str) and v.startswith("SLIM_KERNEL_")}
    assert declared <= set(knobs.VARIABLES)
    elsewhere = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "knobs.py" or "audit" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) \
                    and str(node.value.value).startswith("SLIM_KERNEL_"):
                elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not elsewhere, f"declare these in slim_kernel/knobs.py: {elsewhere}"


def test_no_module_over_500_lines():
    long = [f"{p.relative_to(ROOT)}: {n}" for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500]
    assert not long
