"""The ``dupguard`` argument parser: every command, its flags, examples and exit codes (help texts from
``detector/settings.py`` and ``cli_help.py``)."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

from detector import __version__
from detector.app.cli_help import ALIASES, EXIT_CODES, Parser, add_settings, epilog
from detector.checks import enabled
from detector.config import SETTINGS_BY_NAME
from detector.durations import parse_duration
from detector.metadb.engine import DEFAULT_CALL_TIMEOUT
from detector.settings import GROUPS


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
