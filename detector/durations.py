"""Durations as people write them in flags, env vars and the config file: ``500ms``, ``90s``, ``15m``,
``1h30m``, ``1d``; and as servers write them in ``Retry-After``.

A bare number is refused (``0`` aside, the same in every unit): dupguard's durations range from
milliseconds (``poll_interval``, default ``5ms``) to minutes, so ``10`` alone could mean either, and
reading it as seconds made ``--poll-interval 10`` a thousand times the default."""

from __future__ import annotations

import math
import re
from datetime import timedelta
from email.utils import parsedate_to_datetime

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
# Longer than any history or interval makes sense for; also far from the limits of timedelta and of
# ``now - duration`` (year 1), which a huge value would otherwise hit as an OverflowError.
MAX_DURATION = timedelta(days=36_500)


def parse_duration(text: str) -> timedelta:
    """Parse ``text``, numbers with units (``1h30m``) or a bare ``0``. Raises ValueError with the offending
    text; for a bare number, one that suggests both readings (``10ms`` or ``10s``).

    Only durations from 0 to ``MAX_DURATION`` (100 years) are accepted.
    """
    raw = text.strip().lower()
    try:
        bare = float(raw)
    except ValueError:
        bare = None
    if bare is not None:
        if bare > 0 and math.isfinite(bare):
            raise ValueError(f"{text!r} has no unit: write {bare:g}ms or {bare:g}s (or another unit: m, h, d)")
        return _bounded(bare, text)  # 0; a negative, NaN or infinite number raises
    pos, total = 0, 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(raw) or not raw:
        raise ValueError(f"{text!r} is not a duration (examples: 500ms, 90s, 15m, 1h30m, 1d)")
    return _bounded(total, text)


def _bounded(seconds: float, text: str) -> timedelta:
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not a duration (it must be zero or more)")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"{text!r} is too long a duration (at most {MAX_DURATION.days}d)")
    return timedelta(seconds=seconds)


def retry_after(value: str | None, now: float) -> float | None:
    """A ``Retry-After`` header (seconds, or an HTTP date) as seconds from ``now``; None if absent/unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)
