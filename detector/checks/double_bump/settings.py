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
    # Airflow's [scheduler] config, which dupguard cannot read: set them to the deployment's values.
    Setting(
        "double_bump_health_check_threshold",
        timedelta(seconds=30),
        positive_duration,
        "Airflow's [scheduler] scheduler_health_check_threshold (Airflow's default 30 s): an orphan reset "
        "follows a dead scheduler's last heartbeat by more than this, so a bump sooner is reported.",
        group="periodic checks",
    ),
    Setting(
        "double_bump_orphan_check_interval",
        timedelta(seconds=300),
        positive_duration,
        "Airflow's [scheduler] orphaned_tasks_check_interval (Airflow's default 300 s): an orphan reset "
        "comes at the first orphan check after a scheduler could be declared dead.",
        group="periodic checks",
    ),
)
