"""The settings table of docs/reference/settings.md, generated from ``detector.config.SETTINGS``
(the test compares them)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from detector.config import SETTINGS

BEGIN = "<!-- settings-table:begin -->"
END = "<!-- settings-table:end -->"


def _default(value: Any) -> str:
    if value is None or value == ():
        return "—"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        return f"`{seconds * 1000:g}ms`" if seconds < 1 else f"`{seconds:g}s`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def table() -> str:
    rows = ["| setting (flag) | env var | default | meaning |", "| --- | --- | --- | --- |"]
    for s in SETTINGS:
        env = f"`{s.env}`" + (f" / `{s.env}_FILE`" if s.secret else "")
        rows.append(f"| `{s.flag}` | {env} | {_default(s.default)} | {s.help} |")
    return "\n".join(rows)


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


if __name__ == "__main__":
    print(block())
