"""The one frozen configuration, built once at start-up from flags > env (``DUPGUARD_*``) > YAML file > defaults.

Every secret may also come from a file named by ``DUPGUARD_<NAME>_FILE`` (mounted Kubernetes
Secrets). ``SETTINGS`` (``table.py``) is the single source of truth: flags, env, help, the chart schema
and docs/reference/settings.md are made from it. ``model.py`` holds the typed ``Config``, ``load.py``
reads and validates, ``cross_checks.py`` holds the rules between settings.
"""

from __future__ import annotations

from detector.config.cross_checks import api_auth_problems, surely_api
from detector.config.loading import database_url, flag_names, load
from detector.config.model import Config
from detector.config.table import API_POLL_INTERVAL, REPOSITORY_URL, RUNBOOK_URL, SETTINGS, SETTINGS_BY_NAME
from detector.settings import format_duration, format_value

__all__ = [
    "API_POLL_INTERVAL",
    "REPOSITORY_URL",
    "RUNBOOK_URL",
    "SETTINGS",
    "SETTINGS_BY_NAME",
    "Config",
    "api_auth_problems",
    "database_url",
    "flag_names",
    "format_duration",
    "format_value",
    "load",
    "surely_api",
]
