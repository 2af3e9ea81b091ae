"""Builds the daemon's parts from the Config: the only place that knows every concrete implementation."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from detector import logs
from detector.actions.alerts import channels
from detector.actions.alerts.channels.log import LOGGER as ALERTS_LOGGER
from detector.actions.alerts.dispatch import Dispatcher, Undelivered
from detector.actions.remediation import choice
from detector.actions.remediation.guarded import Backend, GuardedRemediator, RunStates
from detector.app.daemon import Daemon, Parts
from detector.app.leader import AdvisoryLock, AlwaysLeader
from detector.app.ledger import MemoryLedger, open_ledger
from detector.app.ledger_file import FileLedger
from detector.checks import enabled as checks
from detector.checks.runner import CheckRunner
from detector.config import Config, api_auth_problems
from detector.core.detect import DagFilter
from detector.core.fence import FenceSource
from detector.core.plan import Mode
from detector.core.ports import Ledger
from detector.errors import ConfigError, DatabaseError, DupguardError
from detector.metadb.engine import AirflowDb, connect, make_engine, open_airflow_db, parse_url
from detector.metadb.schema import AirflowTables, Family
from detector.metadb.versions import family_of_version
from detector.metrics import Metrics
from detector.sources.database.source import DatabaseSource

if TYPE_CHECKING:  # the REST API client (apache-airflow-client) is imported only when used
    from detector.sources.api.reader import Reader

log = logs.get("dupguard.main")
MAX_STARTUP_BACKOFF = 30.0


@dataclass
class Startup:
    """Readiness while the database is still being reached (the daemon does not exist yet)."""

    daemon: Daemon | None = None
    immune: bool = False  # Airflow 2: nothing to watch, ready by definition

    def live(self) -> bool:
        return self.daemon.live() if self.daemon else True

    def ready(self) -> tuple[bool, str]:
        if self.daemon is not None:
            return self.daemon.ready()
        if self.immune:
            return True, "airflow_2: Airflow 2 cannot create these duplicates; nothing to watch"
        return False, "starting: connecting to Airflow (the metadata database, or the REST API with --source api)"


def connect_with_backoff(engine: Engine, stop: threading.Event) -> AirflowDb | None:
    """Identify the Airflow schema, retrying while the database is unreachable; None if stopped."""
    delay = 1.0
    while not stop.is_set():
        try:
            return open_airflow_db(engine)
        except DatabaseError as exc:
            log.warning("database_unavailable_at_start", error=str(exc), retry_in_seconds=delay)
            stop.wait(delay)
            delay = min(MAX_STARTUP_BACKOFF, delay * 2)
    return None


def takeover_wait(config: Config) -> timedelta:
    """How long a replica that just took the lock waits before its first write (docs/explanation/remediation.md,
    Leadership and fencing): one lease (the previous leader's writes are cut off, client side, by the
    end of its lease, which ends at the latest one lease after it lost the lock) plus one write
    timeout (a request Airflow or PostgreSQL already received may still be committed that much
    later). Nothing is written in modes off and dry-run: no wait."""
    if config.remediation not in (Mode.FAIL.value, Mode.SKIP.value):
        return timedelta(0)
    write = config.db_timeout if config.remediation_backend == "db" else config.airflow_timeout
    return config.leader_check_interval * 3 + write


def build_leadership(config: Config, engine: Engine) -> AdvisoryLock | AlwaysLeader:
    """The leader lock: none on SQLite (one ``airflow standalone``), else the advisory lock with a
    lease of three check intervals."""
    if engine.url.get_backend_name() == "sqlite":
        return AlwaysLeader()
    lock_url = parse_url(config.lock_database_url or config.database_url or "")
    lease = config.leader_check_interval * 3
    # A heartbeat that cannot finish within the lease is worthless: bound it by the lease.
    call_timeout = min(config.db_timeout, lease).total_seconds()
    return AdvisoryLock(
        make_engine(lock_url, pool_size=1, call_timeout=call_timeout),
        config.lock_key,
        mode=config.lock_mode,
        lease=lease,
        takeover_wait=takeover_wait(config),
    )


def resolve_backend(config: Config, engine: Engine | None) -> Config:
    """``config`` with DUPGUARD_REMEDIATION_BACKEND=auto replaced by the backend it takes here, chosen once
    (a grant changed later counts at the next start); one warning line when auto could not take db.
    ConfigError when auto falls back to api and the API is not configured."""
    if config.remediation_backend != "auto" or config.remediation not in (Mode.FAIL.value, Mode.SKIP.value):
        return config  # off and dry-run write nothing: no backend to choose
    held = None
    dialect = None if engine is None else engine.url.get_backend_name()
    if engine is not None and dialect == "postgresql":
        with connect(engine) as conn:
            held = choice.held_grants(conn)
    chosen = choice.choose("auto", source=config.source, dialect=dialect, held=held)
    if chosen.why_not_db:
        log.warning("remediation_backend_auto_api", reason=choice.warning(chosen))
        missing = config_problems_for_api(config)
        if missing:
            raise ConfigError([f"{choice.warning(chosen)}; and {'; '.join(missing)}"])
    return replace(config, remediation_backend=chosen.backend)


def config_problems_for_api(config: Config) -> list[str]:
    names = ("airflow_token", "airflow_token_command", "airflow_username", "airflow_password")
    v = {name: getattr(config, name) for name in names}
    problems = [] if config.airflow_api_url else ["the api backend needs DUPGUARD_AIRFLOW_API_URL"]
    return problems + api_auth_problems(v, "the api backend")


def build_parts(config: Config, db: AirflowDb, metrics: Metrics) -> Parts:
    engine = db.engine
    config = resolve_backend(config, engine)
    leadership = build_leadership(config, engine)
    ledger = open_ledger(config.ledger, engine)
    remediator = build_remediator(config, engine, db.tables, metrics, fence=leadership.fence)
    alerter = build_alerter(config, ledger, metrics)
    metrics.init_remediations(config.remediation, remediator.backend_name)
    metrics.init_alerts(alerter.channel_names)
    enabled = checks.build(config, db, metrics)
    metrics.init_checks([c.kind for c in enabled])
    runner = CheckRunner(
        db,
        enabled,
        ledger,
        alerter,
        metrics,
        cluster=config.cluster_name,
        dag_filter=DagFilter(config.dags, config.exclude_dags),
        fence=leadership.fence,
    )
    return Parts(
        source=DatabaseSource(config, db, ledger, metrics),
        leadership=leadership,
        ledger=ledger,
        remediator=remediator,
        alerter=alerter,
        metrics=metrics,
        checks=runner if enabled else None,
    )


# --- alerts: the channels come from their registry ---


def build_alerter(
    config: Config,
    ledger: Ledger,
    metrics: Metrics,
    *,
    retries: int = 2,
    digest_delay: float = 10.0,
    storm_window: float = 60.0,
) -> Dispatcher:
    """The daemon's Alerter for ``config``: the log sink always, and every configured channel of the
    registry (``detector/actions/alerts/channels/__init__.py``), each client built with the alert timeout."""
    timeout = config.alert_timeout.total_seconds()
    undelivered = Undelivered()  # shared with the Alertmanager channels: their re-sends fail on their own thread
    needs = channels.Needs(
        ledger,
        metrics,
        timeout=timeout,
        retries=retries,
        undelivered=undelivered.add,
        requests_per_minute=config.alert_requests_per_minute,
    )
    enabled = channels.build(config, needs)
    logs.get(ALERTS_LOGGER).info(
        "alerts_configured",
        channels=["log", *(c.name for c in enabled)],
        slack_transport=next((c.transport for c in enabled if c.transport), None),
        storm_threshold=config.alert_storm_threshold,
        timeout_seconds=timeout,
    )
    return Dispatcher(
        enabled,
        ledger,
        metrics,
        ui_url=config.airflow_ui_url,
        storm_threshold=config.alert_storm_threshold,
        storm_window=storm_window,
        digest_delay=digest_delay,
        undelivered=undelivered,
        stopping=needs.stopping,
    )


# --- remediation: the factory lives here so the base module never imports its own backends ---


def build_remediator(
    config: Config,
    engine: Engine | None,
    tables: AirflowTables | None,
    metrics: Metrics | None,
    *,
    family: Family | None = None,
    states: RunStates | None = None,
    fence: FenceSource | None = None,
    **backend_options: Any,
) -> GuardedRemediator:
    """The executor for ``config.remediation`` / ``config.remediation_backend``.

    ``states`` (with ``family``) instead of ``engine``/``tables``: the re-reads go through the REST
    API (``--source api``). ``fence``: the leader's permission to write, asked before every write (None:
    the only replica, unfenced). ``backend_options`` reach the backend's constructor (tests: clocks, back-off lengths).
    """
    config = resolve_backend(config, engine)
    mode = Mode(config.remediation)
    if mode is not Mode.OFF and engine is not None and engine.url.get_backend_name() == "postgresql":
        # A pool of its own: a storm's workers, each waiting on a locked row, must never hold the
        # connections the polls and the ledger's claims need (detection then followed the stop rate).
        engine = make_engine(engine.url, call_timeout=config.db_timeout.total_seconds())
    common: dict[str, Any] = {
        "configured_mode": mode,
        "metrics": metrics,
        "remediate_started": config.remediate_started,
    }
    if mode is Mode.OFF:
        return GuardedRemediator(backend=None, engine=None, tables=None, **common)
    if mode is Mode.DRY_RUN:
        return GuardedRemediator(backend=None, engine=engine, tables=tables, states=states, **common)
    backend: Backend
    if fence is not None:
        backend_options = {"fence": fence} | backend_options
    if config.remediation_backend == "db":
        assert engine is not None and tables is not None, "the db backend needs the database (refused by config)"
        from detector.actions.remediation.db import DbBackend

        backend = DbBackend(engine, tables, remediate_started=config.remediate_started, **backend_options)
    else:
        from detector.actions.remediation.api import ApiBackend

        backend = ApiBackend.from_config(config, engine, tables, family=family, states=states, **backend_options)
    return GuardedRemediator(backend=backend, engine=engine, tables=tables, states=states, **common)


# --- the REST API source (--source api): no database at all ---


# Imported here, not at the top: apache-airflow-client takes ~1 s and ~30 MB to import, which the
# database source (the default) would pay at every start (the start-up window).
def api_reader(config: Config) -> Reader:
    from detector.airflowapi.session import Session
    from detector.sources.api.reader import Reader

    return Reader(Session.from_config(config), id_paths=config.message_id_paths)


def wait_for_api(reader: Reader, stop: threading.Event) -> str | None:
    """Airflow's version, retrying while the API is unreachable or refuses dupguard; None if stopped."""
    from detector.airflowapi.client import Transient

    delay = 1.0
    while not stop.is_set():
        try:
            return reader.version()
        except (DupguardError, Transient) as exc:
            log.warning("airflow_api_unavailable_at_start", error=str(exc), retry_in_seconds=delay)
            stop.wait(delay)
            delay = min(MAX_STARTUP_BACKOFF, delay * 2)
    return None


