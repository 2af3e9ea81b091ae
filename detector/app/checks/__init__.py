"""The periodic checks (issue 25), one module per kind behind ``base.Check``; registered here, once.

``build`` returns the enabled ones that apply to this Airflow; the daemon and ``scan`` iterate over
what it returns and never name a kind.
"""

from __future__ import annotations

from detector.app.checks.base import Check, CheckBase
from detector.app.checks.double_bump import DoubleBumpCheck
from detector.app.checks.split_partition import SplitPartitionCheck
from detector.app.checks.stranded_events import StrandedEventsCheck
from detector.app.checks.trigger_flapping import TriggerFlappingCheck
from detector.config import Config
from detector.errors import ConfigError
from detector.metadb.engine import AirflowDb
from detector.metrics import Metrics

__all__ = ["CHECKS", "KINDS", "Check", "CheckBase", "build", "unknown_kinds"]

CHECKS: tuple[type[CheckBase], ...] = (
    SplitPartitionCheck,
    StrandedEventsCheck,
    DoubleBumpCheck,
    TriggerFlappingCheck,
)
KINDS = tuple(c.kind for c in CHECKS)


def unknown_kinds(config: Config) -> list[str]:
    return [k for k in config.disabled_checks if k not in KINDS]


def build(config: Config, db: AirflowDb, metrics: Metrics) -> list[Check]:
    """The enabled checks this Airflow has the tables for. Raises ``ConfigError`` naming an unknown kind."""
    unknown = unknown_kinds(config)
    if unknown:
        raise ConfigError([f"DUPGUARD_DISABLED_CHECKS: unknown check {', '.join(unknown)} (known: {', '.join(KINDS)})"])
    checks: list[Check] = [cls(config, metrics) for cls in CHECKS if cls.kind not in config.disabled_checks]
    return [c for c in checks if c.applies(db)]
