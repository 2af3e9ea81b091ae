"""The package's folders show the flow (STYLE.md §15): a pure core, the metadata database, sources, actions,
and the app wiring on top. Imports only point down; there are no import circles between modules."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "detector"
FOUNDATIONS = {
    "detector",
    "detector.errors",
    "detector.durations",
    "detector.redact",
    "detector.logs",
    "detector.deadline",
}

# layer -> what it may import besides itself and the foundations
ALLOWED: dict[str, set[str]] = {
    "detector.core": set(),
    "detector.metadb": {"detector.core"},
    # Airflow's REST API (client, auth, TLS): shared by the api source and the api remediation backend
    "detector.airflowapi": {"detector.core", "detector.config", "detector.metrics"},
    "detector.sources": {
        "detector.core",
        "detector.metadb",
        "detector.airflowapi",
        "detector.config",
        "detector.metrics",
    },
    "detector.actions": {
        "detector.core",
        "detector.metadb",
        "detector.airflowapi",
        "detector.config",
        "detector.metrics",
    },
    "detector.config": {"detector.metadb"},
    "detector.metrics": {"detector.core"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        if "guard" in path.relative_to(ROOT).parts[:1]:
            continue  # the in-scheduler guard is shipped alone and imports nothing of ours
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path) -> Iterator[tuple[str, bool]]:
    """(imported detector module, whether the import runs at import time)"""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("detector"):
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("detector")]
        for name in names:
            yield name, id(node) in top


def _layer(module: str) -> str:
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return module


@functools.cache  # parsing every module is most of each test's time; the files do not change during a run
def _graph() -> dict[str, frozenset[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for name, _ in _imports(path):
            if name in modules and name != module:
                graph[module].add(name)
    return {module: frozenset(deps) for module, deps in graph.items()}  # frozen: shared by the tests


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_downwards(layer: str) -> None:
    """Each layer imports itself, the foundations and the layers below it: never the app, never back up."""
    bad = []
    for module, deps in _graph().items():
        if _layer(module) != layer:
            continue
        for dep in deps:
            if dep in FOUNDATIONS or _layer(dep) == layer or _layer(dep) in ALLOWED[layer]:
                continue
            bad.append(f"{module} -> {dep}")
    assert bad == []


def test_no_import_circles() -> None:
    """No module reaches itself through the imports of others (including imports inside functions)."""
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_layout_is_what_the_test_believes() -> None:
    """The rules above name real folders (a renamed folder must not make every rule pass vacuously)."""
    modules = _modules()
    for layer in ALLOWED:
        assert any(m == layer or m.startswith(layer + ".") for m in modules), layer
    assert len([m for m in modules if _layer(m) == "detector.core"]) >= 5
