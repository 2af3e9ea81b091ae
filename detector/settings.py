"""What a setting is and how its text is read: the lowest part of the configuration.

``detector.config`` builds the frozen ``Config`` from ``Setting`` entries; a periodic check declares its own
entries in ``detector/checks/<kind>/settings.py``, which imports only this module (and the foundations), so
``config`` gathers every kind's settings without importing a check (docs/explanation/checks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from detector.durations import parse_duration
from detector.errors import ConfigError

ENV_PREFIX = "DUPGUARD_"


@dataclass(frozen=True)
class Setting:
    name: str  # field name; env var is DUPGUARD_<NAME upper>
    default: Any
    parse: Callable[[str], Any]
    help: str
    secret: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def help_text(self) -> str:
        """The ``--help`` line: meaning, env var (and ``_FILE`` for secrets) and default (never a value set)."""
        env = self.env + (f" or {self.env}_FILE" if self.secret else "")
        return f"{self.help} [env {env}; default {format_value(self.default)}]".replace("%", "%%")


def format_duration(value: timedelta) -> str:
    """A duration as ``parse_duration`` reads it back (``10ms``, ``900s``)."""
    ms = value / timedelta(milliseconds=1)
    return f"{ms:g}ms" if ms < 1000 else f"{value.total_seconds():g}s"


def format_value(value: Any) -> str:
    if value is None or value == ():
        return "none"
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{text!r} is not a boolean (true/false)")


def globs(text: str) -> tuple[str, ...]:
    return tuple(g.strip() for g in text.split(",") if g.strip())


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(allowed)}")
        return value

    return parse


def whole_number(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError("not a whole number") from None


def port(text: str) -> int:
    value = whole_number(text)
    if not 0 <= value <= 65535:
        raise ValueError(f"{value} is not a TCP port")
    return value


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise ValueError(f"{value} must be at least 1")
    return value


def lock_key_value(text: str) -> int:
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{value} is outside PostgreSQL's bigint range (advisory lock keys are bigint)")
    if value in (1, 2):
        raise ValueError(f"{value} is one of Airflow's own advisory lock ids (1: migrations, 2: scheduler)")
    return value


def positive_duration(text: str) -> timedelta:
    value = parse_duration(text)
    if value <= timedelta(0):
        raise ValueError(f"{text!r} must be greater than zero")
    return value


def url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    try:
        parts = urlsplit(text)
        _ = parts.port
    except ValueError:
        raise ValueError("has an invalid host or port") from None
    if not parts.hostname:
        raise ValueError("has no host")
    return text.rstrip("/")


def urls(text: str) -> tuple[str, ...]:
    """A comma-separated list of base URLs (an Alertmanager HA pair: every one gets every alert)."""
    parts = [u.strip() for u in text.split(",") if u.strip()]
    if any("@" in u.partition("://")[2].partition("/")[0] for u in parts):
        # a ConfigError: load() shows a ValueError's raw value, which would show the password
        raise ConfigError(["credentials in a URL (value hidden): use DUPGUARD_ALERTMANAGER_USERNAME/_PASSWORD"])
    urls = tuple(url(u) for u in parts)
    if len(set(urls)) != len(urls):
        raise ValueError("a URL is listed twice")
    return urls


def file_path(text: str) -> str:
    try:
        ok = Path(text).is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte
        ok = False
    if not ok:
        raise ValueError("no such file")
    return text
