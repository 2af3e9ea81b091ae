"""Statements in chunks: ids per IN list, small on every backend."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

CHUNK = 500  # ids per IN list: keeps statements small on every backend
T = TypeVar("T")


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
