"""The tree's architecture, checked from the source: imports point down (experiments -> simulator -> harness ->
ddp_impl), no module imports itself back through others, and the simulator's model part (with the ``simulator``
package's re-exports) reaches nothing of the harness; function-level imports included."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("ddp_impl", "harness", "simulator", "experiments")  # each may import only the ones before it


def _modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, known: dict) -> set[str]:
    """Project modules ``name`` imports anywhere in its code (``from pkg import sub`` counts as ``pkg.sub``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up level - 1 packages from this one
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in out if m in known and m != name}


GRAPH = {name: _imports(name, path, _modules()) for name, path in _modules().items()}


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_imports_point_down(name):
    layer = LAYERS.index(name.split(".")[0])
    upward = {m for m in GRAPH[name] if LAYERS.index(m.split(".")[0]) > layer}
    assert not upward, f"{name} imports a higher layer: {sorted(upward)}"


def test_the_launcher_imports_nothing_else_of_the_harness():
    """harness.launch is the bottom room: configs, workloads and networks are built on it, never the reverse."""
    for name, imports in GRAPH.items():
        if name.startswith("harness.launch"):
            assert all(not m.startswith("harness.") or m.startswith("harness.launch") for m in imports), name


def test_no_import_cycles():
    done, path = set(), []

    def visit(node):
        if node in path:
            cycle = path[path.index(node) :] + [node]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if node in done:
            return
        path.append(node)
        for nxt in sorted(GRAPH[node]):
            visit(nxt)
        path.pop()
        done.add(node)

    for name in sorted(GRAPH):
        visit(name)


def _reaches(name: str) -> set[str]:
    """Every project module ``name`` imports, directly or through other project modules."""
    seen, todo = set(), [name]
    while todo:
        for nxt in GRAPH[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


HARNESS_FREE = sorted(m for m in GRAPH if m in ("simulator", "simulator.model") or m.startswith("simulator.model."))


def test_the_simulators_model_part_is_found():
    assert {"simulator", "simulator.model", "simulator.model.scenario", "simulator.model.clusters"} <= set(HARNESS_FREE)


@pytest.mark.parametrize("name", HARNESS_FREE)
def test_the_simulators_model_part_imports_nothing_of_the_harness(name):
    """``simulator`` (its re-exports) and everything under ``simulator.model`` predict without the harness: no import
    of it, direct or through other project modules, function-level imports included."""
    harness = sorted(m for m in _reaches(name) if m.split(".")[0] == "harness")
    assert not harness, f"{name} reaches the harness: {harness}"
