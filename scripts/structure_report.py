"""The package's shape in numbers: module sizes, the longest functions, the import graph.

    python scripts/structure_report.py [--root rlharness] [--json]

Standard library only (`ast`): it reads the sources, it imports nothing of them. It prints
- lines per module of the package (and the total);
- the 15 longest functions (and methods), by lines from `def` to their last line;
- the import graph over the package: one arrow per (importer, imported) pair of modules,
  counting imports at module level AND inside functions (a lazy import is still a
  dependency: it only moves the failure from import time to call time);
- the graph's cycles (strongly connected components with more than one module, or a
  module importing itself);
- arrows that import upward: an importer whose layer in `LAYERS` is below the imported
  module's.

`tests/test_import_graph.py` asserts there is no cycle and no upward arrow.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# The layers, low to high. A module may import from its own layer and the layers below it,
# never from a layer above. Each entry names a package (everything under it): folders are the
# layers, no module is lifted out of its folder. Why this order:
# 0 "base": what every part shares and that knows no part: `core` (the shared data types, the
#   checkpoint format, the run directory's names, the stop controller, fault points for tests,
#   small process helpers) and `weights` (tensor specs, buckets, checksums and payload formats:
#   torch only, so engines, backends and the Ray layer all stand on it without knowing one another).
# 1 "config": the typed, validated run configuration; it describes parts, it builds none and
#   imports none (config validity must not depend on which packages are installed).
# 2 "parts": the components, each built from its own sub-config: the algorithms (pure
#   functions of their `AlgoConf`), data, judgers, the sandbox for untrusted code (the python
#   tool's), the model (loading, LoRA, the tiny models),
#   engines, training backends, agent loops, logging, and `cluster` (the low Ray pieces: bringing
#   Ray up, placement groups, actor options).
# 3 "composites": what wires parts together at run time: the producer (sampler, replay buffer,
#   staleness, strategies, the agent loop manager), the trainer (its loop, batch building, guards,
#   the evaluator), `distributed` (engine and training actors, their proxies, weight routes, the
#   placement planner).
# 4 "assembly": building a run and running it: `launch` (build, the launcher, preflight, resume's
#   override text, the run lock, evaluate.py's logic, submitit's requeue), `export` and `sweep`
#   (the `python -m` tools).
# 5 "entry": the package itself.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["rlharness.core", "rlharness.weights"]),
    ("config", ["rlharness.config"]),
    ("parts", ["rlharness.algo", "rlharness.data", "rlharness.judger", "rlharness.model", "rlharness.sandbox",
               "rlharness.engine",
               "rlharness.backend", "rlharness.agent", "rlharness.logging_utils", "rlharness.cluster",
               "rlharness.health"]),
    ("composites", ["rlharness.producer", "rlharness.trainer", "rlharness.distributed"]),
    ("assembly", ["rlharness.launch", "rlharness.export", "rlharness.sweep"]),
    ("entry", ["rlharness"]),
]


@dataclass
class Report:
    lines: dict[str, int] = field(default_factory=dict)
    functions: list[tuple[int, str]] = field(default_factory=list)  # (lines, module:qualname)
    # importer -> imported -> how ("module" or "function": the first place it was seen at each level)
    imports: dict[str, dict[str, set[str]]] = field(default_factory=lambda: defaultdict(dict))

    @property
    def edges(self) -> list[tuple[str, str]]:
        return sorted((a, b) for a, targets in self.imports.items() for b in targets)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    """The layer index of `module` (longest matching entry of `LAYERS`); KeyError if none matches."""
    best: tuple[int, int] | None = None  # (name length, layer)
    for index, (_, names) in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > best[0]):
                best = (len(name), index)
    if best is None:
        raise KeyError(f"{module} is in no layer of LAYERS (scripts/structure_report.py): add it")
    return best[1]


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, modules: set[str]) -> None:
        self.module, self.is_package, self.modules = module, is_package, modules
        self.scope: list[str] = []
        self.functions: list[tuple[int, str]] = []
        self.found: list[tuple[str, str]] = []  # (imported module, "module" | "function")

    def _where(self) -> str:
        return "function" if any(s.endswith("()") for s in self.scope) else "module"

    def _package(self, level: int) -> str:
        parts = self.module.split(".") if self.is_package else self.module.split(".")[:-1]
        return ".".join(parts[:len(parts) - (level - 1)] if level > 1 else parts)

    def _add(self, name: str) -> None:
        # The deepest package module that `name` names (`a.b.C` -> `a.b` when C is not a module).
        while name and name not in self.modules:
            name = name.rpartition(".")[0]
        if name and name != self.module:
            self.found.append((name, self._where()))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            base = ".".join(p for p in (self._package(node.level), base) if p)
        for alias in node.names:
            full = f"{base}.{alias.name}"
            self._add(full if full in self.modules else base)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        qualname = ".".join([*(s.rstrip("()") for s in self.scope), node.name])
        self.functions.append((node.end_lineno - node.lineno + 1, f"{self.module}:{qualname}"))
        self.scope.append(node.name + "()")
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()


def analyse(root: Path) -> Report:
    files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    names = {module_name(p, root): p for p in files}
    report = Report()
    for module, path in names.items():
        source = path.read_text(encoding="utf-8")
        report.lines[module] = len(source.splitlines())
        collector = _Collector(module, path.name == "__init__.py", set(names))
        collector.visit(ast.parse(source, filename=str(path)))
        report.functions += collector.functions
        for target, where in collector.found:
            report.imports[module].setdefault(target, set()).add(where)
    report.functions.sort(key=lambda f: (-f[0], f[1]))
    return report


def cycles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected components with a cycle in them (Tarjan), each sorted, largest first."""
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        graph[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted({x for e in edges for x in e}):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


def cycle_path(component: list[str], edges: list[tuple[str, str]]) -> list[str]:
    """One closed path through a component's first module (shortest, by breadth-first search)."""
    inside = set(component)
    graph: dict[str, list[str]] = defaultdict(list)
    for a, b in edges:
        if a in inside and b in inside:
            graph[a].append(b)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def upward(report: Report) -> list[tuple[str, str, str]]:
    """Arrows from a lower layer to a higher one: (importer, imported, how)."""
    out = []
    for a, b in report.edges:
        if layer_of(a) < layer_of(b):
            out.append((a, b, "+".join(sorted(report.imports[a][b]))))
    return out


def render(report: Report) -> str:
    edges = report.edges
    function_level = sum(1 for a, b in edges if report.imports[a][b] == {"function"})
    found = cycles(edges)
    up = upward(report)
    out = [f"## Lines per module ({len(report.lines)} modules, {sum(report.lines.values())} lines)", ""]
    out += [f"{n:6d}  {m}" for m, n in sorted(report.lines.items(), key=lambda x: (-x[1], x[0]))]
    out += ["", "## The 15 longest functions", ""]
    out += [f"{n:6d}  {name}" for n, name in report.functions[:15]]
    out += ["", f"## Import graph: {len(edges)} arrows between modules ({function_level} only from inside functions)",
            "", f"## Cycles: {len(found)}", ""]
    for component in found:
        out.append(f"- {len(component)} modules: {' -> '.join(cycle_path(component, edges))}")
        out.append(f"  all: {', '.join(component)}")
    out += ["", f"## Arrows that import upward: {len(up)}", ""]
    out += [f"- {a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]}) [{how}]" for a, b, how in up]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(Path(__file__).resolve().parents[1] / "rlharness"))
    parser.add_argument("--json", action="store_true", help="the numbers as JSON instead of text")
    args = parser.parse_args(argv)
    report = analyse(Path(args.root))
    if args.json:
        edges = report.edges
        print(json.dumps({"lines": report.lines, "longest_functions": report.functions[:15],
                          "arrows": len(edges), "cycles": cycles(edges),
                          "upward": [list(u) for u in upward(report)]}, indent=1))
    else:
        print(render(report))


if __name__ == "__main__":
    main()
