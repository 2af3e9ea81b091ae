"""The companion chart refuses at render time what `dupguard check-config` would refuse.

In sidecar mode a configuration dupguard refuses is a crash-looping container in every scheduler pod
and a `rollout restart` that stalls, so the render must fail first, naming the value, in check-config's
own words. These tests take check-config's refusals from detector/config/table.py itself (``config.load``
fed the settings the pod would get) and compare them with what the render says:

* each value the chart hands to a setting, with bad values (test_each_bad_value_...);
* a sweep over the values the cross-checks read (source, remediation, API URL, credentials inline, from
  airflow.tokenSecret or from secretKeyRefs, Slack): check-config refuses exactly when the render fails
  (but for the chart's own refusals, lines starting "chart:"), every problem appears in the render's
  error after the values to change, and where the render succeeds the pod's settings pass check-config.

What the chart cannot check at render time is listed in NOT_CHECKED_BY_THE_CHART (with why).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
import yaml

from detector import config
from detector.errors import ConfigError
from tests.deploy.support import CHART, load_documents, require_module

DB_URL = "postgresql://airflow:placeholder@postgres:5432/airflow"
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())

# Chart value -> the setting it becomes (the ConfigMap's or the chart Secret's key).
VALUE_SETTINGS = {
    "source": "DUPGUARD_SOURCE",
    "ledger": "DUPGUARD_LEDGER",
    "log.level": "DUPGUARD_LOG_LEVEL",
    "log.format": "DUPGUARD_LOG_FORMAT",
    "pollInterval": "DUPGUARD_POLL_INTERVAL",
    "api.pollInterval": "DUPGUARD_POLL_INTERVAL",
    "http.port": "DUPGUARD_HTTP_PORT",
    "clusterName": "DUPGUARD_CLUSTER_NAME",
    "dags": "DUPGUARD_DAGS",
    "excludeDags": "DUPGUARD_EXCLUDE_DAGS",
    "database.lockMode": "DUPGUARD_LOCK_MODE",
    "database.lockDatabaseUrl": "DUPGUARD_LOCK_DATABASE_URL",
    "remediation.mode": "DUPGUARD_REMEDIATION",
    "remediation.backend": "DUPGUARD_REMEDIATION_BACKEND",
    "remediation.remediateStarted": "DUPGUARD_REMEDIATE_STARTED",
    "airflow.apiUrl": "DUPGUARD_AIRFLOW_API_URL",
    "airflow.uiUrl": "DUPGUARD_AIRFLOW_UI_URL",
    "airflow.username": "DUPGUARD_AIRFLOW_USERNAME",
    "airflow.password": "DUPGUARD_AIRFLOW_PASSWORD",
    "airflow.token": "DUPGUARD_AIRFLOW_TOKEN",
    "airflow.tokenCommand": "DUPGUARD_AIRFLOW_TOKEN_COMMAND",
    "slack.channel": "DUPGUARD_SLACK_CHANNEL",
    "slack.botToken": "DUPGUARD_SLACK_BOT_TOKEN",
    "slack.webhookUrl": "DUPGUARD_SLACK_WEBHOOK_URL",
    "webhook.url": "DUPGUARD_WEBHOOK_URL",
}
# A `config` entry (deploy/helm/settings_schema.py): the schema checks the value's form, dupguard the rest.
CONFIG_ONLY = "a config entry: values.schema.json checks its form only"
# Secrets from secretKeyRefs only (or existingSecret): the chart never sees their values.
SECRET_REF_ONLY = "a secret from secretKeyRefs: its value is not known at render time"
# Settings of detector/config/table.py whose refusal the chart cannot see, and why.
NOT_CHECKED_BY_THE_CHART = {
    "database_url": "from the Airflow chart's metadata Secret (database.metadataSecret / the overlay's "
    "airflow_metadata_secret) or secretKeyRefs.DUPGUARD_DATABASE_URL: its content is not known at render "
    "time (a SQLite URL, hence "
    "'REMEDIATION_BACKEND=db cannot write to SQLite', cannot be refused either); always set",
    "alertmanager_password": SECRET_REF_ONLY,
    "alertmanager_bearer_token": SECRET_REF_ONLY,
    "lock_database_url": "a secret; the schema checks only that it has a scheme (parse_url's checks are not mirrored)",
    "airflow_ca_bundle": "a file in the pod (airflow.caBundle's ConfigMap): not there at render time",
    "state_file": "set by the chart only with source api, where it is allowed",
    "config_source": "set by the chart",
    "config_expected": "set by the chart",
    "lock_key": CONFIG_ONLY,
    # the periodic checks (docs/explanation/checks.md): config entries like the other intervals
    "disabled_checks": CONFIG_ONLY + "; an unknown kind is refused at start (exit 2)",
    "trigger_flapping_interval": CONFIG_ONLY,
    "triggerer_health_check_threshold": CONFIG_ONLY,
    "stranded_poll_interval": CONFIG_ONLY,
    "repair_stranded": CONFIG_ONLY + ": a repair is switched on by hand, like remediation",
    "stranded_repair_deadline": CONFIG_ONLY,
    "double_bump_poll_interval": CONFIG_ONLY,
    "double_bump_health_check_threshold": CONFIG_ONLY,
    "double_bump_orphan_check_interval": CONFIG_ONLY,
    "db_timeout": CONFIG_ONLY,
    "leader_check_interval": CONFIG_ONLY,
    "startup_lookback": CONFIG_ONLY,
    "suspect_window": CONFIG_ONLY,
    "message_id_paths": CONFIG_ONLY + "; a bad path is refused at start (exit 2)",
    "split_grace": CONFIG_ONLY,
    "split_poll_interval": CONFIG_ONLY,
    "gap_grace": CONFIG_ONLY,
    "poll_rest_interval": CONFIG_ONLY,
    "poll_hold": CONFIG_ONLY,
    "summary_interval": CONFIG_ONLY,
    "airflow_token_command_timeout": CONFIG_ONLY,
    "airflow_verify_tls": CONFIG_ONLY,
    "airflow_timeout": CONFIG_ONLY,
    "slack_api_url": CONFIG_ONLY,
    "alert_storm_threshold": CONFIG_ONLY,
    "alert_requests_per_minute": CONFIG_ONLY,
    "alert_timeout": CONFIG_ONLY,
    "runbook_url": CONFIG_ONLY,
    "unstopped_severity": CONFIG_ONLY,
    "grafana_dashboard_url": CONFIG_ONLY,
    **{
        f"alertmanager_{name}": CONFIG_ONLY
        for name in ("urls", "username", "ca_bundle", "verify_tls", "resend_interval", "resolve_after")
    },
}
# Chart Secret keys a secretKeyRefs entry can supply.
SECRET_SETTINGS = {
    "DUPGUARD_DATABASE_URL",
    "DUPGUARD_LOCK_DATABASE_URL",
    "DUPGUARD_ALERTMANAGER_USERNAME",
    "DUPGUARD_ALERTMANAGER_PASSWORD",
    "DUPGUARD_ALERTMANAGER_BEARER_TOKEN",
    "DUPGUARD_AIRFLOW_USERNAME",
    "DUPGUARD_AIRFLOW_PASSWORD",
    "DUPGUARD_AIRFLOW_TOKEN",
    "DUPGUARD_AIRFLOW_TOKEN_COMMAND",
    "DUPGUARD_SLACK_BOT_TOKEN",
    "DUPGUARD_SLACK_WEBHOOK_URL",
    "DUPGUARD_WEBHOOK_URL",
}


def _get(values: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        if not isinstance(values, dict) or key not in values:
            return None
        values = values[key]
    return values


def merge(base: Any, extra: Any) -> Any:
    """``extra`` over ``base``, maps merged key by key (neither is modified)."""
    if isinstance(base, dict) and isinstance(extra, dict):
        return {**base, **{k: merge(base.get(k), v) for k, v in extra.items()}}
    return extra


def _merged(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = merge(DEFAULTS, values)
    return out


def _placeholder(env: str) -> str:
    """What a Secret key holds, for check-config: a value of the right form."""
    if env.endswith("DATABASE_URL"):
        return DB_URL
    return "https://hooks.example.com/placeholder" if env.endswith("_URL") else "from-a-secret"


def settings_of(values: dict[str, Any]) -> dict[str, str]:
    """The environment the dupguard container gets from these chart values, as check-config reads it."""
    merged = _merged(values)
    api = merged["source"] == "api"
    env = {} if api else {"DUPGUARD_DATABASE_URL": DB_URL}
    for path, name in VALUE_SETTINGS.items():
        if path == ("pollInterval" if api else "api.pollInterval") or (path == "source" and not api):
            continue  # each source reads its own interval; the chart leaves the default source unset
        value = _get(merged, path)
        if value not in (None, ""):
            env[name] = str(value).lower() if isinstance(value, bool) else str(value)
    if merged["airflow"]["tokenSecret"]["name"]:
        env["DUPGUARD_AIRFLOW_TOKEN"] = _placeholder("DUPGUARD_AIRFLOW_TOKEN")
    for name in merged.get("secretKeyRefs") or {}:
        env[name] = _placeholder(name)
    return env


def check_config(env: dict[str, str]) -> list[str]:
    try:
        config.load({}, env)
    except ConfigError as exc:
        return list(exc.problems)
    return []


def render(values: dict[str, Any]) -> tuple[dict[str, str], str | None]:
    """The rendered files and None, or nothing and the render's error text."""
    helm = require_module("helm_python")
    try:
        rendered = helm.Chart.load(CHART).render(json.loads(json.dumps(values)), name="dupguard", namespace="airflow")
    except helm.HelmError as exc:
        return {}, str(exc)
    return dict(rendered), None


