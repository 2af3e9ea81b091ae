"""The trigger_flapping check's own settings (flags, ``DUPGUARD_*`` env vars, config file keys): ``detector.config``
reads them through ``detector.checks.registry``; this module imports only the ``Setting`` type and parsers."""

from __future__ import annotations

from datetime import timedelta

from detector.settings import Setting, positive_duration

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "trigger_flapping_interval",
        timedelta(seconds=10),
        positive_duration,
        "Time between looks at trigger owners (trigger_flapping; keep it under the threshold below minus 5 s).",
        group="periodic checks",
    ),
    Setting(
        "triggerer_health_check_threshold",
        timedelta(seconds=30),
        positive_duration,
        "Your Airflow's `[triggerer] triggerer_health_check_threshold`: a triggerer heartbeating within it is alive.",
        group="periodic checks",
    ),
)
