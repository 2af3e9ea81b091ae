"""``dupguard scan``: the one-shot audit, from the metadata database or through Airflow's REST API, and
the documents it prints (a tool parsing ``--format json|csv`` gets one even on failure)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime

from detector import config
from detector.app import render
from detector.app.cli_help import EXIT_DB, EXIT_FOUND, EXIT_OK
from detector.app.scan import Progress, ScanReport, scan
from detector.checks import enabled
from detector.core.detect import DagFilter
from detector.errors import AirflowUnreachable
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.settings import globs


def progress_bar() -> Progress | None:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    bar = tqdm(total=0, unit="run", desc="scanning", file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update


def requested_format(argv: Sequence[str]) -> str:
    """The ``--format`` a ``scan`` command line asked for, read without argparse (which just failed)."""
    if "scan" not in argv:
        return "table"
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--format" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--format="):
            return arg.split("=", 1)[1]
    return "table"


def machine_readable_exit(fmt: str, code: int, message: str) -> None:
    """Tools parsing ``scan --format json|csv`` always get a document (render.py), even on failure."""
    if fmt == "json":
        print(render.error_json(code, message))
    elif fmt == "csv":
        print(render.csv_header(), end="")


def print_report(report: ScanReport, fmt: str) -> None:
    if fmt == "json":
        print(render.as_json(report))
    elif fmt == "csv":
        print(render.as_csv(report), end="")
    else:
        print(render.as_table(report), end="")


def scan_command(args: argparse.Namespace) -> int:
    source = args.source or os.environ.get("DUPGUARD_SOURCE") or "database"
    if source == "api":
        return _scan_api(args)
    url = parse_url(config.database_url(args.database_url))
    db = open_airflow_db(make_engine(url, read_only=True, call_timeout=args.db_timeout.total_seconds()))
    if not db.info.exact:
        print(
            f"dupguard: warning: unknown alembic revision {db.info.revision!r}; "
            f"schema looks like Airflow {db.info.family.value}",
            file=sys.stderr,
        )
    if not db.info.can_duplicate:
        note = (
            f"Airflow {db.info.airflow_version}: Airflow 2 cannot create duplicate dataset-triggered runs "
            "(UNIQUE(dag_id, execution_date) and a deterministic run_id prevent them). Nothing to scan."
        )
        now = datetime.now(UTC)
        since = None if args.since is None else now - args.since
        immune = ScanReport(info=db.info, findings=[], scanned_at=now, since=since, runs_examined=0, note=note)
        print_report(immune, args.format)
        return EXIT_OK
    settings = _scan_settings(args)
    report = scan(
        db,
        now=datetime.now(UTC),
        since=args.since,
        dag_filter=DagFilter(_globs(args.dags), _globs(args.exclude_dags)),
        suspect_window=args.suspect_window,
        message_id_paths=settings.message_id_paths,
        progress=progress_bar(),
        checks=enabled.build(settings, db, Metrics()),
    )
    print_report(report, args.format)
    for kind, why in report.check_errors.items():
        print(
            f"dupguard: check {kind} failed, so its findings are missing from this report: {why} "
            f"(a longer --db-timeout, or --disabled-checks {kind})",
            file=sys.stderr,
        )
    if report.findings or any(report.observations.values()):
        return EXIT_FOUND  # what was found is the answer; a failed check is said on stderr and in the report
    return EXIT_DB if report.check_errors else EXIT_OK


def _scan_settings(args: argparse.Namespace) -> config.Config:
    """The settings `run` reads from the environment (a check's thresholds, DUPGUARD_DISABLED_CHECKS,
    DUPGUARD_MESSAGE_ID_PATHS) with scan's own flags on top; a bad setting exits 2 as for `run`."""
    flags = {
        "database_url": args.database_url,
        "split_grace": f"{args.split_grace.total_seconds()}s",
        "disabled_checks": ",".join(args.disabled_checks) or None,
    }
    return config.load(flags, None, args.config)


def _scan_api(args: argparse.Namespace) -> int:
    """``scan --source api``: the audit through Airflow's REST API; settings as ``run`` reads them."""
    from detector.airflowapi.client import Gone, Transient
    from detector.airflowapi.session import Session
    from detector.metadb.versions import SchemaInfo, family_of_version
    from detector.sources.api.reader import Reader
    from detector.sources.api.scan import scan_api

    flags: dict[str, str | None] = {"source": "api", "airflow_api_url": args.airflow_api_url}
    cfg = config.load(flags, None, args.config)
    reader = Reader(Session.from_config(cfg), id_paths=cfg.message_id_paths)
    now = datetime.now(UTC)
    try:
        version = reader.version()
        since = None if args.since is None else reader.server_now(now) - args.since  # Airflow's clock, not this host's
        result = scan_api(
            reader,
            now=now,
            since=since,
            dag_filter=DagFilter(_globs(args.dags), _globs(args.exclude_dags)),
            suspect_window=args.suspect_window,
            progress=progress_bar(),
        )
    except (Transient, Gone) as exc:
        raise AirflowUnreachable(str(exc)) from None
    finally:
        reader.http.close()
    note = None
    if result.waiting or result.unreadable_events:
        note = (
            f"{result.waiting} candidate run(s) and {result.unreadable_events} asset event(s) not judged: Airflow "
            "cannot serve the consumed events of a run it has not started (apache/airflow#71360)"
        )
    info = SchemaInfo(family_of_version(version), version, None, exact=True)
    report = ScanReport(
        info=info,
        findings=result.findings,
        scanned_at=now,
        since=since,
        runs_examined=result.runs_examined,
        note=note,
        source="api",
    )
    print_report(report, args.format)
    return EXIT_FOUND if report.findings else EXIT_OK


def _globs(given: Sequence[str] | None) -> tuple[str, ...]:
    """Repeated and comma-separated GLOB flags, as one tuple (as DUPGUARD_DAGS reads)."""
    return tuple(g for text in given or () for g in globs(text))