def render_error(values: dict[str, Any]) -> str | None:
    """The render's error text, or None when the chart renders."""
    return render(values)[1]


def problem_lines(error: str) -> list[str]:
    return [line[2:] for line in error.splitlines() if line.startswith("- ")]


def assert_names_values(line: str, problem: str) -> None:
    """The line is `<chart values>: <problem>`, and every dotted name before the problem is a chart value."""
    assert line.endswith(problem) or f": {problem} (" in line, (line, problem)
    prefix = line[: line.index(problem)].removesuffix(": ")
    names = re.findall(r"[a-zA-Z]+(?:\.[a-zA-Z]+)+|^[a-zA-Z]+(?==)|^[a-zA-Z]+$", prefix)
    assert names, f"{line!r} names no chart value"
    for name in names:
        assert _get(DEFAULTS, name) is not None, f"{line!r}: {name} is not a value of the chart"


def test_every_setting_is_a_chart_value_or_listed_as_not_checked() -> None:
    """A setting added to detector/config/table.py is either given a chart value (and checked) or listed here."""
    mapped = {v.removeprefix("DUPGUARD_").lower() for v in VALUE_SETTINGS.values()}
    every = {s.name for s in config.SETTINGS}
    assert every - mapped - set(NOT_CHECKED_BY_THE_CHART) == set()
    for path in VALUE_SETTINGS:
        assert _get(DEFAULTS, path) is not None, f"{path} is not in values.yaml"
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["secretKeyRefs"]["propertyNames"]["enum"]) == SECRET_SETTINGS


