"""The ``dupguard`` command line. Thin: parses arguments, wires parts together, maps errors to exit codes.

Exit codes (all subcommands; each one's ``--help`` says which it uses, from ``cli_help.EXIT_CODES``):
    0  done; for ``scan``: no duplicate group found (or the database is Airflow 2, which cannot have them)
    1  ``scan`` found at least one duplicate group; ``doctor``: a code path at risk without protection
    2  bad usage or configuration (every problem is listed)
    3  the database is unreachable, failed a query or is not an Airflow metadata database
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from detector import __version__, config, logs
from detector.app import demo, render, settings_doc
from detector.app.cli_help import ALIASES, EXIT_CODES, Parser, add_settings, epilog
from detector.app.scan import Progress, ScanReport, scan
from detector.checks import enabled
from detector.config import SETTINGS_BY_NAME
from detector.core.detect import DagFilter
from detector.core.plan import Mode, Outcome, plan
from detector.durations import parse_duration
from detector.errors import AirflowApiError, AirflowUnreachable, DatabaseError, DupguardError
from detector.metadb.engine import DEFAULT_CALL_TIMEOUT, make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.settings import GROUPS, globs

EXIT_OK, EXIT_FOUND, EXIT_CONFIG, EXIT_DB = 0, 1, 2, 3


def _duration(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dupguard",
        description="Find and stop duplicate asset-triggered Airflow DAG runs (HA scheduler race).",
        epilog=epilog(
            ["dupguard demo", "dupguard scan --database-url postgresql://user:pass@host/airflow --since 7d"],
            EXIT_CODES,
        )
        + "\n\n`dupguard COMMAND --help` says more; docs/reference/cli.md.",
    )
    parser.add_argument("--version", action="version", version=f"dupguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p_scan = sub.add_parser(
        "scan",
        help="audit history for duplicate groups (one shot)",
        description="Audit the run history for duplicate groups and what the periodic checks find; read-only.",
        epilog=epilog(
            [
                "dupguard scan --database-url postgresql://user:pass@host:5432/airflow --since 7d",
                "dupguard scan --database-url sqlite:////opt/airflow/airflow.db --dags 'etl_*' --format json",
                "dupguard scan --source api --airflow-api-url http://airflow-api-server:8080 --config api.yaml",
            ],
            {
                0: "no duplicate group found (or Airflow 2, which cannot have them)",
                1: "duplicate groups found, or a periodic check found something",
                2: EXIT_CODES[2],
                3: EXIT_CODES[3] + "; or a periodic check failed and nothing was found",
            },
        ),
    )
    p_scan.add_argument("--source", choices=("database", "api"), help=SETTINGS_BY_NAME["source"].help_text)
    p_scan.add_argument("--database-url", metavar="URL", help=SETTINGS_BY_NAME["database_url"].help_text)
    p_scan.add_argument("--airflow-api-url", metavar="URL", help=SETTINGS_BY_NAME["airflow_api_url"].help_text)
    p_scan.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file of settings for --source api (credentials, TLS) [env DUPGUARD_CONFIG; default none]",
    )
    p_scan.add_argument(
        "--since",
        type=_duration,
        metavar="DURATION",
        help="only runs whose run_after is this recent (e.g. 1d, 6h) [default: all history]",
    )
    # Repeatable and comma-separated, as DUPGUARD_DAGS; the old singular spellings stay as hidden aliases.
    for flag, dest, help_ in (
        ("--dags", "dags", "only these DAGs (repeatable or comma-separated) [default: all]"),
        ("--exclude-dags", "exclude_dags", "skip these DAGs (repeatable or comma-separated)"),
    ):
        p_scan.add_argument(flag, action="append", default=[], dest=dest, metavar="GLOB", help=help_)
    p_scan.add_argument("--format", choices=("table", "json", "csv"), default="table", help="[default: table]")
    p_scan.add_argument(
        "--suspect-window",
        type=_duration,
        default=timedelta(seconds=60),
        metavar="DURATION",
        help="partitioned runs of one key this close together are suspected [default: 60s]",
    )
    p_scan.add_argument(
        "--disabled-checks",
        action="append",
        default=[],
        metavar="KIND",
        help=f"skip this periodic check (repeatable or comma-separated; one of {', '.join(enabled.KINDS)}) "
        "[env DUPGUARD_DISABLED_CHECKS]",
    )
    for alias, name in ALIASES.items():
        p_scan.add_argument(alias, action="append", dest=name, help=argparse.SUPPRESS)
    p_scan.add_argument(
        "--db-timeout",
        type=_duration,
        default=timedelta(seconds=DEFAULT_CALL_TIMEOUT),
        metavar="DURATION",
        help=f"client-side deadline of each database round trip [default: {DEFAULT_CALL_TIMEOUT:g}s; a check "
        "whose statement outlasts it is reported failed, the rest of the scan stands]",
    )
    p_scan.add_argument(
        "--split-grace",
        type=_duration,
        default=timedelta(seconds=60),
        metavar="DURATION",
        help="report a partition key split into two pending rows once it lasted this long [default: 60s]",
    )

    settings_note = "Every setting is a flag, an env var and a config file key: `dupguard settings` lists them all."
    p_run = sub.add_parser(
        "run",
        help="the sidecar daemon: detect, alert and remediate continuously",
        usage="%(prog)s [--once] [--config FILE] [--SETTING VALUE ...]",
        description="The sidecar daemon: watch new runs, alert on duplicates and remediate them (default "
        f"dry-run); one replica leads. {settings_note}",
        epilog=epilog(
            [
                "dupguard run --database-url postgresql://user:pass@host/airflow --slack-webhook-url https://...",
                "DUPGUARD_DATABASE_URL=... dupguard run --once --remediation dry-run",
                "dupguard settings --group remediation",
            ],
            {
                0: "stopped (SIGTERM/SIGINT), or `--once` finished its pass",
                2: EXIT_CODES[2] + "; also an --http-port in use",
                3: EXIT_CODES[3] + " (`--once` answers at once)",
                4: "`--once` only: another replica leads (or the lock server is a standby), nothing checked",
            },
        ),
    )
    p_run.add_argument(
        "--once",
        action="store_true",
        help="one pass over the look-back window, then exit (exit 4: another replica leads, nothing checked)",
    )
    add_settings(p_run)

    p_doctor = sub.add_parser(
        "doctor",
        help="is this deployment at risk of duplicates, and is dupguard set up right? (read-only)",
        usage="%(prog)s [--format {table,json}] [--since DURATION] [--config FILE] [--SETTING VALUE ...]",
        description="Is this deployment at risk of duplicates, and is dupguard set up right? Read-only; takes "
        f"the settings of `run` (docs/reference/doctor.md). {settings_note}",
        epilog=epilog(
            ["dupguard doctor --database-url postgresql://user:pass@host/airflow", "dupguard doctor --format json"],
            {
                0: "nothing at risk, or protected",
                1: "a code path at risk without protection",
                2: EXIT_CODES[2],
                3: EXIT_CODES[3],
            },
        ),
    )
    p_doctor.add_argument("--format", choices=("table", "json"), default="table", help="[default: table]")
    p_doctor.add_argument(
        "--since",
        type=_duration,
        default=timedelta(days=30),
        metavar="DURATION",
        help="count duplicates and guard notes this recent [default: 30d]",
    )
    add_settings(p_doctor)

    p_check = sub.add_parser(
        "check-config",
        help="print the effective configuration of `run` (secrets redacted); exit 2 listing every problem",
        usage="%(prog)s [--config FILE] [--SETTING VALUE ...]",
        description="Print the effective configuration of `run` as YAML, secrets redacted, each line saying "
        f"where its value came from. Reads no database: usable offline, e.g. in CI. {settings_note}",
        epilog=epilog(
            ["dupguard check-config --config dupguard.yaml", "DUPGUARD_REMEDIATION=fail dupguard check-config"],
            {0: "the configuration is valid", 2: EXIT_CODES[2]},
        ),
    )
    add_settings(p_check)

    p_settings = sub.add_parser(
        "settings",
        help="list every setting: flag, env var, default and meaning",
        description="Every setting of run, doctor and check-config: its flag, env var (and _FILE for secrets), "
        "config file key, default and meaning, by group. docs/reference/settings.md is generated from the same table.",
        epilog=epilog(
            ["dupguard settings", "dupguard settings --group alerts", "dupguard settings --format json | jq ."],
            {0: "listed", 2: "bad usage"},
        ),
    )
    p_settings.add_argument("--format", choices=("table", "json"), default="table", help="[default: table]")
    p_settings.add_argument(
        "--group", choices=tuple(GROUPS), metavar="GROUP", help="only this group: " + ", ".join(GROUPS)
    )

    init_url_help = SETTINGS_BY_NAME["database_url"].help_text.replace("Required with --source database.", "Required.")
    p_init = sub.add_parser(
        "init-db",
        help="create dupguard's ledger schema `dupguard` in the metadata DB",
        description="Create dupguard's ledger schema `dupguard` in the Airflow metadata database (or remove it).",
        epilog=epilog(
            ["dupguard init-db --database-url postgresql://admin:pass@host/airflow", "dupguard init-db --drop"],
            {0: "done", 2: EXIT_CODES[2], 3: EXIT_CODES[3]},
        ),
    )
    # init-db has no --source: it always needs the database (the setting's text is written for `run`).
    p_init.add_argument("--database-url", metavar="URL", help=init_url_help)
    p_init.add_argument("--drop", action="store_true", help="remove the `dupguard` schema instead (uninstall)")

    p_guard = sub.add_parser(
        "guard",
        help="the in-scheduler guard (an Airflow cluster policy)",
        description="The in-scheduler guard: an Airflow cluster policy that stops a duplicate before it runs "
        "(docs/how-to/guard.md).",
        epilog=epilog(
            ["dupguard guard print-local-settings > airflow_local_settings.py"], {0: "printed", 2: "bad usage"}
        ),
    )
    guard_sub = p_guard.add_subparsers(dest="guard_command", required=True, metavar="GUARD_COMMAND")
    guard_sub.add_parser(
        "print-local-settings",
        help="print the airflow_local_settings.py snippet (for the chart's airflowLocalSettings value)",
        description="Print the airflow_local_settings.py snippet (for the chart's airflowLocalSettings value).",
    )

    p_demo = sub.add_parser(
        "demo",
        help="detect duplicates in an embedded incident (no Airflow needed)",
        description="Detect duplicates in an embedded incident, written to a SQLite database: no Airflow needed.",
        epilog=epilog(
            ["dupguard demo", "dupguard demo --db /tmp/demo.db --format json"],
            {0: "done (the demo's duplicates are the expected answer)", 2: EXIT_CODES[2]},
        ),
    )
    p_demo.add_argument(
        "--db",
        type=Path,
        metavar="FILE",
        help="where to write the demo SQLite database; an existing file is replaced only if an earlier "
        "`dupguard demo` wrote it [default: a new temp dir]",
    )
    p_demo.add_argument("--format", choices=("table", "json", "csv"), default="table", help="[default: table]")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage error (exit 2, message on stderr) or --help (0)
        if exc.code not in (0, None):
            _machine_readable_exit(_requested_format(sys.argv[1:] if argv is None else argv), EXIT_CONFIG, "bad usage")
        raise
    logs.configure("warning", "auto")
    try:
        if args.command == "scan":
            return _scan(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "run":
            return _run(args)
        if args.command == "check-config":
            return _check_config(args)
        if args.command == "doctor":
            return _doctor(args)
        if args.command == "settings":
            print(settings_doc.as_json(args.group) if args.format == "json" else settings_doc.as_text(args.group))
            return EXIT_OK
        if args.command == "init-db":
            return _init_db(args)
        if args.command == "guard":
            from detector.app.guard_cli import print_local_settings

            print(print_local_settings(), end="")
            return EXIT_OK
    except DupguardError as exc:  # the one place an expected failure becomes a message and an exit code
        print(f"dupguard: {exc}", file=sys.stderr)
        # The source could not be read: the database, or the REST API (unreachable, refused, not Airflow 3).
        code = EXIT_DB if isinstance(exc, DatabaseError | AirflowApiError) else EXIT_CONFIG
        if args.command == "scan":
            _machine_readable_exit(args.format, code, str(exc))
        if args.command == "doctor" and args.format == "json":
            from detector.app.doctor import error_json

            print(error_json(code, str(exc)))
        return code
    parser.error(f"unknown command {args.command}")
    return EXIT_CONFIG  # pragma: no cover - parser.error exits


SIGPIPE_STATUS = 141  # what a shell reports for a writer killed by SIGPIPE (128 + 13), as `yes | head` gives


def main_entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`dupguard scan | head`): nothing is left to tell it, and a traceback
        # would only bury its output. Later writes go nowhere, as Python's signal docs advise.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = SIGPIPE_STATUS
    # Everything that must happen before the end has happened (lock released, alerts drained or logged
    # as undelivered, output printed). What is left is the interpreter's teardown, a garbage
    # collection of every module's objects: 2-7 s on a loaded 2-core machine, which pushed SIGTERM
    # past the pod's grace period. So the process ends here, with its streams flushed.
    sys.stderr.flush()
    os._exit(code)


def _progress_bar() -> Progress | None:
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    bar = tqdm(total=0, unit="run", desc="scanning", file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update


def _requested_format(argv: Sequence[str]) -> str:
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


def _machine_readable_exit(fmt: str, code: int, message: str) -> None:
    """Tools parsing ``scan --format json|csv`` always get a document (render.py), even on failure."""
    if fmt == "json":
        print(render.error_json(code, message))
    elif fmt == "csv":
        print(render.csv_header(), end="")


def _print_report(report: ScanReport, fmt: str) -> None:
    if fmt == "json":
        print(render.as_json(report))
    elif fmt == "csv":
        print(render.as_csv(report), end="")
    else:
        print(render.as_table(report), end="")


def _scan(args: argparse.Namespace) -> int:
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
        _print_report(immune, args.format)
        return EXIT_OK
    settings = _scan_settings(args)
    report = scan(
        db,
        now=datetime.now(UTC),
        since=args.since,
        dag_filter=DagFilter(_globs(args.dags), _globs(args.exclude_dags)),
        suspect_window=args.suspect_window,
        message_id_paths=settings.message_id_paths,
        progress=_progress_bar(),
        checks=enabled.build(settings, db, Metrics()),
    )
    _print_report(report, args.format)
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
            progress=_progress_bar(),
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
    _print_report(report, args.format)
    return EXIT_FOUND if report.findings else EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    path: Path = args.db or Path(tempfile.mkdtemp(prefix="dupguard-demo-")) / "airflow.db"
    engine = demo.build(path)
    report = scan(open_airflow_db(engine), now=demo.INCIDENT_START + timedelta(hours=1))
    _print_report(report, args.format)
    if args.format != "table":
        return EXIT_OK
    actions = plan(report.findings, Mode.DRY_RUN, now=report.scanned_at)
    print(f"\nWould alert on-call about {len(report.findings)} group(s). Remediation plan (dry-run):")
    for a in actions:
        verb = {
            Outcome.WOULD_REMEDIATE: "would mark failed",
            Outcome.TOO_LATE: "too late, both runs executed; leave",
            Outcome.PREVENTED: "prevented by the in-scheduler guard; leave",
            Outcome.NOT_CONFIRMED: "suspected only; leave",
        }.get(a.outcome, a.outcome.value)
        print(logs.printable(f"  {a.dag_id}: {verb} {a.run.run_id} (keeps {a.kept_run_id})"))
    print(f"\nDemo database: {path}\nTry: {demo.command()} scan --database-url sqlite:///{path} --format json")
    return EXIT_OK


def _globs(given: Sequence[str] | None) -> tuple[str, ...]:
    """Repeated and comma-separated GLOB flags, as one tuple (as DUPGUARD_DAGS reads)."""
    return tuple(g for text in given or () for g in globs(text))


def _flags(args: argparse.Namespace) -> dict[str, str | None]:
    return {name[len("setting_") :]: value for name, value in vars(args).items() if name.startswith("setting_")}


def _run(args: argparse.Namespace) -> int:
    from detector.app.run import run_daemon

    return run_daemon(_flags(args), config_file=args.config, once=args.once)


def _doctor(args: argparse.Namespace) -> int:
    """``dupguard doctor``: exit 0 nothing at risk or protected, 1 at risk without protection."""
    from detector.app import doctor

    cfg = config.load(_flags(args), None, args.config)
    doc = doctor.doctor(cfg, now=datetime.now(UTC), lookback=args.since)
    print(
        doctor.as_json(doc) if args.format == "json" else doctor.as_table(doc),
        end="\n" if args.format == "json" else "",
    )
    return int(doc["exit_code"])


def _check_config(args: argparse.Namespace) -> int:
    """The effective configuration as YAML (a valid ``--config`` file once secrets are filled in), each
    line commented with where the value came from. Reads no database: usable offline, e.g. in CI."""
    import yaml

    sources: dict[str, str] = {}
    cfg = config.load(_flags(args), None, args.config, sources)
    for name, shown in cfg.redacted().items():
        value = getattr(cfg, name)
        if isinstance(value, timedelta | tuple):  # as a user writes them: 10ms, a,b
            shown = config.format_value(value) if value != () else None
        line = yaml.safe_dump({name: shown}, default_flow_style=True, width=10_000).strip()[1:-1]
        print(f"{line}  # {sources.get(name, 'default')}")
    if cfg.remediation in ("fail", "skip"):
        print(f"# note: {_backend_note(cfg)}")
    return EXIT_OK


def _backend_note(cfg: config.Config) -> str:
    """What the backend will be and why it matters, without reading the database (check-config)."""
    from detector.actions.remediation import choice
    from detector.actions.remediation.readback import NO_START_DATE

    backend = cfg.remediation_backend
    settings = {"remediation_backend": backend, "source": cfg.source, "database_url": cfg.database_url}
    if backend == "auto" and not config.surely_api(settings):
        return (
            "remediation_backend auto: db if the database role holds "
            f"{', '.join(f'{p} on {t}' for t, p in choice.DB_BACKEND)} (checked at start; `dupguard doctor` "
            f"says which), else api, where {choice.HARM}; {choice.WAY_OUT}"
        )
    if backend == "db":
        return "remediation_backend db: a stopped run gets start_date = end_date"
    shown = "auto uses api (no database it can write)" if backend == "auto" else "api"
    return f"remediation_backend {shown}{NO_START_DATE if cfg.remediation == 'fail' else ''}"


def _init_db(args: argparse.Namespace) -> int:
    from detector.app.ledger import SCHEMA, drop_db, init_db

    url = parse_url(config.database_url(args.database_url))
    where = url.render_as_string(hide_password=True)
    if args.drop:
        drop_db(make_engine(url))
        print(f"ledger schema {SCHEMA!r} removed from {where}")
    else:
        init_db(make_engine(url))
        print(f"ledger schema {SCHEMA!r} ready in {where}")
    return EXIT_OK
