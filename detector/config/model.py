"""The frozen Config: every setting, typed, built once at start-up by ``detector.config.load``."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from detector import redact as _redact
from detector.config.table import SETTINGS, SETTINGS_BY_NAME
from detector.metadb.engine import parse_url, redact
from detector.settings import url, urls


@dataclass(frozen=True)
class Config:
    """Every setting, typed. Build it with ``load`` (or ``Config.of`` in tests); defaults live in SETTINGS."""

    source: str
    database_url: str | None
    lock_database_url: str | None
    lock_mode: str
    lock_key: int
    db_timeout: timedelta
    poll_interval: timedelta
    poll_rest_interval: timedelta
    poll_hold: timedelta
    leader_check_interval: timedelta
    startup_lookback: timedelta
    suspect_window: timedelta
    message_id_paths: tuple[tuple[str, tuple[str, ...]], ...]
    split_grace: timedelta
    split_poll_interval: timedelta
    trigger_flapping_interval: timedelta
    triggerer_health_check_threshold: timedelta
    stranded_poll_interval: timedelta
    repair_stranded: str
    stranded_repair_deadline: timedelta
    double_bump_poll_interval: timedelta
    double_bump_health_check_threshold: timedelta
    double_bump_orphan_check_interval: timedelta
    disabled_checks: tuple[str, ...]
    gap_grace: timedelta
    dags: tuple[str, ...]
    exclude_dags: tuple[str, ...]
    cluster_name: str
    http_port: int
    log_level: str
    log_format: str
    summary_interval: timedelta
    config_source: str | None
    config_expected: str | None
    state_file: str | None
    ledger: str
    remediation: str
    remediation_backend: str
    remediate_started: bool
    airflow_api_url: str | None
    airflow_username: str | None
    airflow_password: str | None = field(repr=False)
    airflow_token: str | None = field(repr=False)
    airflow_token_command: str | None = field(repr=False)
    airflow_token_command_timeout: timedelta
    airflow_ca_bundle: str | None
    airflow_verify_tls: bool
    airflow_timeout: timedelta
    airflow_ui_url: str | None
    runbook_url: str | None
    unstopped_severity: str
    grafana_dashboard_url: str | None
    slack_bot_token: str | None = field(repr=False)
    slack_channel: str | None
    slack_webhook_url: str | None = field(repr=False)
    slack_api_url: str | None
    webhook_url: str | None = field(repr=False)
    alertmanager_urls: tuple[str, ...]
    alertmanager_username: str | None
    alertmanager_password: str | None = field(repr=False)
    alertmanager_bearer_token: str | None = field(repr=False)
    alertmanager_ca_bundle: str | None
    alertmanager_verify_tls: bool
    alertmanager_resend_interval: timedelta
    alertmanager_resolve_after: timedelta
    alert_storm_threshold: int
    alert_requests_per_minute: int
    alert_timeout: timedelta

    @classmethod
    def of(cls, **overrides: Any) -> Config:
        """A Config with SETTINGS' defaults and ``overrides`` (no validation: for tests and tools)."""
        return cls(**({s.name: s.default for s in SETTINGS} | overrides))

    @property
    def config_missing(self) -> bool:
        """The deployment meant to load a configuration (the sidecar overlay's DUPGUARD_CONFIG_EXPECTED)
        that did not arrive: an optional ConfigMap that is absent or another one, so defaults apply."""
        return self.config_expected is not None and self.config_source != self.config_expected

    def redacted(self) -> dict[str, Any]:
        """Every setting as loggable values: secrets masked, URLs without passwords (parsed, not replaced)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            setting = SETTINGS_BY_NAME[f.name]
            if value is None:
                out[f.name] = None
            elif f.name in {"database_url", "lock_database_url"}:
                out[f.name] = redact(parse_url(value))
            elif setting.secret:
                out[f.name] = _redact.MASK
            elif setting.parse is url:
                out[f.name] = _redact.web_url(value)
            elif setting.parse is urls:
                out[f.name] = [_redact.web_url(u) for u in value]
            elif isinstance(value, timedelta):
                out[f.name] = value.total_seconds()
            else:
                out[f.name] = value
        return out
