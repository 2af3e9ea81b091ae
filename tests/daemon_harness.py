"""Runs real ``Daemon`` objects in threads against real PostgreSQL, with recording executors."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg2

from detector.app.daemon import Daemon, Parts
from detector.app.leader import AdvisoryLock
from detector.app.ledger import DbLedger, MemoryLedger, init_db
from detector.app.wiring import build_leadership, build_remediator
from detector.config import Config
from detector.core.plan import Action
from detector.core.ports import Alerter, AlertEvent, AlertKind, Ledger, RemediationResult, Remediator, Result
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.sources.database.poll import IncrementalDetector
from detector.sources.database.source import DatabaseSource


@dataclass
class RecordingRemediator:
    """Fake remediator: records what it was asked to do (and the most calls at once); changes nothing."""

    actions: list[Action] = field(default_factory=list)
    delay: float = 0.0
    running: int = 0
    most_at_once: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def execute(self, action: Action) -> RemediationResult:
        with self.lock:
            self.actions.append(action)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        time.sleep(self.delay)
        with self.lock:
            self.running -= 1
        return RemediationResult(action=action, result=Result.DRY_RUN)

    prepared: int = 0

    def prepare(self) -> None:
        self.prepared += 1

    def record(self, result: RemediationResult) -> None:
        return None  # counts nothing (the real remediator's metrics and log line)

    def close(self) -> None:
        return None


@dataclass
class RecordingAlerter:
    """Fake alerter: records events."""

    events: list[AlertEvent] = field(default_factory=list)
    closed: bool = False

    def notify(self, event: AlertEvent) -> None:
        self.events.append(event)

    def close(self, timeout: float) -> None:
        self.closed = True

    def trouble(self) -> str | None:
        return None  # every alert is recorded: none undelivered

    def detected(self) -> list[AlertEvent]:
        return [e for e in self.events if e.kind is AlertKind.DETECTED]

    def outcomes(self) -> list[AlertEvent]:
        return [e for e in self.events if e.kind is AlertKind.OUTCOME]

    def results(self) -> dict[str, list[Result]]:
        """run_id -> every result reported for it, in order."""
        found: dict[str, list[Result]] = {}
        for event in self.events:  # a DETECTED event may carry results too
            for r in event.results:
                found.setdefault(r.action.run.run_id, []).append(r.result)
        return found


@dataclass
class ForwardingAlerter(RecordingAlerter):
    """Records events (the tests' and benchmarks' clocks read them) and hands each to a real alerter:
    the dispatcher and its channels, sending to local servers."""

    forward: Alerter | None = None
    times: list[float] = field(default_factory=list)  # time.monotonic() of each event (one log line each)

    def notify(self, event: AlertEvent) -> None:
        super().notify(event)
        self.times.append(time.monotonic())
        if self.forward is not None:
            self.forward.notify(event)

    def close(self, timeout: float) -> None:
        super().close(timeout)
        if self.forward is not None:
            self.forward.close(timeout)

    def trouble(self) -> str | None:
        return None if self.forward is None else self.forward.trouble()


@dataclass
class Running:
    daemon: Daemon
    thread: threading.Thread
    alerter: RecordingAlerter
    remediator: Any  # RecordingRemediator, or the real one (real_remediation=True)
    metrics: Metrics

    def stop(self) -> None:
        self.daemon.shutdown(timeout=1.0)
        self.thread.join(timeout=10)
        source = self.daemon.parts.source
        if isinstance(source, DatabaseSource):
            source.db.engine.dispose()

    def is_leader(self) -> bool:
        return self.metrics.registry.get_sample_value("dupguard_leader") == 1

    @property
    def detector(self) -> IncrementalDetector | None:
        return incremental_detector(self.daemon)


def incremental_detector(daemon: Daemon) -> IncrementalDetector | None:
    """The database source's incremental detector while it watches (tests wait on its tracker)."""
    source = daemon.parts.source
    return source.detector if isinstance(source, DatabaseSource) else None


