"""The one frozen configuration, built once at start-up from flags > env (``DUPGUARD_*``) > YAML file > defaults.

Every secret may also come from a file named by ``DUPGUARD_<NAME>_FILE`` (mounted Kubernetes
Secrets). Validation collects every problem before failing, so an operator fixes them in one go.
``SETTINGS`` is the single source of truth: the settings table of docs/reference/settings.md is checked against it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml

from detector import __version__
from detector import redact as _redact
from detector.checks.registry import KINDS as CHECK_KINDS
from detector.checks.registry import SETTINGS as CHECK_SETTINGS
from detector.durations import parse_duration
from detector.errors import ConfigError
from detector.metadb.engine import parse_url, redact
from detector.settings import (
    ENV_PREFIX,
    Setting,
    boolean,
    choice,
    file_path,
    globs,
    lock_key_value,
    port,
    positive_duration,
    positive_int,
    url,
    urls,
)
from detector.settings import format_duration as format_duration  # re-exported: callers read it here
from detector.settings import format_value as format_value

API_POLL_INTERVAL = timedelta(
    milliseconds=250
)  # --source api: benchmarks/api_source.py, benchmarks/results/measurements.md


def _db_url(text: str) -> str:
    parse_url(text)  # raises ConfigError with a redacted message
    return text


# The runbook on-call clicks: this version's released docs/runbooks.md (the tag is the package version,
# so the PrometheusRule, Slack and Alertmanager link the same page; tests/deploy check the rule file).
REPOSITORY_URL = "https://github.com/airflow-dupguard/airflow-dupguard"
RUNBOOK_URL = f"{REPOSITORY_URL}/blob/v{__version__}/docs/runbooks.md"

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "source",
        "database",
        choice("database", "api"),
        "Where runs are read: database (the metadata DB) or api (Airflow's REST API v2 only, for "
        "platforms without DB access; needs DUPGUARD_AIRFLOW_API_URL and credentials, no database URL).",
        group="source and database",
        common=True,
    ),
    Setting(
        "database_url",
        None,
        _db_url,
        "Airflow metadata DB URL (postgresql://, postgres://, postgresql+psycopg2://, sqlite:///). "
        "Required with --source database.",
        secret=True,
        group="source and database",
        metavar="URL",
        common=True,
    ),
    Setting(
        "lock_database_url",
        None,
        _db_url,
        "Direct (non-PgBouncer) URL for the leader lock; defaults to the database URL.",
        secret=True,
        group="leadership",
        metavar="URL",
    ),
    Setting(
        "lock_mode",
        "auto",
        choice("auto", "session", "transaction"),
        "Leader lock: auto (session lock on a session proven pinned, else transaction lock), session "
        "(refused on a session not proven pinned), transaction (lock held in an open transaction; works "
        "through PgBouncer).",
        group="leadership",
    ),
    Setting(
        "lock_key",
        7_355_608_201,
        lock_key_value,
        "PostgreSQL advisory lock key, a bigint (Airflow uses 1 and 2).",
        group="leadership",
    ),
    Setting(
        "db_timeout",
        timedelta(seconds=5),
        positive_duration,
        "Client-side deadline of every database round trip (works behind PgBouncer and against a stalled server).",
        group="source and database",
    ),
    Setting(
        "poll_interval",
        # 30 ms, not 10: the idle CPU is per pass (2.3 % of a core at 10 ms, 1.2 % at 30 ms) and the share of
        # duplicates stopped before their first task did not change (benchmarks/results/measurements.md).
        timedelta(milliseconds=30),
        positive_duration,
        "Time between polls for new runs (with --source api the default is 250ms: each poll is a request).",
        group="detection",
    ),
    Setting(
        "leader_check_interval",
        timedelta(seconds=1),
        positive_duration,
        "How often standbys try the lock and the leader re-checks it.",
        group="leadership",
    ),
    Setting(
        "startup_lookback",
        timedelta(minutes=15),
        parse_duration,
        "On a start without a ledger watermark, re-examine runs queued this recently.",
        group="detection",
    ),
    Setting(
        "suspect_window",
        timedelta(seconds=60),
        parse_duration,
        "Partitioned runs of one key this close together with different events are suspected.",
        group="detection",
    ),
    *CHECK_SETTINGS,  # each periodic check's own (detector/checks/<kind>/settings.py), in registry order
    Setting(
        "disabled_checks",
        (),
        globs,
        "Comma-separated kinds of periodic check to switch off (docs/explanation/detection.md), "
        "e.g. `split_partition`.",
        group="periodic checks",
        metavar="KIND[,KIND...]",
        common=True,
    ),
    Setting(
        "gap_grace",
        timedelta(seconds=60),
        positive_duration,
        "How long an unseen lower dag_run id may still commit.",
        group="detection",
    ),
    Setting("dags", (), globs, "Comma-separated dag_id globs to watch (empty: all).", group="detection", common=True),
    Setting("exclude_dags", (), globs, "Comma-separated dag_id globs to ignore.", group="detection"),
    Setting(
        "cluster_name", "airflow", str, "Name of this Airflow deployment in alerts.", group="alerts", metavar="NAME"
    ),
    Setting(
        "http_port",
        9469,
        port,
        "Port of /livez, /readyz and /metrics (0: disabled).",
        group="health and logs",
        common=True,
    ),
    Setting(
        "log_level",
        "info",
        choice("debug", "info", "warning", "error"),
        "Log level.",
        group="health and logs",
        common=True,
    ),
    Setting(
        "log_format",
        "auto",
        choice("auto", "json", "console"),
        "json, console, or auto (console on a TTY).",
        group="health and logs",
    ),
    Setting(
        "summary_interval",
        timedelta(seconds=60),
        positive_duration,
        "Interval of the summary log line.",
        group="health and logs",
    ),
    Setting(
        "config_source",
        None,
        str,
        "Which configuration this is, e.g. `configmap/dupguard` (set by the companion chart's ConfigMap).",
        group="health and logs",
        metavar="NAME",
    ),
    Setting(
        "config_expected",
        None,
        str,
        "The configuration the deployment meant to load (set by the sidecar overlay); when it differs "
        "from `config_source`, dupguard warns `config_missing` and sets `dupguard_config_missing` to 1.",
        group="health and logs",
        metavar="NAME",
    ),
    Setting(
        "state_file",
        None,
        str,
        "--source api: a file on a volume for the tail cursor and what was alerted and decided, so a "
        "restart neither misses runs nor alerts twice (without it: memory only).",
        group="source and database",
        metavar="FILE",
    ),
    Setting(
        "ledger",
        "auto",
        choice("auto", "on", "off"),
        "Durable ledger in schema `dupguard`: auto (use it "
        "if `dupguard init-db` made it), on (create it at start), off (memory only).",
        group="source and database",
    ),
    Setting(
        "remediation",
        "dry-run",
        choice("off", "dry-run", "fail", "skip"),
        "What to do with confirmed "
        "duplicates: off, dry-run (log what would be done), fail (mark run failed), skip (skip its tasks).",
        group="remediation",
        common=True,
    ),
    Setting(
        "remediation_backend",
        "auto",
        choice("auto", "api", "db"),
        "auto (db where the database source's role holds its grants, else api), api (Airflow REST API) or "
        "db (direct writes; sets start_date, so Airflow's asset-event views keep working).",
        group="remediation",
    ),
    Setting(
        "remediate_started", False, boolean, "Also stop duplicates whose tasks already started.", group="remediation"
    ),
    Setting(
        "airflow_api_url",
        None,
        url,
        "Airflow API server base URL, e.g. http://airflow-api-server:8080.",
        group="Airflow API",
        common=True,
    ),
    Setting("airflow_username", None, str, "Airflow user for POST /auth/token.", group="Airflow API", metavar="USER"),
    Setting(
        "airflow_password", None, str, "Password of that user.", secret=True, group="Airflow API", metavar="PASSWORD"
    ),
    Setting(
        "airflow_token",
        None,
        str,
        "A static Airflow API token (e.g. an Astronomer Deployment API token) instead of username/password.",
        secret=True,
        group="Airflow API",
        metavar="TOKEN",
    ),
    Setting(
        "airflow_token_command",
        None,
        str,
        "A command (run by /bin/sh -c) whose stdout is the API token; run again before the token's `exp` "
        "(or after a 401). For platforms that mint short-lived tokens. Never logged.",
        secret=True,
        group="Airflow API",
        metavar="COMMAND",
    ),
    Setting(
        "airflow_token_command_timeout",
        timedelta(seconds=30),
        positive_duration,
        "Timeout of the token command (killed with its children when it overruns).",
        group="Airflow API",
    ),
    Setting("airflow_ca_bundle", None, file_path, "CA bundle file for the API's TLS certificate.", group="Airflow API"),
    Setting("airflow_verify_tls", True, boolean, "Verify the API's TLS certificate.", group="Airflow API"),
    Setting(
        "airflow_timeout",
        timedelta(seconds=5),
        positive_duration,
        "Timeout of each Airflow API call.",
        group="Airflow API",
    ),
    Setting("airflow_ui_url", None, url, "Airflow UI base URL for links in alerts.", group="alerts"),
    Setting(
        "runbook_url",
        RUNBOOK_URL,
        url,
        "URL of dupguard's docs/runbooks.md (alerts link `<url>#<alert name>`); default: the page released "
        "with this version.",
        group="alerts",
    ),
    Setting(
        "unstopped_severity",
        "critical",
        choice("critical", "warning"),
        "Severity of a duplicate that will run or ran (not stopped: dry-run, off, a stop failed or not "
        "confirmed; too late) on every channel: critical (pages) or warning.",
        group="alerts",
    ),
    Setting(
        "grafana_dashboard_url",
        None,
        url,
        "URL of dupguard's Grafana dashboard, linked from Slack alerts.",
        group="alerts",
    ),
    Setting(
        "slack_bot_token",
        None,
        str,
        "Slack bot token (chat.postMessage, threads, updates).",
        secret=True,
        group="alerts",
        metavar="TOKEN",
    ),
    Setting("slack_channel", None, str, "Slack channel for the bot token.", group="alerts", metavar="CHANNEL"),
    Setting(
        "slack_webhook_url",
        None,
        url,
        "Slack incoming webhook URL (alternative to the bot).",
        secret=True,
        group="alerts",
        common=True,
    ),
    Setting("slack_api_url", None, url, "Slack API base URL override (gateways, tests).", group="alerts"),
    Setting(
        "webhook_url",
        None,
        url,
        "Generic JSON webhook for PagerDuty/Opsgenie/Teams-style receivers.",
        secret=True,
        group="alerts",
    ),
    Setting(
        "alertmanager_urls",
        (),
        urls,
        "Comma-separated Alertmanager base URLs (API v2); every one gets every alert (an HA pair).",
        group="alerts",
        common=True,
    ),
    Setting("alertmanager_username", None, str, "Alertmanager basic-auth user.", group="alerts", metavar="USER"),
    Setting(
        "alertmanager_password", None, str, "Password of that user.", secret=True, group="alerts", metavar="PASSWORD"
    ),
    Setting(
        "alertmanager_bearer_token",
        None,
        str,
        "Bearer token for Alertmanager (instead of basic auth).",
        secret=True,
        group="alerts",
        metavar="TOKEN",
    ),
    Setting(
        "alertmanager_ca_bundle", None, file_path, "CA bundle file for Alertmanager's TLS certificate.", group="alerts"
    ),
    Setting("alertmanager_verify_tls", True, boolean, "Verify Alertmanager's TLS certificate.", group="alerts"),
    Setting(
        "alertmanager_resend_interval",
        timedelta(minutes=1),
        positive_duration,
        "How often an open alert is pushed again (its endsAt is 4 intervals ahead: Alertmanager resolves "
        "it by itself if dupguard stops).",
        group="alerts",
    ),
    Setting(
        "alertmanager_resolve_after",
        timedelta(minutes=5),
        positive_duration,
        "An alert whose outcome is final stays firing this long after its first push (longer than the "
        "route's group_wait, so it is notified), then resolves.",
        group="alerts",
    ),
    Setting(
        "alert_storm_threshold",
        5,
        positive_int,
        "More groups than this within a minute become one digest.",
        group="alerts",
    ),
    Setting(
        "alert_timeout", timedelta(seconds=5), positive_duration, "Timeout of each alert delivery call.", group="alerts"
    ),
)
SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}


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
    leader_check_interval: timedelta
    startup_lookback: timedelta
    suspect_window: timedelta
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


def load(
    flags: Mapping[str, str | None] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
    sources: dict[str, str] | None = None,
) -> Config:
    """Build the Config; raises ConfigError listing every problem (never a secret value).

    ``disabled_checks`` may name only the periodic checks that exist (``detector.checks.registry.KINDS``).

    ``sources``, when given, receives where each setting came from (flag, env var, file, default).
    """
    flags = flags or {}
    sources = {} if sources is None else sources
    env = os.environ if env is None else env
    problems: list[str] = []
    file_values: dict[str, Any] = {}
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    if path:
        file_values = _read_file(Path(path), problems)

    values: dict[str, Any] = {}
    for s in SETTINGS:
        raw, origin = _raw_value(s, flags, env, file_values, problems)
        sources[s.name] = origin
        if raw is None:
            values[s.name] = s.default
            continue
        try:
            values[s.name] = s.parse(raw)
        except ConfigError as exc:
            problems.extend(f"{origin}: {p}" for p in exc.problems)
        except (ValueError, TypeError, OverflowError) as exc:
            shown = "(hidden)" if s.secret else repr(_redact.cap(_redact.userinfo(raw), 81))
            problems.append(f"{origin}: invalid value {shown}: {exc}" if not s.secret else f"{origin}: invalid value")

    if values.get("source") == "api" and sources.get("poll_interval") == "default":
        values["poll_interval"] = API_POLL_INTERVAL  # a 10 ms HTTP poll would be 6,000 requests a minute
    problems.extend(_as_given(p, sources) for p in _cross_checks(values))
    unknown = [k for k in values.get("disabled_checks", ()) if k not in CHECK_KINDS]
    if unknown:
        problems.append(
            f"{sources['disabled_checks']}: unknown check {', '.join(unknown)} (known: {', '.join(CHECK_KINDS)})"
        )
    if problems:
        raise ConfigError(problems)
    return Config(**values)


def _as_given(problem: str, sources: Mapping[str, str]) -> str:
    """A problem that names a setting by its env var names the flag instead when a flag set it: the
    user reads what they typed (``--remediation=fail``, not ``DUPGUARD_REMEDIATION=fail``)."""

    def named(match: re.Match[str]) -> str:
        setting = SETTINGS_BY_NAME.get(match[0][len(ENV_PREFIX) :].lower())
        return setting.flag if setting is not None and sources.get(setting.name) == setting.flag else match[0]

    return re.sub(ENV_PREFIX + r"[A-Z0-9_]+", named, problem)


def _read_file(path: Path, problems: list[str]) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except OSError as exc:
        problems.append(f"config file {path}: cannot read ({exc.strerror or type(exc).__name__})")
        return {}
    except UnicodeDecodeError:
        problems.append(f"config file {path}: not UTF-8 text")
        return {}
    except ValueError:  # a NUL byte in the path
        problems.append("config file: the path is not a valid file name")
        return {}
    except yaml.YAMLError as exc:
        problems.append(f"config file {path}: not valid YAML ({exc.__class__.__name__})")
        return {}
    except RecursionError:  # PyYAML recurses once per level: a few hundred nested [ or { exhaust the stack
        problems.append(f"config file {path}: nested too deeply (expected a mapping of setting: value)")
        return {}
    if not isinstance(data, dict):
        problems.append(f"config file {path}: must be a mapping of setting: value")
        return {}
    unknown = sorted(repr(k) for k in data if k not in SETTINGS_BY_NAME)
    problems.extend(f"config file {path}: unknown setting {k}" for k in unknown)
    return {k: v for k, v in data.items() if k in SETTINGS_BY_NAME}


def _raw_value(
    s: Setting,
    flags: Mapping[str, str | None],
    env: Mapping[str, str],
    file_values: Mapping[str, Any],
    problems: list[str],
) -> tuple[str | None, str]:
    if flags.get(s.name) is not None:
        return str(flags[s.name]), s.flag
    if env.get(s.env) not in (None, ""):
        return env[s.env], s.env
    file_env = s.env + "_FILE"
    if s.secret and env.get(file_env):
        try:
            return Path(env[file_env]).read_text(encoding="utf-8").strip(), file_env
        except OSError as exc:
            problems.append(f"{file_env}: cannot read {env[file_env]} ({exc.strerror or type(exc).__name__})")
        except UnicodeDecodeError:
            problems.append(f"{file_env}: {env[file_env]} is not UTF-8 text")
        except ValueError:
            problems.append(f"{file_env}: not a valid file name")
        return None, file_env
    if s.name in file_values and file_values[s.name] is not None:
        value = file_values[s.name]
        if isinstance(value, list):
            value = ",".join(map(str, value))
        elif isinstance(value, dict):
            problems.append(f"config file key {s.name}: expected a single value, not a mapping")
            return None, f"config file key {s.name}"
        return str(value), f"config file key {s.name}"
    return None, "default"


def _cross_checks(v: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    api_source = v.get("source") == "api"
    if not v.get("database_url") and not api_source:
        problems.append("DUPGUARD_DATABASE_URL (or --database-url, or _FILE) is required")
    if api_source:
        problems.extend(_api_source_checks(v))
    elif v.get("state_file"):
        problems.append(
            "DUPGUARD_STATE_FILE is for DUPGUARD_SOURCE=api (the database source keeps its ledger in the DB)"
        )
    if v.get("remediation") in {"fail", "skip"} and surely_api(v):
        if not v.get("airflow_api_url"):
            problems.append("DUPGUARD_REMEDIATION=fail/skip with the api backend needs DUPGUARD_AIRFLOW_API_URL")
        problems.extend(api_auth_problems(v, "the api backend"))
    url = v.get("database_url") or ""
    if v.get("remediation_backend") == "db" and v.get("remediation") in {"fail", "skip"} and url.startswith("sqlite"):
        problems.append("DUPGUARD_REMEDIATION_BACKEND=db cannot write to SQLite: dupguard opens SQLite read-only")
    if v.get("slack_bot_token") and not v.get("slack_channel"):
        problems.append("DUPGUARD_SLACK_BOT_TOKEN needs DUPGUARD_SLACK_CHANNEL")
    problems.extend(_alertmanager_checks(v))
    return problems


def surely_api(v: Mapping[str, Any]) -> bool:
    """The api backend whatever the database grants: set so, or auto where db cannot write (the REST API
    source, SQLite). auto on PostgreSQL is decided at start (detector/actions/remediation/choice.py)."""
    backend = v.get("remediation_backend")
    no_db = v.get("source") == "api" or (v.get("database_url") or "").startswith("sqlite")
    return backend == "api" or (backend == "auto" and no_db)


def _alertmanager_checks(v: Mapping[str, Any]) -> list[str]:
    """At most one way to authenticate to Alertmanager, and a whole one."""
    if v.get("alertmanager_bearer_token") and (v.get("alertmanager_username") or v.get("alertmanager_password")):
        return ["set DUPGUARD_ALERTMANAGER_BEARER_TOKEN or DUPGUARD_ALERTMANAGER_USERNAME/_PASSWORD, not both"]
    if bool(v.get("alertmanager_username")) != bool(v.get("alertmanager_password")):
        return ["DUPGUARD_ALERTMANAGER_USERNAME and DUPGUARD_ALERTMANAGER_PASSWORD go together (basic auth)"]
    return []


def api_auth_problems(v: Mapping[str, Any], who: str) -> list[str]:
    """Exactly one way to authenticate to Airflow's REST API (for ``who``: the api backend or source)."""
    ways = [
        bool(v.get("airflow_token")),
        bool(v.get("airflow_token_command")),
        bool(v.get("airflow_username") and v.get("airflow_password")),
    ]
    if not any(ways):
        return [
            f"{who} needs DUPGUARD_AIRFLOW_TOKEN, DUPGUARD_AIRFLOW_TOKEN_COMMAND, "
            "or DUPGUARD_AIRFLOW_USERNAME and DUPGUARD_AIRFLOW_PASSWORD"
        ]
    if v.get("airflow_token_command") and (v.get("airflow_token") or v.get("airflow_password")):
        other = "DUPGUARD_AIRFLOW_TOKEN" if v.get("airflow_token") else "DUPGUARD_AIRFLOW_PASSWORD"
        return [f"set DUPGUARD_AIRFLOW_TOKEN_COMMAND or {other}, not both (which one would dupguard use?)"]
    return []


