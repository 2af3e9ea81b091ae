"""The one interface every periodic check implements (like node_exporter's collectors).

A check is one package beside this module (``<kind>/``, docs/explanation/checks.md): its class (``check.py``) reads
its rows through its ``statements`` and judges them with its pure ``rule``; the runner (``runner.py``)
does everything else the same way for every kind: the schedule, the leader-only gate, the ledger claim,
alerts on every channel, metrics, failures. Register the kind once in ``registry.py``; users switch it
off by its ``kind`` (``DUPGUARD_DISABLED_CHECKS``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import ClassVar, Protocol

from sqlalchemy.engine import Connection

from detector.actions.alerts.notice import Notice, observation_notice
from detector.config import Config
from detector.core.checks import CheckContext, Observation
from detector.core.fence import FenceSource
from detector.core.ports import Ledger
from detector.metadb.engine import AirflowDb
from detector.metrics import Metrics


class Check(Protocol):
    kind: ClassVar[str]

    def applies(self, db: AirflowDb) -> bool:
        """Whether this Airflow has what the check reads (a version, a table)."""
        ...

    def interval(self) -> timedelta:
        """Time between two runs of the check in ``dupguard run``."""
        ...

    def collect(self, conn: Connection, db: AirflowDb, ctx: CheckContext) -> list[Observation]:
        """Everything the check finds now. Raises on database errors (the runner reports them)."""
        ...

    def notice(self, obs: Observation, cluster: str, detected_at: datetime) -> Notice:
        """The alert of one new observation."""
        ...

    def observed(self, found: list[Observation], new: list[Observation]) -> None:
        """Called after each run with what it found and what was new (its own metrics, if any)."""
        ...

    def repair(self, found: list[Observation], rc: RepairContext) -> None:
        """An optional repair step after each ``run`` (leader only, never in ``scan``): none by default."""
        ...


@dataclass(frozen=True)
class RepairContext:
    """What a check's repair step may use: the database, the ledger (a claim per repair), the leader's
    fence (None: not allowed to write now), the alert channels and both clocks."""

    db: AirflowDb
    ledger: Ledger
    fence: FenceSource
    notify: Callable[[Notice], None]
    cluster: str
    now: datetime
    db_now: datetime


class CheckBase(ABC):
    """Defaults: every Airflow, the generic alert, no metrics of its own."""

    kind: ClassVar[str]

    def __init__(self, config: Config, metrics: Metrics) -> None:
        self.config, self.metrics = config, metrics

    def applies(self, db: AirflowDb) -> bool:
        return True

    @abstractmethod
    def interval(self) -> timedelta: ...

    @abstractmethod
    def collect(self, conn: Connection, db: AirflowDb, ctx: CheckContext) -> list[Observation]: ...

    def notice(self, obs: Observation, cluster: str, detected_at: datetime) -> Notice:
        return observation_notice(obs, cluster, detected_at)

    def observed(self, found: list[Observation], new: list[Observation]) -> None:
        return None

    def repair(self, found: list[Observation], rc: RepairContext) -> None:
        return None
