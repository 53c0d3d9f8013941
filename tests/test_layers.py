"""The layers stay layers: `orchestrator -> simulator -> latency`, and no module imports one that imports
it back, directly or through others. Imports inside functions count too, so none can hide a cycle."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("latency", "simulator", "orchestrator")
#: which package may import which (its own modules always)
ALLOWED = {"latency": set(), "simulator": {"latency"}, "orchestrator": {"simulator", "latency"}}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_of(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imported(node) -> list[str]:
    """The project modules an import statement names (`from pkg import sub` names the submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES]
    if not node.module or node.level:
        return []
    out = []
    for alias in node.names:
        sub = f"{node.module}.{alias.name}"
        out.append(sub if sub in MODULES else node.module)
    return [m for m in out if m in MODULES]


def graph() -> dict[str, set[str]]:
    edges = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        edges[name] = {m for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                       for m in imported(node) if m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(graph()) == []


def test_the_walk_finds_a_cycle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_packages_import_downwards_only():
    wrong = [(m, d) for m, deps in graph().items() for d in deps
             if d.split(".")[0] != m.split(".")[0] and d.split(".")[0] not in ALLOWED[m.split(".")[0]]]
    assert wrong == []


def test_simulator_and_latency_never_import_ray():
    for name, path in MODULES.items():
        if name.split(".")[0] in ("simulator", "latency"):
            tree = ast.parse(path.read_text())
            names = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                     for a in node.names}
            names |= {node.module.split(".")[0] for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module}
            assert "ray" not in names, name
