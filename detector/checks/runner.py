"""Runs the periodic checks: the same schedule, ledger claims, alerts, metrics and failure handling for
every kind, so neither the daemon loop nor ``scan`` knows which checks exist.

``dupguard run``: one job per enabled check on the daemon's one APScheduler (``max_instances=1,
coalesce=True``), leader only; every observation is claimed ``detected`` in the ledger under its key and
sent once to every alert channel; then the check's repair step, if it has one (``Check.repair``).
``scan`` and ``doctor``: ``observe`` runs each check once on the scan's connection (``live`` False),
claims nothing, alerts nothing and repairs nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from detector import logs
from detector.actions.alerts.notice import Notice
from detector.checks.base import Check, RepairContext
from detector.core.checks import CheckContext, Observation
from detector.core.detect import ALL_DAGS, DagFilter
from detector.core.fence import UNFENCED, FenceSource
from detector.core.ports import Ledger
from detector.metadb import catalog
from detector.metadb.engine import AirflowDb, connect
from detector.metrics import Metrics

log = logs.get("dupguard.checks")
GRANT_HINT = (
    "grant SELECT on the table named (docs/how-to/deploy-kubernetes.md, section 2: Database role); "
    "the check runs again every interval"
)


class NoticeAlerter(Protocol):
    def notify_notice(self, notice: Notice) -> None: ...


class CheckRunner:
    def __init__(
        self,
        db: AirflowDb,
        checks: Sequence[Check],
        ledger: Ledger,
        alerter: NoticeAlerter,
        metrics: Metrics,
        *,
        cluster: str,
        dag_filter: DagFilter = ALL_DAGS,
        fence: FenceSource = lambda: UNFENCED,  # the leader's permission to write (a repair step's)
    ) -> None:
        self.db, self.ledger, self.alerter, self.metrics = db, ledger, alerter, metrics
        self.fence = fence
        self.checks = {c.kind: c for c in checks}
        self.cluster, self.dag_filter = cluster, dag_filter
        self.denied: set[str] = set()  # kinds whose last run lacked a privilege (logged once)
        # observations alerted while the ledger could not record them: not alerted again once it can
        self._unrecorded: dict[str, None] = {}

    def run(self, kind: str, now: datetime) -> list[Observation]:
        """One run of one check: read, judge, claim and alert what is new. Raises on database errors;
        returns everything found."""
        check = self.checks[kind]
        started = time.monotonic()
        with connect(self.db.engine) as conn:
            ctx = CheckContext(db_now=catalog.database_now(conn), now=now, dag_filter=self.dag_filter)
            found = check.collect(conn, self.db, ctx)
        new, failed = [], None
        for obs in found:
            try:
                won = self.ledger.claim(obs.key, "detected")
            except Exception as exc:  # noqa: BLE001 - raised below, once every observation is alerted
                # a ledger that cannot record holds no alert back (once per process; a
                # restart or another replica may send it again); the repair waits for the ledger
                failed = failed or exc
                if obs.key not in self._unrecorded:
                    self._remember_unrecorded(obs.key)
                    log.warning("ledger_claim_failed", kind=kind, group_key=obs.key, error=_first_line(exc))
                    new.append(obs)
                    self.alerter.notify_notice(check.notice(obs, self.cluster, now))
                continue
            if won and self._unrecorded.pop(obs.key, False) is False:  # else alerted while unrecorded
                new.append(obs)
                self.alerter.notify_notice(check.notice(obs, self.cluster, now))
        self.metrics.check_observations.labels(kind=kind).set(len(found))
        self.metrics.check_detected.labels(kind=kind).inc(len(new))
        self.metrics.check_seconds.labels(kind=kind).observe(time.monotonic() - started)
        check.observed(found, new)
        if failed is not None:
            raise failed
        check.repair(found, RepairContext(self.db, self.ledger, self.fence, self.alerter.notify_notice,
                                          self.cluster, now, ctx.db_now))  # fmt: skip
        return found

    def _remember_unrecorded(self, key: str) -> None:
        self._unrecorded[key] = None
        if len(self._unrecorded) > 10_000:  # bounded: the oldest may then be alerted once more
            self._unrecorded.pop(next(iter(self._unrecorded)))

    def run_reported(self, kind: str, now: datetime) -> bool:
        """``run``, for the scheduler: False (logged, counted) if it failed; never raises."""
        try:
            self.run(kind, now)
        except Exception as exc:  # one failing check must never end the sidecar, nor stop the others
            self.metrics.check_failures.labels(kind=kind).inc()
            expected = getattr(exc, "__module__", "").startswith(("sqlalchemy", "detector"))
            if _permission_denied(exc):  # a grant without this check's tables: said once, retried quietly
                if kind not in self.denied:
                    self.denied.add(kind)
                    log.warning("check_not_permitted", kind=kind, error=_first_line(exc), detail=GRANT_HINT)
            elif expected:  # the database, a timeout: one line, no trace
                log.warning("check_failed", kind=kind, error=_first_line(exc))
            else:
                log.exception("check_crashed", kind=kind)
            return False
        if kind in self.denied:
            self.denied.discard(kind)
            log.info("check_permitted", kind=kind)
        return True


def _permission_denied(exc: BaseException) -> bool:
    """PostgreSQL's insufficient_privilege (SQLSTATE 42501), under SQLAlchemy's and dupguard's wrappers."""
    seen: BaseException | None = exc
    for _ in range(5):  # DatabaseError <- sqlalchemy ProgrammingError (.orig: psycopg2's error)
        if seen is None:
            return False
        if getattr(seen, "pgcode", None) == "42501" or getattr(getattr(seen, "orig", None), "pgcode", None) == "42501":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300] or type(exc).__name__


def observe(
    checks: Sequence[Check], conn: Connection, db: AirflowDb, ctx: CheckContext
) -> tuple[dict[str, list[Observation]], dict[str, str]]:
    """Every applicable check once (``scan``): what each finds, by kind, and why any failed.

    A failed check costs its own answer only, not the scan's: at 100M task instances the double_bump
    check's sequential scan outlasts the 60 s deadline of a round trip (benchmarks/results/measurements.md). The checks
    after it run on a fresh connection (a round trip past its deadline leaves the connection closed);
    a database that cannot be reached at all still ends the scan (that connect raises)."""
    found: dict[str, list[Observation]] = {}
    failed: dict[str, str] = {}
    fresh: Connection | None = None
    try:
        for check in checks:
            try:
                found[check.kind] = check.collect(fresh or conn, db, ctx)
            except SQLAlchemyError as exc:
                cause = exc.orig if isinstance(exc, DBAPIError) else None  # the driver's words, not the SQL
                failed[check.kind] = _first_line(cause or exc)  # said once, by the caller (scan's stderr line)
                if fresh is not None:
                    fresh.close()
                fresh = db.engine.connect()
    finally:
        if fresh is not None:
            fresh.close()
    return found, failed
