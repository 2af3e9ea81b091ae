"""The package's folders show the flow: a pure core, the metadata database, sources, actions,
and the app wiring on top. Imports only point down; there are no import circles between modules.

A periodic check's package (``detector/checks/<kind>/``, docs/explanation/checks.md) holds those layers in small, told
apart by module name: ``rule*`` is pure (the core's level), ``statements*`` reads through the database layer
only, ``settings`` and ``metrics`` (with the light package ``__init__`` and the registry) see only
``detector.settings``, and everything else (the check class, an alert text, a repair step) may use every
layer below the app."""

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

# The roles inside detector/checks (pseudo-layers: no module has these names).
PURE = "detector.checks (pure)"  # each kind's rule*: rows in, core.checks.Observation out
READS = "detector.checks (statements)"  # each kind's statements*
LIGHT = "detector.checks (settings)"  # each kind's settings, metrics, __init__; the registry: config reads them
BELOW_APP = {
    "detector.core",
    "detector.metadb",
    "detector.airflowapi",
    "detector.sources",
    "detector.actions",
    "detector.config",
    "detector.settings",
    "detector.metrics",
    PURE,
    READS,
    LIGHT,
}

# layer -> what it may import besides itself and the foundations
ALLOWED: dict[str, set[str]] = {
    "detector.core": set(),
    "detector.settings": set(),
    PURE: {"detector.core"},
    LIGHT: {"detector.settings"},
    "detector.metadb": {"detector.core"},
    READS: {"detector.core", "detector.metadb", PURE},
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
    "detector.config": {"detector.metadb", "detector.settings", LIGHT},
    "detector.metrics": {"detector.core", LIGHT},
    # the check classes and their machinery (base, runner, enabled): everything below the app
    "detector.checks": BELOW_APP,
}
CHECKS = ROOT / "checks"
ROLES = (("rule", PURE), ("statements", READS), ("settings", LIGHT), ("metrics", LIGHT))


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


def _check_layer(parts: list[str]) -> str:
    """The layer of ``detector.checks.<parts>``: a role of a kind's package, or the checks' own layer."""
    if parts in ([], ["registry"], ["kind"]) or (len(parts) == 1 and (CHECKS / parts[0]).is_dir()):
        return LIGHT  # the package __init__ files and the registry: config imports them
    if len(parts) == 2:
        for prefix, layer in ROLES:
            if parts[1] == prefix or parts[1].startswith(prefix + "_"):
                return layer
    return "detector.checks"


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[:2] == ["detector", "checks"]:
        return _check_layer(parts[2:])
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
        assert any(_layer(m) == layer for m in modules), layer
    assert len([m for m in modules if _layer(m) == "detector.core"]) >= 5
    kinds = [p.name for p in CHECKS.iterdir() if (p / "__init__.py").is_file()]
    assert len(kinds) >= 4
    for kind in kinds:  # every kind has each role, so none of the rules above holds vacuously for it
        roles = {_layer(m) for m in modules if m.startswith(f"detector.checks.{kind}.")}
        assert {PURE, READS, LIGHT, "detector.checks"} <= roles, kind


def test_a_kind_imports_no_other_kind() -> None:
    """A kind's package is its own house: it uses the shared machinery and the layers, never another kind
    (only the registry and ``enabled`` name every kind)."""
    bad = []
    for module, deps in _graph().items():
        parts = module.split(".")
        if parts[:2] != ["detector", "checks"] or len(parts) < 3 or not (CHECKS / parts[2]).is_dir():
            continue
        for dep in deps:
            other = dep.split(".")
            kind = other[2] if other[:2] == ["detector", "checks"] and len(other) > 2 else None
            if kind is not None and (CHECKS / kind).is_dir() and kind != parts[2]:
                bad.append(f"{module} -> {dep}")
    assert bad == []


def test_every_kind_package_is_registered() -> None:
    """A kind's package that the registry does not name would never run, and its settings would be unknown."""
    from detector.checks.registry import KINDS

    packages = sorted(p.name for p in CHECKS.iterdir() if (p / "__init__.py").is_file())
    assert sorted(KINDS) == packages


# A module a reader can hold in their head. The guard's policy is one long story Airflow calls into (its
# hooks, in the order the scheduler runs them); splitting it would scatter that story across files.
LONGEST = 500
LONGER_ALLOWED = {"detector/guard/policy.py"}


def test_no_module_is_longer_than_a_reader_holds() -> None:
    long = {
        str(path.relative_to(ROOT.parent)): n
        for path in ROOT.rglob("*.py")
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > LONGEST
    }
    assert set(long) <= LONGER_ALLOWED, {k: v for k, v in long.items() if k not in LONGER_ALLOWED}
