"""The ``dupguard`` command line. Thin: parses arguments, wires parts together, maps errors to exit codes.

Exit codes (all subcommands; each one's ``--help`` says which it uses, from ``cli_help.EXIT_CODES``):
    0  done; for ``scan``: no duplicate group found (or the database is Airflow 2, which cannot have them)
    1  ``scan`` found at least one duplicate group; ``doctor``: a code path at risk without protection
    2  bad usage or configuration (every problem is listed)
    3  the database is unreachable, failed a query or is not an Airflow metadata database
    4  ``run --once`` only: another replica leads, nothing checked
Each command's own list: docs/reference/exit-codes.md (generated from the ``--help`` texts).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from detector import config, logs
from detector.app import demo, settings_doc
from detector.app.cli_help import EXIT_CONFIG, EXIT_DB, EXIT_OK
from detector.app.cli_parser import build_parser
from detector.app.cli_scan import machine_readable_exit, print_report, requested_format, scan_command
from detector.core.plan import Mode, Outcome, plan
from detector.errors import AirflowApiError, DatabaseError, DupguardError
from detector.metadb.engine import make_engine, parse_url

__all__ = ["build_parser", "main", "main_entry"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse's usage error (exit 2, message on stderr) or --help (0)
        if exc.code not in (0, None):
            machine_readable_exit(requested_format(sys.argv[1:] if argv is None else argv), EXIT_CONFIG, "bad usage")
        raise
    logs.configure("warning", "auto")
    try:
        if args.command == "scan":
            return scan_command(args)
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
            machine_readable_exit(args.format, code, str(exc))
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


def _demo(args: argparse.Namespace) -> int:
    path: Path = args.db or Path(tempfile.mkdtemp(prefix="dupguard-demo-")) / "airflow.db"
    report = demo.incident_report(path)
    print_report(report, args.format)
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