def build_api_parts(config: Config, reader: Reader, version: str, metrics: Metrics) -> Parts:
    """One replica, no lock (the Deployment runs exactly one: replicas 1, strategy Recreate); the
    ledger in ``DUPGUARD_STATE_FILE`` when set, else in memory."""
    from detector.sources.api.reader import ApiRunStates
    from detector.sources.api.source import ApiSource

    if config.state_file:
        ledger: MemoryLedger = FileLedger(config.state_file)
    else:
        ledger = MemoryLedger()
        log.warning(
            "ledger_in_memory",
            reason="DUPGUARD_STATE_FILE not set",
            consequence="a restart re-reads the look-back and may alert again about recent groups "
            "(remediation stays safe: the note on a stopped run keeps the decision)",
        )
    family = family_of_version(version)
    config = resolve_backend(config, None)
    remediator = build_remediator(config, None, None, metrics, family=family, states=ApiRunStates(api_reader(config)))
    alerter = build_alerter(config, ledger, metrics)
    metrics.init_remediations(config.remediation, remediator.backend_name)
    metrics.init_alerts(alerter.channel_names)
    return Parts(
        source=ApiSource(config, reader, ledger, metrics, version=version),
        leadership=AlwaysLeader(),
        ledger=ledger,
        remediator=remediator,
        alerter=alerter,
        metrics=metrics,
    )
