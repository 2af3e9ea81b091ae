"""Every setting, from ``detector.config.SETTINGS``: the table of docs/reference/settings.md (the test
compares them) and what ``dupguard settings`` prints (a text list by group, or JSON)."""

from __future__ import annotations

import json
import textwrap
from datetime import timedelta
from typing import Any

from detector.config import SETTINGS
from detector.settings import GROUPS, Setting, format_value

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


def _ordered(group: str | None = None) -> list[Setting]:
    """By group in ``GROUPS`` order, then in SETTINGS order."""
    return [s for g in GROUPS if group in (None, g) for s in SETTINGS if s.group == g]


def table() -> str:
    rows = ["| group | setting (flag) | env var | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in _ordered():
        env = f"`{s.env}`" + (f" / `{s.env}_FILE`" if s.secret else "")
        rows.append(f"| {s.group} | `{s.flag} {s.value_name}` | {env} | {_default(s.default)} | {s.help} |")
    return "\n".join(rows)


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def as_json(group: str | None = None) -> str:
    """One object per setting; ``default`` as the flag would take it (``30ms``, ``a,b``), null when none."""
    return json.dumps(
        [
            {
                "name": s.name,
                "group": s.group,
                "flag": s.flag,
                "metavar": s.value_name,
                "env": s.env,
                "env_file": f"{s.env}_FILE" if s.secret else None,
                "default": None if s.default is None or s.default == () else format_value(s.default),
                "secret": s.secret,
                "help": s.help,
            }
            for s in _ordered(group)
        ],
        indent=2,
    )


def as_text(group: str | None = None) -> str:
    """For a terminal: a heading per group, then each setting's flag, env var, default and meaning."""
    lines: list[str] = []
    for title, about in GROUPS.items():
        members = [s for s in _ordered(group) if s.group == title]
        if not members:
            continue
        lines += [""] if lines else []
        lines.append(f"{title}: {about}")
        for s in members:
            env = s.env + (f" or {s.env}_FILE" if s.secret else "")
            lines.append(f"  {s.flag} {s.value_name}")
            lines.append(f"      env {env}; default {format_value(s.default)}")
            lines += textwrap.wrap(s.help, width=100, initial_indent="      ", subsequent_indent="      ")
    return "\n".join(lines)


if __name__ == "__main__":
    print(block())
