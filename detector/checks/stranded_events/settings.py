"""The stranded_events check's own settings (flags, ``DUPGUARD_*`` env vars, config file keys): ``detector.config``
reads them through ``detector.checks.registry``; this module imports only the ``Setting`` type and parsers."""

from __future__ import annotations

from datetime import timedelta

from detector.settings import Setting, choice, positive_duration

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "stranded_poll_interval",
        timedelta(seconds=60),
        positive_duration,
        "Time between checks for asset events that triggered no run (apache/airflow#56050, every Airflow 3).",
        group="periodic checks",
    ),
    Setting(
        "repair_stranded",
        "dry-run",
        choice("off", "dry-run", "requeue"),
        "Stranded asset events (stranded_events): off, dry-run (log the queue row it would write), requeue "
        "(write it: INSERT on asset_dag_run_queue; Airflow's scheduler then makes the run; docs/runbooks.md).",
        group="periodic checks",
    ),
    Setting(
        "stranded_repair_deadline",
        timedelta(minutes=15),
        positive_duration,
        "How long after a requeue the run that consumes the stranded events may take to appear before "
        "`repair_unverified` is alerted (a DAG at max_active_runs waits for its running run).",
        group="periodic checks",
    ),
)