STANDALONE: dict[str, Any] = {"mode": "standalone"}
API_SOURCE: dict[str, Any] = {
    "mode": "standalone",
    "source": "api",
    "airflow": {"apiUrl": "https://airflow.example.com", "token": "t"},
}
BAD_VALUES: list[tuple[dict[str, Any], str, Any]] = [
    (STANDALONE, "ledger", "maybe"),
    (STANDALONE, "log.level", "verbose"),
    (STANDALONE, "log.format", "yaml"),
    (STANDALONE, "remediation.mode", "on"),
    (STANDALONE, "remediation.backend", "sql"),
    (STANDALONE, "database.lockMode", "pooled"),
    (STANDALONE, "airflow.apiUrl", "airflow-api-server:8080"),
    (STANDALONE, "airflow.apiUrl", "http://:8080"),
    (STANDALONE, "airflow.apiUrl", "http://airflow:99999"),
    (STANDALONE, "airflow.apiUrl", "http://airflow:port"),
    (STANDALONE, "airflow.uiUrl", "ftp://airflow.example.com"),
    (STANDALONE, "slack.webhookUrl", "hooks.slack.com/services/T/B/x"),
    (STANDALONE, "webhook.url", "https://hooks.example.com:123456/x"),
    (STANDALONE, "pollInterval", "10"),
    (STANDALONE, "pollInterval", "0.5"),
    (STANDALONE, "pollInterval", "1e3"),
    (STANDALONE, "pollInterval", "0"),
    (STANDALONE, "pollInterval", "0s"),
    (STANDALONE, "pollInterval", "-5m"),
    (STANDALONE, "pollInterval", "-5"),
    (STANDALONE, "pollInterval", "1h 30m"),
    (STANDALONE, "pollInterval", "36501d"),
    (STANDALONE, "http.port", 70000),
    (API_SOURCE, "api.pollInterval", "0.5"),
    (API_SOURCE, "api.pollInterval", "1x"),
    # Accepted by both (the test fails if the chart refuses what dupguard accepts):
    (STANDALONE, "pollInterval", "1h30m"),
    (STANDALONE, "pollInterval", "250ms"),
    (STANDALONE, "log.level", "WARNING"),
    (STANDALONE, "airflow.uiUrl", "https://[::1]:8443/airflow"),
    (STANDALONE, "airflow.apiUrl", "http://user@airflow-api-server:8080"),
    (API_SOURCE, "api.pollInterval", "2s"),
]


