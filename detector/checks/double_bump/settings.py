"""The double_bump check's own settings (flags, ``DUPGUARD_*`` env vars, config file keys): ``detector.config``
reads them through ``detector.checks.registry``; this module imports only the ``Setting`` type and parsers."""

from __future__ import annotations

from datetime import timedelta

from detector.settings import Setting, positive_duration

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "double_bump_poll_interval",
        timedelta(seconds=30),
        positive_duration,
        "Time between checks for task attempts bumped twice (apache/airflow#57618, Airflow 3.0/3.1; reads the "
        "in-flight task instances).",
        group="periodic checks",
    ),
)