def failed_runs(url: str, run_ids: list[str]) -> int:
    """How many of ``run_ids`` Airflow's dag_run table holds as failed (a storm's stopped duplicates)."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM dag_run WHERE state = 'failed' AND run_id = ANY(%s)", (run_ids,))
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def start_daemon(
    url: str,
    *,
    durable: bool = True,
    remediator: RecordingRemediator | None = None,
    real_remediation: bool = False,
    dispatch_options: dict[str, Any] | None = None,
    backend_options: dict[str, Any] | None = None,
    wrap_remediator: Callable[[Remediator], Remediator] | None = None,
    takeover_wait: timedelta | None = None,
    alerter_factory: Callable[[Config, Ledger, Metrics], Alerter] | None = None,
    **overrides: Any,
) -> Running:
    """A daemon in a thread. ``real_remediation``: the remediator the settings ask for (``db`` writes,
    or a real Airflow API server), instead of the recording fake. ``takeover_wait``: instead of the
    production one (lease + write timeout) before a term's first write, for a test about something else
    whose only replica has no predecessor. ``alerter_factory``: a real alerter (built with the daemon's
    config, ledger and metrics) that every event is forwarded to, besides being recorded."""
    settings: dict[str, Any] = {
        "database_url": url,
        "poll_interval": timedelta(milliseconds=20),
        # Polls at one rate, as before the rest interval: these tests are about what a poll does, not when.
        "poll_rest_interval": timedelta(milliseconds=20),
        "leader_check_interval": timedelta(milliseconds=200),
        "startup_lookback": timedelta(minutes=5),
        "http_port": 0,
    } | overrides
    config = Config.of(**settings)
    engine = make_engine(parse_url(url))
    if durable:
        init_db(engine)
    lock = build_leadership(config, engine)  # the lock the daemon gets: lease, takeover wait, fence
    assert isinstance(lock, AdvisoryLock)
    if takeover_wait is not None:
        lock.takeover_wait = takeover_wait
    metrics = Metrics()
    db = open_airflow_db(engine)
    acting: Remediator
    if real_remediation:
        acting = build_remediator(config, engine, db.tables, metrics, fence=lock.fence, **(backend_options or {}))
    else:
        acting = remediator = remediator or RecordingRemediator()
    # as build_parts does: every result's series at 0 from the start (the alert rules' increase() needs it)
    metrics.init_remediations(config.remediation, getattr(acting, "backend_name", "none"))
    if wrap_remediator is not None:
        acting = wrap_remediator(acting)
    ledger = DbLedger(engine) if durable else MemoryLedger()
    alerter = (
        RecordingAlerter()
        if alerter_factory is None
        else ForwardingAlerter(forward=alerter_factory(config, ledger, metrics))
    )
    parts = Parts(
        source=DatabaseSource(config, db, ledger, metrics),
        leadership=lock,
        ledger=ledger,
        remediator=acting,
        alerter=alerter,
        metrics=metrics,
    )
    daemon = Daemon(config, parts, **({"dispatch_options": dispatch_options} if dispatch_options else {}))
    thread = threading.Thread(target=daemon.run, name="daemon-under-test", daemon=True)
    thread.start()
    return Running(daemon, thread, alerter, acting, metrics)


# Multiplies every liveness bound of wait_for (default 1), for a loaded machine (CONTRIBUTING.md): those
# bounds say that something happens, not how fast.
PATIENCE = float(os.environ.get("DUPGUARD_TEST_PATIENCE", "1"))


def wait_for(condition: Callable[[], bool], timeout: float = 15.0, what: str = "condition") -> float:
    """Wait until ``condition`` holds; returns the seconds it took. A bound on liveness, not a speed target
    (times ``PATIENCE``)."""
    limit = timeout * PATIENCE
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > limit:
            raise AssertionError(f"timed out after {limit:g}s waiting for {what}")
        time.sleep(0.01)
    return time.monotonic() - start
