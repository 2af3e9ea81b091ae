"""The split_partition check's own settings (flags, ``DUPGUARD_*`` env vars, config file keys): ``detector.config``
reads them through ``detector.checks.registry``; this module imports only the ``Setting`` type and parsers."""

from __future__ import annotations

from datetime import timedelta

from detector.durations import parse_duration
from detector.settings import Setting, positive_duration

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "split_grace",
        timedelta(seconds=60),
        parse_duration,
        "A partition key split into two pending asset_partition_dag_run rows is reported once it lasted this long.",
        group="periodic checks",
    ),
    Setting(
        "split_poll_interval",
        timedelta(seconds=60),
        positive_duration,
        "Time between checks for split partition keys (Airflow 3.2+; a scan of asset_partition_dag_run).",
        group="periodic checks",
    ),
)
