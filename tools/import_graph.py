"""The import graph of ``python/slim_kernel``: its cycles and the imports that run up the layers.

    python3 tools/import_graph.py [--edges] [--root DIR]

Every ``import``/``from ... import`` statement counts, at module level or inside a function, and so
does the package ``__init__`` an import of a submodule runs. The layers, top to bottom (a module
imports only its own layer and those below it):

    commands   cli, info, tune, jit.precompile (what a command runs)
    ops        ops.*
    selection  registry
    backends   backends.* (one module per backend, its implementation and eligibility)
    jit        jit.*, timing (the JIT runtime and the decode-step timer)
    data       routing, estimate, paths, models, knobs, names, devices, pdl, ... (torch-free
               data and leaves: no backend, no JIT cache, no flashinfer)

``audit`` is its own tree (checked for cycles, not layered). Exit status: 0 when there is no cycle
and no upward import, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "python"
PACKAGE = "slim_kernel"
LAYERS = (  # (layer, module prefixes), top first; the first prefix that matches places a module
    ("commands", ("slim_kernel.cli", "slim_kernel.__main__", "slim_kernel.info", "slim_kernel.tune",
                  "slim_kernel.jit.precompile")),
    ("ops", ("slim_kernel.ops",)),
    ("selection", ("slim_kernel.registry",)),
    ("backends", ("slim_kernel.backends",)),
    ("jit", ("slim_kernel.jit", "slim_kernel.timing")),
    ("data", ("slim_kernel.",)),
)


def modules(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([name] if name else []))


def edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the package modules it imports (with the packages those imports run)."""
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node.level, node.module) if node.level else node.module or ""
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in mods else base)
        for target in targets:
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the module and each package its import runs
                name = ".".join(parts[:i])
                if name in mods and name != mod and not mod.startswith(name + ".") and name != PACKAGE:
                    graph[mod].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def layer(module: str) -> int | None:
    if module.startswith("slim_kernel.audit") or module == PACKAGE:
        return None
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p if p.endswith(".") else p + ".") or module == p.rstrip(".")
               for p in prefixes):
            return i
    return None


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    out = []
    for mod, targets in sorted(graph.items()):
        here = layer(mod)
        for target in sorted(targets):
            there = layer(target)
            if here is not None and there is not None and there < here:
                out.append((mod, target))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edges", action="store_true", help="also print every import edge")
    ap.add_argument("--root", type=Path, default=ROOT, help="the directory holding slim_kernel/ (default: python/; "
                                                             "e.g. an exported older commit's)")
    args = ap.parse_args(argv)
    graph = edges(modules(args.root))
    if args.edges:
        for mod, targets in sorted(graph.items()):
            print(f"{mod} -> {', '.join(sorted(targets)) or '-'}")
    found, up = cycles(graph), upward(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports")
    print(f"cycles: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(m.removeprefix(PACKAGE + ".") for m in comp))
    print(f"upward imports: {len(up)}")
    for mod, target in up:
        print(f"  {mod.removeprefix(PACKAGE + '.')} ({LAYERS[layer(mod)][0]}) -> "
              f"{target.removeprefix(PACKAGE + '.')} ({LAYERS[layer(target)][0]})")
    return 1 if found or up else 0


if __name__ == "__main__":
    sys.exit(main())
