"""Statements in chunks: ids per IN list, small on every backend; a batch's keys as a table to join."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import bindparam, column, func, values
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql.selectable import NamedFromClause
from sqlalchemy.types import TypeEngine

CHUNK = 500  # ids per IN list: keeps statements small on every backend
T = TypeVar("T")


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def keys_table(
    dialect: str, name: str, columns: list[tuple[str, TypeEngine[Any]]], rows: list[tuple[Any, ...]] | None
) -> NamedFromClause:
    """Rows of keys as a table ``name`` to join: a batch's questions in one statement. On PostgreSQL
    ``unnest`` of one array per column, bound parameters whatever the number of rows, so the statement
    keeps one shape and SQLAlchemy compiles it once (a VALUES list is as many parameters as values:
    compiled anew for every batch); with ``rows`` None the arrays are left to the execution's
    parameters (``keys_params``), so the statement itself can be built once. Elsewhere (SQLite, the
    demo database) a VALUES list in a CTE: SQLite has no column list after a derived table's alias."""
    if dialect == "postgresql":
        arrays = [
            bindparam(f"{name}_{col}", type_=ARRAY(col_type))
            if rows is None
            else bindparam(f"{name}_{col}", [row[i] for row in rows], type_=ARRAY(col_type))
            for i, (col, col_type) in enumerate(columns)
        ]
        return func.unnest(*arrays).table_valued(*(col for col, _ in columns)).render_derived(name=name)
    if rows is None:
        raise ValueError(f"keys_table on {dialect} needs its rows: a VALUES list is written into the statement")
    listed = values(*(column(col, col_type) for col, col_type in columns), name=name).data(rows)
    return listed.cte(name)


def keys_params(name: str, columns: list[tuple[str, TypeEngine[Any]]], rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    """The parameters of a PostgreSQL ``keys_table(..., rows=None)``: one array per column."""
    return {f"{name}_{col}": [row[i] for row in rows] for i, (col, _) in enumerate(columns)}
