"""The byoc package's import graph, one line per module: what it imports from byoc.

    python scripts/import_graph.py            # print the graph (docs/architecture.md holds a copy)
    python scripts/import_graph.py --check    # exit 1 on an import cycle, a module over the size limit,
                                              # or an import across the rooms' walls (ROOM_RULES)

Both top-level and function-local imports count: a local import hides a dependency, it does not remove it.
tests/test_architecture.py keeps docs/architecture.md equal to this output.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "container" / "byoc"
MAX_LINES = 400  # one concern a module: about this many lines at most


# The package's rooms and who may import whom. A room is the subpackage a module is in; top-level
# modules are the shared floor, except the entry point (cli, which dispatches into every room) and the
# re-exports kept at the import paths users' code depends on (each imports only its room's module).
ROOMS = ("training", "launch", "serving", "encoding")
ENTRY = {"byoc.cli"}
SHIMS = {"byoc.inference", "byoc.handlers", "byoc.metrics", "byoc.job", "byoc.distributed"}
ROOM_RULES = {  # room -> the rooms it must never import
    "floor": {"training", "launch", "serving", "encoding", "entry", "shims"},
    "launch": {"training", "serving", "encoding", "entry", "shims"},
    "training": {"serving", "encoding", "entry", "shims"},
    "serving": {"training", "launch", "encoding", "entry", "shims"},
    "encoding": {"training", "launch", "entry", "shims"},  # (over serving's pipeline: the model as byoc serve's)
}


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {module_name(p, package): p for p in sorted(package.rglob("*.py"))}


def room_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ROOMS:
        return parts[1]
    return "entry" if module in ENTRY else "shims" if module in SHIMS else "floor"


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import across a wall: `a (room) imports b (room)`."""
    return [
        f"{module} ({room_of(module)}) imports {target} ({room_of(target)})"
        for module, targets in sorted(edges.items())
        for target in sorted(targets)
        if room_of(target) in ROOM_RULES.get(room_of(module), set())
    ]


def imports_of(path: Path, known: set[str], package: Path = PACKAGE) -> set[str]:
    """The byoc modules `path` imports (`from byoc import x` counts as byoc.x when that is a module)."""
    name = module_name(path, package)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # byoc.training.data.types.DataError -> byoc.training.data.types
                target = target.rpartition(".")[0]
            if target and target != name and target != "byoc":
                found.add(target)
    return found


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    mods = modules(package)
    return {name: imports_of(path, set(mods), package) for name, path in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return groups


def render(edges: dict[str, set[str]]) -> str:
    """One line per module, modules in dependency order (a module after everything it imports)."""
    order: list[str] = []
    while len(order) < len(edges):
        ready = sorted(m for m in edges if m not in order and edges[m] <= set(order))
        if not ready:  # a cycle: list the rest as they are
            ready = sorted(m for m in edges if m not in order)
        order.extend(ready)
    width = max(len(m) for m in edges)
    return "\n".join(f"{m:<{width}}  <- {', '.join(sorted(edges[m])) or '(nothing in byoc)'}" for m in order)


def oversized() -> list[str]:
    return [
        f"{name}: {n} lines"
        for name, path in modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="fail on an import cycle, an oversized module or an import across rooms"
    )
    options = parser.parse_args()
    edges = graph()
    if not options.check:
        print(render(edges))
        return 0
    problems = [f"import cycle: {' <-> '.join(group)}" for group in cycles(edges)] + oversized()
    problems += [f"across rooms: {v}" for v in layer_violations(edges)]
    print("\n".join(problems) or f"no import cycle; no module over {MAX_LINES} lines; no import across rooms")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
