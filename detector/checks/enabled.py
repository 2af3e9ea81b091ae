"""The check classes of the registered kinds (``detector.checks.registry``), and the ones to run here.

``build`` returns the enabled ones that apply to this Airflow; the daemon and ``scan`` iterate over
what it returns and never name a kind. Each class is ``CHECK`` in its kind's ``check`` module, loaded by
name from the registry's entry, so registering a kind stays one line (and the registry stays low enough
for ``detector.config`` to read the kinds' settings from it).
"""

from __future__ import annotations

import importlib

from detector.checks.base import Check, CheckBase
from detector.checks.kind import Kind
from detector.checks.registry import KINDS, REGISTERED
from detector.config import Config
from detector.errors import ConfigError
from detector.metadb.engine import AirflowDb
from detector.metrics import Metrics

__all__ = ["CHECKS", "KINDS", "Check", "CheckBase", "build", "unknown_kinds"]


def _check_class(kind: Kind) -> type[CheckBase]:
    cls = getattr(importlib.import_module(kind.check_module), "CHECK", None)
    if not (isinstance(cls, type) and issubclass(cls, CheckBase) and cls.kind == kind.name):
        raise TypeError(f"{kind.check_module}.CHECK must be the CheckBase subclass of kind {kind.name!r}")
    return cls


CHECKS: tuple[type[CheckBase], ...] = tuple(_check_class(k) for k in REGISTERED)


def unknown_kinds(config: Config) -> list[str]:
    return [k for k in config.disabled_checks if k not in KINDS]


def build(config: Config, db: AirflowDb, metrics: Metrics) -> list[Check]:
    """The enabled checks this Airflow has the tables for. Raises ``ConfigError`` naming an unknown kind."""
    unknown = unknown_kinds(config)
    if unknown:
        raise ConfigError([f"DUPGUARD_DISABLED_CHECKS: unknown check {', '.join(unknown)} (known: {', '.join(KINDS)})"])
    checks: list[Check] = [cls(config, metrics) for cls in CHECKS if cls.kind not in config.disabled_checks]
    return [c for c in checks if c.applies(db)]