def _with(base: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    values = json.loads(json.dumps(base))
    *parents, leaf = dotted.split(".")
    node = values
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return values


@pytest.mark.parametrize(("base", "path", "value"), BAD_VALUES, ids=[f"{p}={v}" for _, p, v in BAD_VALUES])
def test_each_bad_value_is_refused_by_the_render_as_check_config_refuses_it(
    base: dict[str, Any], path: str, value: Any
) -> None:
    """A value check-config would refuse fails the render with `<value>: <check-config's line>`; a value
    it accepts renders."""
    values = _with(base, path, value)
    problems = check_config(settings_of(values))
    error = render_error(values)
    if not problems:
        assert error is None, f"the chart refuses what check-config accepts: {error}"
        return
    assert error is not None, f"the chart renders what check-config refuses: {problems}"
    for problem in problems:
        assert any(line.startswith(f"{path}: {problem}") for line in problem_lines(error)), (problem, error)
    assert str(value) not in error or path not in ("slack.webhookUrl", "webhook.url"), "a secret in the error"


AUTH: dict[str, dict[str, Any]] = {
    "none": {},
    "token": {"airflow": {"token": "t"}},
    "token-secret": {"airflow": {"tokenSecret": {"name": "astro", "key": "token"}}},
    "command": {"airflow": {"tokenCommand": "cat /token"}},
    "user-password": {"airflow": {"username": "u", "password": "p"}},
    "user-only": {"airflow": {"username": "u"}},
    "command+token": {"airflow": {"tokenCommand": "cat /token", "token": "t"}},
    "command+password-ref": {
        "airflow": {"tokenCommand": "cat /token", "username": "u"},
        "secretKeyRefs": {"DUPGUARD_AIRFLOW_PASSWORD": {"name": "api-user", "key": "password"}},
    },
    "user-password-refs": {
        "secretKeyRefs": {
            "DUPGUARD_AIRFLOW_USERNAME": {"name": "api-user", "key": "username"},
            "DUPGUARD_AIRFLOW_PASSWORD": {"name": "api-user", "key": "password"},
        }
    },
}
SLACK: dict[str, dict[str, Any]] = {
    "none": {},
    "bot-without-channel": {"slack": {"botToken": "xoxb"}},
    "bot-and-channel": {"slack": {"botToken": "xoxb", "channel": "#airflow"}},
    "bot-ref-without-channel": {"secretKeyRefs": {"DUPGUARD_SLACK_BOT_TOKEN": {"name": "slack", "key": "bot"}}},
}
SWEEP = {
    "mode": ["sidecar", "standalone"],
    "source": ["database", "api"],
    "remediation.mode": ["dry-run", "fail"],  # skip: checked as fail (detector/config and the chart alike)
    "remediation.backend": ["auto", "api", "db"],
    "airflow.apiUrl": ["", "http://airflow-api-server:8080"],
    "auth": list(AUTH),
    "slack": list(SLACK),
}


def sweep() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for combo in itertools.product(*SWEEP.values()):
        values: dict[str, Any] = {}
        for key, value in zip(SWEEP, combo, strict=True):
            extra = AUTH[value] if key == "auth" else SLACK[value] if key == "slack" else _with({}, key, value)
            values = merge(values, extra)
        out.append((",".join(map(str, combo)), values))
    return out


def pod_settings(values: dict[str, Any], rendered: dict[str, str]) -> dict[str, str]:
    """What the rendered objects hand the dupguard container: the ConfigMap, the chart's Secret, and
    each env entry of the container (standalone Deployment, or the sidecar in the Airflow values)."""
    docs = [d for p, t in rendered.items() if not p.endswith("NOTES.txt") for d in load_documents(t)]
    data: dict[tuple[str, str], dict[str, str]] = {}
    for doc in docs:
        data[doc["kind"], doc["metadata"]["name"]] = doc.get("data") or doc.get("stringData") or {}
    if values.get("mode") == "standalone":
        (workload,) = [d for d in docs if d["kind"] == "Deployment"]
        (container,) = workload["spec"]["template"]["spec"]["containers"]
    else:
        (airflow_values,) = load_documents(data["ConfigMap", "dupguard-airflow-values"]["values.yaml"])
        scheduler = airflow_values["scheduler"]
        (container,) = scheduler["extraContainers"]
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        env |= data.get((kind, (source.get("configMapRef") or source["secretRef"])["name"]), {})
    for var in container["env"]:
        env[var["name"]] = var["value"] if "value" in var else _placeholder(var["name"])
    if "{{" in env.get("DUPGUARD_LOCK_MODE", ""):
        env["DUPGUARD_LOCK_MODE"] = "transaction"  # the Airflow chart's tpl fills it in
    return env


@pytest.mark.timeout(900)  # the sweep renders the chart ~1,150 times
def test_check_config_refuses_exactly_what_the_render_refuses() -> None:
    """Over the sweep: check-config's every problem is a line of the render's error, after the chart
    values to change; a render that fails where check-config accepts fails only for the chart's own
    reasons ("chart: ..."); a render that succeeds gives the pod settings check-config accepts, the
    same ones this test derived from the values."""
    seen: set[str] = set()
    for label, values in sweep():
        problems = check_config(settings_of(values))
        rendered, error = render(values)
        lines = problem_lines(error or "")
        for problem in problems:
            assert error is not None, f"{label}: the chart renders what check-config refuses: {problems}"
            (line,) = [ln for ln in lines if problem in ln] or [f"missing {problem!r} in {error}"]
            assert_names_values(line, problem)
            seen.add(re.sub(r"'[^']*'", "…", problem))
        own = [ln for ln in lines if not any(p in ln for p in problems)]
        assert all(ln.startswith("chart: ") for ln in own), f"{label}: {own}"
        if error is None:
            env = pod_settings(values, rendered)
            assert check_config(env) == [], label
            relevant = set(VALUE_SETTINGS.values()) | {"DUPGUARD_DATABASE_URL"}
            derived = {k: v for k, v in settings_of(values).items() if k in relevant}
            assert derived.items() <= env.items(), f"{label}: {derived} vs {env}"
    # The sweep reaches every cross-check of detector/config/cross_checks.py the chart can see.
    assert len(seen) >= 8, sorted(seen)


def test_an_existing_secret_read_whole_cannot_be_checked() -> None:
    """existingSecret is read with envFrom: the chart cannot see its keys, so it takes it to hold the
    credentials (what check-config would say depends on them); secretKeyRefs are seen and checked."""
    api = {"mode": "fail", "backend": "api"}
    fail = {"mode": "standalone", "remediation": api, "airflow": {"apiUrl": "http://api:8080"}}
    assert render_error({**fail, "existingSecret": "corp-dupguard"}) is None
    error = render_error(fail)
    assert error is not None and "the api backend needs DUPGUARD_AIRFLOW_TOKEN" in error
    refs = {"DUPGUARD_AIRFLOW_TOKEN": {"name": "corp", "key": "api-token"}}
    assert render_error({**fail, "secretKeyRefs": refs}) is None


def test_every_problem_is_reported_at_once() -> None:
    """Like check-config, the render lists every problem, not the first one only."""
    api = {"mode": "fail", "backend": "api"}
    values = {"mode": "standalone", "ledger": "maybe", "remediation": api, "slack": {"botToken": "x"}}
    error = render_error(values) or ""
    assert len(problem_lines(error)) == 4, error
    assert "xoxb" not in error and 'botToken": "x' not in error