def _api_source_checks(v: Mapping[str, Any]) -> list[str]:
    """``--source api`` reads only the REST API: it needs the API and credentials, and no DB write."""
    problems: list[str] = []
    reported = v.get("remediation") in {"fail", "skip"} and surely_api(v)  # just below
    if not v.get("airflow_api_url") and not reported:
        problems.append("DUPGUARD_SOURCE=api needs DUPGUARD_AIRFLOW_API_URL")
    if not reported:
        problems.extend(api_auth_problems(v, "DUPGUARD_SOURCE=api"))
    if v.get("remediation_backend") == "db":
        problems.append(
            "DUPGUARD_REMEDIATION_BACKEND=db writes to the metadata database, which DUPGUARD_SOURCE=api does not "
            "use: use DUPGUARD_REMEDIATION_BACKEND=api"
        )
    return problems


def database_url(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """The database URL the way ``run`` reads it (flag > env > ``_FILE``), for ``scan`` and ``init-db``."""
    env = os.environ if env is None else env
    problems: list[str] = []
    raw, origin = _raw_value(SETTINGS_BY_NAME["database_url"], {"database_url": flag}, env, {}, problems)
    if problems:
        raise ConfigError(problems)
    if raw is None:
        raise ConfigError(["--database-url, DUPGUARD_DATABASE_URL or DUPGUARD_DATABASE_URL_FILE is required"])
    try:
        parse_url(raw)
    except ConfigError as exc:
        raise ConfigError([f"{origin}: {p}" for p in exc.problems]) from None
    return raw


def flag_names() -> Sequence[str]:
    return [s.flag for s in SETTINGS]
