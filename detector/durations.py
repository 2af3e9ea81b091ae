"""Durations as people write them in flags and env vars: ``90s``, ``15m``, ``1h30m``, ``1d``, ``0.02``."""

from __future__ import annotations

import re
from datetime import timedelta

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """Parse ``text``; a bare number means seconds. Raises ValueError with the offending text."""
    raw = text.strip().lower()
    try:
        return timedelta(seconds=float(raw))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(raw) or not raw:
        raise ValueError(f"{text!r} is not a duration (examples: 500ms, 90s, 15m, 1h30m, 1d)")
    return timedelta(seconds=total)
