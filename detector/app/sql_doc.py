"""docs/reference/sql.md: every statement dupguard sends, by mode, generated from the code (the test
compares them; ``python -m detector.app.sql_doc`` prints the block).

Read from the source with ``ast``, nothing executed: a statement is a function (or method) that calls
``execute`` itself; its reason is its docstring's first paragraph; its tables are the ones it and the
helpers it calls in its module name: ``AirflowTables`` attributes (``t.dag_run``), module tables
(``table("pg_locks", ...)``, ``Table("claims", ...)``) and table-name constants. A table is written
when it is the argument of ``insert``/``update``/``delete``, locked when the statement selects it
``FOR UPDATE``/``FOR SHARE``; every other one is read.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from detector.metadb.schema import Family, airflow_tables

BEGIN = "<!-- sql-statements:begin -->"
END = "<!-- sql-statements:end -->"
ROOT = Path(__file__).resolve().parents[1]

# mode -> the modules whose statements it sends (the catalog's and the clock's are every mode's)
MODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "detection",
        (
            "metadb/catalog.py",
            "metadb/dag_runs.py",
            "metadb/siblings.py",
            "metadb/consumption.py",
            "metadb/partitions.py",
        ),
    ),
    ("checks", tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "checks").glob("*/*.py")))),
    ("remediation db backend", ("metadb/run_state.py", "actions/remediation/db.py")),
    ("ledger", ("app/ledger.py",)),
    ("leader lock", ("metadb/leader_lock.py",)),
    ("doctor", ("metadb/doctor_reads.py",)),
)
WRITES = {"insert", "update", "delete", "pg_insert"}
# Parameters that carry table names the caller picks from the module's constants (doctor's DAG counts).
PARAM_TABLES = {
    "refs": ("SCHEDULE_TABLES", "ALIAS_TABLES"),
    "ref": ("SCHEDULE_TABLES",),
    "watchers": ("WATCHER_TABLES",),
}


def _airflow_names() -> dict[str, str]:
    """``AirflowTables`` attribute -> the table's name in Airflow 3 (2.x says dataset for asset)."""
    tables = airflow_tables(Family.AIRFLOW_3_3)
    return {name: value.name for name, value in vars(tables).items() if hasattr(value, "c")}


@dataclass
class _Uses:
    read: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    locked: bool = False
    calls: set[str] = field(default_factory=set)
    executes: bool = False


@dataclass(frozen=True)
class Statement:
    mode: str
    module: str
    name: str
    reason: str
    read: tuple[str, ...]
    written: tuple[str, ...]
    locked: bool


class _Module:
    def __init__(self, path: Path, airflow: dict[str, str]) -> None:
        self.tree = ast.parse(path.read_text())
        self.airflow = airflow
        self.constants: dict[str, tuple[str, ...]] = {}
        self.tables: dict[str, str] = {}
        schema = ""
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
                if name == "SCHEMA" and isinstance(value, ast.Constant) and isinstance(value.value, str):
                    schema = value.value + "."
                if isinstance(value, ast.Tuple) and all(isinstance(e, ast.Constant) for e in value.elts):
                    self.constants[name] = tuple(str(e.value) for e in value.elts)  # type: ignore[attr-defined]
                if isinstance(value, ast.Call) and _called(value) in ("table", "Table") and value.args:
                    first = value.args[0]
                    if isinstance(first, ast.Constant):
                        prefix = schema if _called(value) == "Table" else ""
                        self.tables[name] = prefix + str(first.value)
        self.functions = dict(self._functions())

    def _functions(self) -> Iterator[tuple[str, ast.FunctionDef]]:
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef):
                yield node.name, node
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        yield f"{node.name}.{item.name}", item

    def _table(self, node: ast.expr, aliases: dict[str, str]) -> str | None:
        if isinstance(node, ast.Attribute) and node.attr in self.airflow:
            return self.airflow[node.attr]
        if isinstance(node, ast.Name):
            return aliases.get(node.id) or self.tables.get(node.id)
        if isinstance(node, ast.Call) and _called(node) in ("table", "Table") and node.args:
            first = node.args[0]
            return str(first.value) if isinstance(first, ast.Constant) else None
        return None

    def uses(self, name: str) -> _Uses:
        fn = self.functions[name]
        owner = name.rpartition(".")[0]
        out, aliases = _Uses(), dict[str, str]()
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for target, value in zip(targets, values, strict=False):
                    found = self._table(value, aliases)
                    if isinstance(target, ast.Name) and found:
                        aliases[target.id] = found
        for node in ast.walk(fn):
            found = self._table(node, aliases) if isinstance(node, ast.expr) else None
            if found:
                out.read.add(found)
            if isinstance(node, ast.Name) and node.id in self.constants and node.id.endswith("_TABLES"):
                out.read.update(self.constants[node.id])
            if not isinstance(node, ast.Call):
                continue
            called = _called(node)
            if called in ("execute", "exec_driver_sql"):
                out.executes = True
            if called == "with_for_update":
                out.locked = True
            written = self._table(node.args[0], aliases) if called in WRITES and node.args else None
            if written:
                out.written.add(written)
            if isinstance(node.func, ast.Name) and node.func.id in self.functions:
                out.calls.add(node.func.id)
            func = node.func
            on_self = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
            if on_self and f"{owner}.{_called(node)}" in self.functions:
                out.calls.add(f"{owner}.{_called(node)}")
        for arg in fn.args.args:
            for constant in PARAM_TABLES.get(arg.arg, ()):
                out.read.update(self.constants.get(constant, ()))
        return out

    def statements(self) -> Iterator[tuple[str, str, _Uses]]:
        for name, fn in self.functions.items():
            uses = self.uses(name)
            if not uses.executes:
                continue
            seen, todo = {name}, list(uses.calls)
            while todo:  # the helpers it calls that send nothing themselves: their tables are its own
                callee = todo.pop()
                if callee in seen:
                    continue
                seen.add(callee)
                more = self.uses(callee)
                if not more.executes:
                    uses.read |= more.read
                    uses.written |= more.written
                    uses.locked |= more.locked
                    todo.extend(more.calls)
            doc = (ast.get_docstring(fn) or "").strip()
            yield name, " ".join(doc.split("\n\n")[0].split()), uses


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def statements() -> list[Statement]:
    airflow = _airflow_names()
    out = []
    for mode, modules in MODES:
        for module in modules:
            for name, reason, uses in _Module(ROOT / module, airflow).statements():
                read = tuple(sorted(uses.read - uses.written))
                out.append(
                    Statement(mode, f"detector/{module}", name, reason, read, tuple(sorted(uses.written)), uses.locked)
                )
    return out


def _names(tables: tuple[str, ...]) -> str:
    return ", ".join(f"`{t}`" for t in tables) or "—"


def table() -> str:
    parts = []
    for mode, _ in MODES:
        parts += [f"### {mode}", "", "| statement | why | reads | writes |", "| --- | --- | --- | --- |"]
        for s in (s for s in statements() if s.mode == mode):
            writes = _names(s.written) + (" (locks the rows it reads)" if s.locked else "")
            reason = s.reason.replace("|", "\\|") or "—"
            parts.append(f"| `{s.name}` ({s.module}) | {reason} | {_names(s.read)} | {writes} |")
        parts.append("")
    return "\n".join(parts).rstrip("\n")


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


if __name__ == "__main__":
    print(block())
