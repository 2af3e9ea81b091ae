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

# The groups of ``--help`` and of ``dupguard settings``, in the order shown: title -> what it is about.
GROUPS: dict[str, str] = {
    "source and database": "where runs are read, and how",
    "leadership": "one active replica: the PostgreSQL advisory lock",
    "detection": "which runs are watched and when two are one too many",
    "periodic checks": "the checks beside detection (docs/explanation/checks.md)",
    "remediation": "what is done to a confirmed duplicate",
    "Airflow API": "Airflow's REST API: the api source and the api remediation backend",
    "alerts": "Slack, a webhook, Alertmanager: where findings are told",
    "health and logs": "probes, metrics and the log",
}


@dataclass(frozen=True)
class Setting:
    name: str  # field name; env var is DUPGUARD_<NAME upper>
    default: Any
    parse: Callable[[str], Any]
    help: str
    secret: bool = False
    group: str = ""  # a key of GROUPS
    metavar: str = ""  # what --help shows for the value; empty: derived from ``parse``
    common: bool = False  # shown by ``--help``; every setting is listed by ``dupguard settings``

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def value_name(self) -> str:
        """The metavar: units and choices (``DURATION``, ``{off,dry-run,fail,skip}``), never ``VALUE``."""
        if self.metavar:
            return self.metavar
        if isinstance(self.parse, Choice):
            return "{" + ",".join(self.parse.allowed) + "}"
        return _VALUE_NAMES.get(self.parse, "TEXT")

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
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        return ",".join(f"{asset}={'.'.join(keys)}" for asset, keys in value)  # message_id_paths, as it reads it
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


@dataclass(frozen=True)
class Choice:
    """A parser of one of ``allowed`` (case-insensitive); ``--help`` shows them as the metavar."""

    allowed: tuple[str, ...]

    def __call__(self, text: str) -> str:
        value = text.strip().lower()
        if value not in self.allowed:
            raise ValueError(f"{text!r} is not one of {', '.join(self.allowed)}")
        return value


def choice(*allowed: str) -> Choice:
    return Choice(allowed)


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


def message_id_paths(text: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``ASSET=PATH`` pairs, comma-separated (``orders=payload.meta.id,billing_*=payload.items.*.id``): where
    a custom trigger's payload keeps its message's own id, per asset name (a glob). The pair splits at its
    last ``=``; ``detector.core.trigger_event.custom_ids`` reads the path."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        asset, sep, path = (part.strip() for part in item.rpartition("="))
        if not sep or not asset:
            raise ValueError(f"{item!r} is not ASSET=PATH (e.g. orders=payload.meta.id)")
        if asset in (a for a, _ in found):
            raise ValueError(f"asset {asset!r} is given two paths")
        found.append((asset, id_path(path)))
    return tuple(found)


def id_path(text: str) -> tuple[str, ...]:
    """Dotted keys from an asset event's ``extra`` down to the id: ``payload`` first (where Airflow keeps the
    trigger's payload), ``*`` for every item of a list. Not JSONPath: its brackets and ``$`` are refused
    rather than read as keys that never match (a silently empty path would prove nothing, unnoticed)."""
    if any(c in text for c in "[]$@?()'\""):
        raise ValueError(f"{text!r}: a path is dotted keys (payload.meta.id; * for every item of a list), not JSONPath")
    keys = tuple(text.split("."))
    if any(not k or k != k.strip() for k in keys):
        raise ValueError(f"{text!r} has an empty key or spaces around one (two dots, or a dot at an end)")
    if keys[0] != "payload":
        raise ValueError(f"{text!r} must start with payload (the event's extra keeps the trigger's payload there)")
    if any("*" in k and k != "*" for k in keys):
        raise ValueError(f"{text!r}: * stands alone between dots (every item of a list), it is no wildcard in a key")
    return keys


_VALUE_NAMES: dict[Callable[[str], Any], str] = {
    boolean: "{true,false}",
    globs: "GLOB[,GLOB...]",
    whole_number: "N",
    port: "PORT",
    positive_int: "N",
    lock_key_value: "N",
    parse_duration: "DURATION",
    positive_duration: "DURATION",
    url: "URL",
    urls: "URL[,URL...]",
    file_path: "FILE",
}
