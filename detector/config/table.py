"""Every setting of dupguard in one table: flags, env, the YAML file, help, the chart schema and the
generated settings reference (docs/reference/settings.md) all read it. A periodic check's own settings
live in its package (detector/checks/<kind>/settings.py) and join the table here, in registry order.
"""

from __future__ import annotations

from datetime import timedelta

from detector import __version__
from detector.checks.registry import SETTINGS as CHECK_SETTINGS
from detector.durations import parse_duration
from detector.metadb.engine import parse_url
from detector.settings import (
    Setting,
    boolean,
    choice,
    file_path,
    globs,
    lock_key_value,
    message_id_paths,
    port,
    positive_duration,
    positive_int,
    url,
    urls,
)

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
        # Fast, but only for poll_hold after Airflow's asset queues stir (detector/core/pace.py): the idle cost
        # is the rest interval's, and detection after a queue row is poll_interval plus the judging
        # (docs/explanation/daemon.md, "How the daemon polls"; benchmarks/results/measurements.md).
        timedelta(milliseconds=5),
        positive_duration,
        "Time between polls for new runs while a race is possible (after the asset queues changed; at rest "
        "--poll-rest-interval). With --source api, always, and the default is 250ms: each poll is a request.",
        group="detection",
    ),
    Setting(
        "poll_rest_interval",
        timedelta(milliseconds=250),
        positive_duration,
        "Time between polls while Airflow's asset queues stand still (the database source): a race needs a "
        "queue row first, so a run committed at rest is found up to this late.",
        group="detection",
    ),
    Setting(
        "poll_hold",
        timedelta(seconds=5),
        positive_duration,
        "How long the database source polls every --poll-interval after the asset queues changed or an "
        "asset-triggered run appeared, then it rests.",
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
    Setting(
        "message_id_paths",
        (),
        message_id_paths,
        "Where a custom trigger's payload keeps its message's own id, per asset name (a glob): dotted keys of the "
        "event's extra, * for every list item. Such ids prove copies as SQS/Kinesis/Pub/Sub ids do: name only an id "
        "unique to a message and kept on a redelivery.",
        group="detection",
        metavar="ASSET=PATH[,ASSET=PATH...]",
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
        "alert_requests_per_minute",
        20,
        positive_int,
        "Most requests to each alert channel in any minute; a storm's further messages, digest parts and "
        "pushes wait their turn.",
        group="alerts",
    ),
    Setting(
        "alert_timeout", timedelta(seconds=5), positive_duration, "Timeout of each alert delivery call.", group="alerts"
    ),
)
SETTINGS_BY_NAME = {s.name: s for s in SETTINGS}
