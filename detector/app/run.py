"""``dupguard run``: configuration, logging, signals, health server, then the daemon loop."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from types import FrameType

from sqlalchemy import Engine

from detector import __version__, config, logs
from detector.app.daemon import Daemon
from detector.app.health import HealthServer
from detector.app.wiring import Startup, api_reader, build_api_parts, build_parts, connect_with_backoff, wait_for_api
from detector.config import Config
from detector.errors import AirflowApiError, AirflowUnreachable, ConfigError, DatabaseError
from detector.metadb.engine import connect, make_engine, open_airflow_db, parse_url, server_role
from detector.metadb.versions import family_of_version
from detector.metrics import Metrics

EXIT_OK, EXIT_CONFIG, EXIT_DB = 0, 2, 3
# Seconds from SIGTERM to the process's end, whatever is still running: the pod's grace period is 5 s at
# the least we support, and what shutdown has not done by then is lost to SIGKILL anyway. Every step of
# shutdown has a share of one deadline (``Daemon.shutdown``); this is the bound over all of them (a DB
# call without an answer, a CPU-starved thread), leaving a second for the exit itself.
SHUTDOWN_DEADLINE = 4.0


def run_daemon(
    flags: Mapping[str, str | None],
    *,
    config_file: str | None = None,
    once: bool = False,
    env: Mapping[str, str] | None = None,
    install_signals: bool = True,
    stop: threading.Event | None = None,
) -> int:
    done = threading.Event()  # set once run has returned: the shutdown deadline no longer applies
    try:
        return _run(flags, config_file, once, env, stop if not install_signals else _signalled(stop, done))
    except ConfigError as exc:
        print(f"dupguard: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (DatabaseError, AirflowApiError) as exc:  # the source cannot be read (database or REST API)
        print(f"dupguard: {exc}", file=sys.stderr)
        return EXIT_DB
    finally:
        done.set()


def _signalled(stop: threading.Event | None, done: threading.Event) -> threading.Event:
    """``stop``, set by SIGTERM or SIGINT (``stop_on_signal``)."""
    stop = stop or threading.Event()
    on_signal = stop_on_signal(stop, done)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def stop_on_signal(
    stop: threading.Event, done: threading.Event | None = None, deadline: float = SHUTDOWN_DEADLINE
) -> Callable[[int, FrameType | None], None]:
    """The SIGTERM/SIGINT handler: sets ``stop`` from a thread of its own, never from the handler.

    Python runs a handler in the main thread between two bytecodes, and the main thread spends its
    time in ``stop.wait()`` (the daemon's loop): a signal landing while ``Event.wait`` holds the
    Event's internal lock (entering or leaving its condition) made ``stop.set()`` wait for that lock,
    held by the very thread it ran on, and the daemon hung for good after logging ``stopping`` (seen
    once in three runs under load). A new thread takes the lock once the main thread lets it go; it
    logs too, as the main thread may be inside a write to the same stream.

    With ``done``, that thread then holds the shutdown to ``deadline`` seconds: if ``done`` is not set
    by then, it logs what it does and ends the process (a session's leader lock goes with its
    connection; the standby takes over as after a SIGKILL, only sooner).
    """

    def stopping(name: str) -> None:
        log = logs.get("dupguard.main")
        log.info("stopping", signal=name)
        stop.set()
        if done is not None and not done.wait(deadline):
            log.warning("shutdown_deadline", seconds=deadline, detail="shutdown had not finished: the process ends now")
            sys.stderr.flush()
            os._exit(EXIT_OK)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        threading.Thread(target=stopping, args=(name,), name="dupguard-stop", daemon=True).start()

    return on_signal


def _run(
    flags: Mapping[str, str | None],
    config_file: str | None,
    once: bool,
    env: Mapping[str, str] | None,
    stop: threading.Event | None,
) -> int:
    cfg = config.load(flags, os.environ if env is None else env, config_file)
    logs.configure(cfg.log_level, cfg.log_format)
    log = logs.get("dupguard.main")
    log.info("config_loaded", version=__version__, settings=cfg.redacted())

    stop = stop or threading.Event()

    metrics = Metrics()
    metrics.config_missing.set(int(cfg.config_missing))
    if cfg.config_missing:
        log.warning(
            "config_missing",
            expected=cfg.config_expected,
            loaded=cfg.config_source,
            detail="settings not given otherwise use built-in defaults (remediation dry-run, no Slack): "
            "check the companion release name and the scheduler label dupguard-config "
            "(docs/how-to/deploy-kubernetes.md)",
        )
    startup = Startup()
    server = None
    if cfg.http_port and not once:
        try:
            server = HealthServer(cfg.http_port, metrics.registry, startup.live, startup.ready).start()
        except OSError as exc:  # the port is taken or not ours to bind: the operator's setting
            raise ConfigError([f"DUPGUARD_HTTP_PORT {cfg.http_port}: cannot listen ({exc.strerror})"]) from None
    try:
        if cfg.source == "api":
            return _run_api(cfg, once, stop, startup, metrics)
        assert cfg.database_url is not None  # config: required with --source database
        engine = make_engine(parse_url(cfg.database_url), read_only=True, call_timeout=cfg.db_timeout.total_seconds())
        # --once is a check or a cron job: an unusable database is its answer (exit 3), not a reason to wait.
        db = open_airflow_db(engine) if once else connect_with_backoff(engine, stop)
        if db is None:
            return EXIT_OK
        _log_server(engine)
        if not db.info.exact:
            log.warning("airflow_version_inferred", revision=db.info.revision, family=db.info.family.value)
        if not db.info.can_duplicate:
            log.info(
                "airflow_2_immune",
                airflow_version=db.info.airflow_version,
                detail="Airflow 2 cannot create duplicate dataset-triggered runs; dupguard idles",
            )
            if not once:
                startup.immune = True
                stop.wait()
            return EXIT_OK
        try:
            parts = build_parts(cfg, db, metrics)
        except ConfigError as exc:  # a setting that this Airflow version rules out (e.g. api + skip on 3.1)
            print(f"dupguard: {exc}", file=sys.stderr)
            return EXIT_CONFIG
        daemon = Daemon(cfg, parts, once=once)
        daemon.stop = stop
        startup.daemon = daemon
        log.info("started", airflow_version=db.info.airflow_version, remediation=cfg.remediation)
        try:
            return daemon.run(once=once)
        finally:
            daemon.shutdown(timeout=3.0)
            log.info("stopped")
    finally:
        if server is not None:
            server.close()


def _log_server(engine: Engine) -> None:
    """One line saying which server detection reads (``run --once`` too): a standby's copy lags the
    primary, so runs committed there within the replay lag are seen that much later; the leader lock
    and the remediation's re-read refuse a standby (``detector.app.leader``, ``refuse_standby``)."""
    log = logs.get("dupguard.main")
    try:
        with connect(engine) as conn:
            role = server_role(conn)
    except DatabaseError:
        return  # the poll loop reports an unreachable database itself
    if role is None:
        return
    if not role.standby:
        log.info("database_server", **role.as_dict())
        return
    log.warning(
        "database_server",
        **role.as_dict(),
        setting="DUPGUARD_DATABASE_URL",
        detail="a hot standby (in recovery): detection sees runs only once replayed here; remediation never "
        "re-reads or writes here (each attempt fails and is retried); point DUPGUARD_DATABASE_URL at the primary",
    )


def _run_api(cfg: Config, once: bool, stop: threading.Event, startup: Startup, metrics: Metrics) -> int:
    """``--source api``: Airflow's REST API only (no database URL, no lock: one replica)."""
    from detector.airflowapi.client import Transient  # only here: see detector.app.wiring.api_reader

    log = logs.get("dupguard.main")
    reader = api_reader(cfg)
    if once:
        try:
            version: str | None = reader.version()
        except Transient as exc:
            raise AirflowUnreachable(str(exc)) from None
    else:
        version = wait_for_api(reader, stop)
    if version is None:
        return EXIT_OK
    if not family_of_version(version).value.startswith("3"):
        raise AirflowUnreachable(f"Airflow {version}: the API source needs Airflow 3 (REST API v2)")
    try:
        parts = build_api_parts(cfg, reader, version, metrics)
    except ConfigError as exc:  # e.g. api + skip on 3.1, an unwritable state file
        print(f"dupguard: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    daemon = Daemon(cfg, parts, once=once)
    daemon.stop = stop
    startup.daemon = daemon
    log.info("started", source="api", airflow_version=version, remediation=cfg.remediation)
    try:
        return daemon.run(once=once)
    finally:
        daemon.shutdown(timeout=3.0)
        log.info("stopped")
