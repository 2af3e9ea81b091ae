"""Every setting of `dupguard run` is a value of the companion chart, in both modes.

detector/config/table.py ``SETTINGS`` is the one table of settings; deploy/helm/settings_schema.py writes the
chart's `config` (every non-secret setting without a value of its own) and `secretKeyRefs` (every
secret) schema from it. These tests check that the schema is that table's, that each setting reaches
the dupguard container's environment (env entries over the ConfigMap and Secret read with envFrom, as
Kubernetes resolves them) in the standalone Deployment and in the sidecar's Airflow values, that the
sidecar honours extraEnv and extra volumes, and that the NOTES name the namespace on every command.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
import yaml

from detector import config, settings
from tests.deploy.support import (
    CHART,
    DEPLOY,
    load_documents,
    load_script,
    require_module,
    throwaway_pod,
    validate_objects,
)

GENERATOR = DEPLOY / "helm" / "settings_schema.py"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
MODES = ("standalone", "sidecar")
RELEASE, NAMESPACE = "dupguard", "data"
# Chart values whose setting's text is the value itself, and a value other than the default for each.
OWN_VALUES: dict[str, Any] = {
    "pollInterval": "45ms",
    "clusterName": "prod-eu",
    "dags": "sales_*,billing",
    "excludeDags": "sales_tmp",
    "ledger": "on",
    "log.level": "debug",
    "log.format": "console",
    "remediation.mode": "fail",
    "remediation.backend": "api",
    "remediation.remediateStarted": True,
    "airflow.apiUrl": "http://airflow-api-server:8080",
    "airflow.uiUrl": "https://airflow.example.com",
    "slack.channel": "#airflow-alerts",
    "http.port": 9470,
}
# Secrets every render takes from secretKeyRefs, and the ways to authenticate to Airflow and to
# Alertmanager, which exclude each other (dupguard takes one of each): together, every secretKeyRef.
COMMON_SECRETS = (
    "DUPGUARD_DATABASE_URL",
    "DUPGUARD_LOCK_DATABASE_URL",
    "DUPGUARD_SLACK_BOT_TOKEN",
    "DUPGUARD_SLACK_WEBHOOK_URL",
    "DUPGUARD_WEBHOOK_URL",
)
AUTH_VARIANTS = {
    "passwords": ("DUPGUARD_AIRFLOW_USERNAME", "DUPGUARD_AIRFLOW_PASSWORD", "DUPGUARD_ALERTMANAGER_PASSWORD"),
    "tokens": ("DUPGUARD_AIRFLOW_TOKEN", "DUPGUARD_ALERTMANAGER_BEARER_TOKEN"),
    "token-command": (
        "DUPGUARD_AIRFLOW_TOKEN_COMMAND",
        "DUPGUARD_ALERTMANAGER_USERNAME",
        "DUPGUARD_ALERTMANAGER_PASSWORD",
    ),
}


@functools.cache
def generator() -> Any:
    return load_script(GENERATOR)


def config_entries() -> dict[str, Any]:
    entries: dict[str, Any] = SCHEMA["properties"]["config"]["properties"]
    return entries


def secret_ref_names() -> list[str]:
    names: list[str] = SCHEMA["properties"]["secretKeyRefs"]["propertyNames"]["enum"]
    return names


def sample(setting: settings.Setting, index: int) -> tuple[Any, str]:
    """A chart value other than the default for ``setting``, and the text dupguard then reads."""
    default = setting.default
    allowed = generator()._choices(setting)
    if allowed is not None:
        value = next(a for a in allowed if a != default)
        return value, value
    if isinstance(default, bool):
        return (not default), str(not default).lower()
    if isinstance(default, int):
        return default + 1, str(default + 1)
    if isinstance(default, timedelta):
        return f"{index + 2}m30s", f"{index + 2}m30s"
    if setting.name == "alertmanager_urls":
        urls = ["http://alertmanager-0.monitoring:9093", "http://alertmanager-1.monitoring:9093"]
        return urls, ",".join(urls)
    if setting.name == "message_id_paths":
        paths = ["orders=payload.meta.id", "billing_*=payload.items.*.id"]
        return paths, ",".join(paths)
    if isinstance(default, tuple):
        return ["split_partition", "double_bump"], "split_partition,double_bump"
    if setting.parse in (settings.url, settings.urls):
        url = f"https://{setting.name.replace('_', '-')}.example.com/x"
        return url, url
    if setting.parse is settings.file_path:
        return __file__, __file__
    return f"sample-{setting.name}", f"sample-{setting.name}"


def _set(values: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        values = values.setdefault(key, {})
    values[leaf] = value


def every_value(variant: str = "passwords") -> tuple[dict[str, Any], dict[str, Any]]:
    """Chart values setting every setting the chart hands to dupguard (secrets from secretKeyRefs, one way
    to authenticate of AUTH_VARIANTS), and the container environment they must give: {env: text, or
    {"secretKeyRef": {...}}}."""
    values: dict[str, Any] = {"config": {}, "secretKeyRefs": {}}
    expected: dict[str, Any] = {}
    by_env = {s.env: s for s in config.SETTINGS}
    secrets = (*COMMON_SECRETS, *AUTH_VARIANTS[variant])
    for index, env in enumerate(config_entries()):
        if env in secrets or (env == "DUPGUARD_ALERTMANAGER_USERNAME" and variant == "tokens"):
            continue  # from a secretKeyRef, or not with a bearer token
        values["config"][env], expected[env] = sample(by_env[env], index)
    for env in secrets:
        ref = {"name": f"corp-{env.lower().replace('_', '-')}", "key": f"key.{env.lower()}"}
        values["secretKeyRefs"][env] = ref
        expected[env] = {"secretKeyRef": ref}
    own_envs = {path: env for env, path in generator().CHART_VALUES.items()}
    for path, value in OWN_VALUES.items():
        _set(values, path, value)
        expected[own_envs[path]] = str(value).lower() if isinstance(value, bool) else str(value)
    values["airflow"]["caBundle"] = {"configMap": "corp-ca", "key": "bundle.pem"}
    expected["DUPGUARD_AIRFLOW_CA_BUNDLE"] = "/etc/dupguard/ca/bundle.pem"
    values["extraEnv"] = [{"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"}]
    expected["HTTPS_PROXY"] = "http://proxy.corp:3128"
    values["extraVolumes"] = [{"name": "alertmanager-ca", "configMap": {"name": "alertmanager-ca"}}]
    values["extraVolumeMounts"] = [{"name": "alertmanager-ca", "mountPath": "/etc/alertmanager-ca"}]
    expected["DUPGUARD_CONFIG_SOURCE"] = expected["DUPGUARD_CONFIG_EXPECTED"] = f"configmap/{RELEASE}"
    return values, expected


def render(values: dict[str, Any], release: str = RELEASE) -> dict[str, str]:
    helm = require_module("helm_python")
    rendered: dict[str, str] = helm.Chart.load(CHART).render(
        json.loads(json.dumps(values)), name=release, namespace=NAMESPACE
    )
    return rendered


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    return [d for path, text in rendered.items() if not path.endswith("NOTES.txt") for d in load_documents(text)]


def resolved_env(container: dict[str, Any], companion: list[dict[str, Any]]) -> dict[str, Any]:
    """The container's environment as the kubelet builds it: envFrom first (the companion's ConfigMap
    and Secret by name), then env entries, which win; a secretKeyRef stays a reference."""
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in companion}
    env: dict[str, Any] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(by_name.get(("ConfigMap", source["configMapRef"]["name"]), {}).get("data", {}))
        else:
            env.update(by_name.get(("Secret", source["secretRef"]["name"]), {}).get("stringData", {}))
    for entry in container.get("env", []):
        env[entry["name"]] = entry["value"] if "value" in entry else entry["valueFrom"]
    return env


def container_of(companion: list[dict[str, Any]], mode: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The dupguard container and the pod volumes of a render: the Deployment's, or the sidecar's in its
    Airflow values."""
    if mode == "standalone":
        (deployment,) = [d for d in companion if d["kind"] == "Deployment"]
        spec = deployment["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        return container, spec["volumes"]
    (overlay_map,) = [d for d in companion if d["metadata"]["name"].endswith("-airflow-values")]
    scheduler = yaml.safe_load(overlay_map["data"]["values.yaml"])["scheduler"]
    (container,) = scheduler["extraContainers"]
    return container, scheduler["extraVolumes"]


def test_the_schema_is_generated_from_the_settings_table() -> None:
    """values.schema.json is what settings_schema.py writes; every setting has exactly one way in."""
    check = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, check=False
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    own = set(generator().CHART_VALUES)
    in_config = set(config_entries())
    for setting in config.SETTINGS:
        ways = [setting.env in own, setting.env in in_config, setting.secret and setting.env in secret_ref_names()]
        assert sum(ways) == 1 or (setting.env == "DUPGUARD_DATABASE_URL" and ways == [True, False, True]), (
            setting.env,
            ways,
        )
    assert {s.env for s in config.SETTINGS if s.secret} <= set(secret_ref_names())


def test_a_new_setting_lands_in_config_when_the_schema_is_written_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes forgetting impossible: the generator takes any setting it has no chart value for."""
    module = generator()
    new = settings.Setting("page_interval", timedelta(minutes=5), settings.positive_duration, "A new setting.")
    monkeypatch.setattr(config, "SETTINGS", (*config.SETTINGS, new))
    schema = module.generated(SCHEMA)
    assert schema["properties"]["config"]["properties"]["DUPGUARD_PAGE_INTERVAL"]["pattern"]


def test_the_variants_cover_every_secret() -> None:
    covered = {env for names in AUTH_VARIANTS.values() for env in names} | set(COMMON_SECRETS)
    assert covered == set(secret_ref_names())


@pytest.mark.parametrize("variant", AUTH_VARIANTS)
@pytest.mark.parametrize("mode", MODES)
def test_every_setting_reaches_the_container_in_both_modes(mode: str, variant: str) -> None:
    """One render with every value set: each setting's text (or its secretKeyRef) in the container's
    environment, extraEnv included; the metadata Secret gives way to DUPGUARD_DATABASE_URL's own."""
    values, expected = every_value(variant)
    companion = objects(render({**values, "mode": mode}))
    container, volumes = container_of(companion, mode)
    env = resolved_env(container, companion)
    if mode == "sidecar":
        expected = {k: v for k, v in expected.items() if k != "DUPGUARD_LOCK_MODE"}
    assert {k: env.get(k) for k in expected} == expected
    assert [e["name"] for e in container["env"]].count("DUPGUARD_DATABASE_URL") == 1
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["alertmanager-ca"] == "/etc/alertmanager-ca"
    assert {"name": "alertmanager-ca", "configMap": {"name": "alertmanager-ca"}} in volumes
    ca_volume = next(v for v in volumes if v.get("configMap", {}).get("name") == "corp-ca")
    assert mounts[ca_volume["name"]] == "/etc/dupguard/ca"
    if mode == "sidecar":
        validate_objects([throwaway_pod([container], volumes)], "sidecar with every value")
    else:
        validate_objects(companion, "standalone with every value")


@pytest.mark.parametrize("variant", AUTH_VARIANTS)
def test_the_chosen_values_are_ones_dupguard_accepts(variant: str) -> None:
    """The samples above are real settings: check-config (config.load) takes the environment they make,
    with a value of the right form in each Secret key."""
    values, expected = every_value(variant)
    env = {k: v for k, v in expected.items() if isinstance(v, str) and k.startswith("DUPGUARD_")}
    for name in expected.keys() - env.keys():
        if name.endswith("DATABASE_URL"):
            env[name] = "postgresql://dupguard@postgres:5432/airflow"
        elif name.startswith("DUPGUARD_"):
            env[name] = "https://hooks.example.com/x" if name.endswith("_URL") else "from-a-secret"
    env["DUPGUARD_AIRFLOW_CA_BUNDLE"] = __file__
    loaded = config.load({}, env)
    assert loaded.alertmanager_urls == tuple(values["config"]["DUPGUARD_ALERTMANAGER_URLS"])


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ({"DUPGUARD_NO_SUCH_SETTING": "x"}, "additional properties"),
        ({"DUPGUARD_LOG_LEVEL": "debug"}, "additional properties"),  # has log.level
        ({"DUPGUARD_SLACK_BOT_TOKEN": "xoxb"}, "additional properties"),  # a secret: secretKeyRefs
        ({"DUPGUARD_STARTUP_LOOKBACK": "10"}, "does not match pattern"),
        ({"DUPGUARD_REPAIR_STRANDED": "yes"}, "does not match pattern"),
        ({"DUPGUARD_LOCK_KEY": "seven"}, "does not match pattern"),
        ({"DUPGUARD_RUNBOOK_URL": "wiki.example.com"}, "does not match pattern"),
    ],
)
def test_the_schema_refuses_what_config_cannot_take(entries: dict[str, Any], why: str) -> None:
    helm = require_module("helm_python")
    with pytest.raises(helm.HelmError, match=why):
        render({"config": entries})


def test_the_schema_takes_every_default_in_dupguards_own_form() -> None:
    """The schema is no stricter than dupguard: each default, written as `--help` shows it, renders."""
    defaults = {
        s.env: config.format_value(s.default)
        for s in config.SETTINGS
        if s.env in config_entries() and s.default not in (None, ())
    }
    assert len(defaults) > 20
    docs = objects(render({"config": defaults}))
    (data,) = [d["data"] for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == RELEASE]
    assert {k: data[k] for k in defaults} == defaults


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"config": {"DUPGUARD_ALERTMANAGER_USERNAME": "a"},
             "secretKeyRefs": {"DUPGUARD_ALERTMANAGER_USERNAME": {"name": "am", "key": "user"}}},
            "config.DUPGUARD_ALERTMANAGER_USERNAME and secretKeyRefs.DUPGUARD_ALERTMANAGER_USERNAME both set",
        ),
        (
            {"mode": "standalone", "source": "api",
             "airflow": {"apiUrl": "https://airflow.example.com", "token": "t"},
             "secretKeyRefs": {"DUPGUARD_DATABASE_URL": {"name": "db", "key": "url"}}},
            "secretKeyRefs.DUPGUARD_DATABASE_URL: source: api reads no database",
        ),
    ],
)  # fmt: skip
def test_the_render_refuses_a_setting_given_twice(values: dict[str, Any], message: str) -> None:
    helm = require_module("helm_python")
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(values)


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"sidecar": {"airflowRelease": "prod"}},
        {"mode": "standalone"},
        {"mode": "standalone", "source": "api", "airflow": {"apiUrl": "https://airflow.example.com", "token": "t"}},
    ],
    ids=["sidecar", "sidecar-prod", "standalone", "standalone-api"],
)
def test_the_notes_name_the_namespace_on_every_command(values: dict[str, Any]) -> None:
    notes = render(values)["dupguard/templates/NOTES.txt"]
    commands = [line[m.start() :] for line in notes.splitlines() for m in re.finditer(r"\b(kubectl|helm) [a-z-]", line)]
    assert len(commands) >= 3, notes
    for command in commands:
        assert f" -n {NAMESPACE} " in command, command


def test_the_sidecar_honours_extra_env() -> None:
    """extraEnv was rendered into the standalone Deployment only, and silently dropped in sidecar mode."""
    extra = [
        {"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"},
        {"name": "DUPGUARD_SUMMARY_INTERVAL", "valueFrom": {"configMapKeyRef": {"name": "ops", "key": "summary"}}},
    ]
    for mode in MODES:
        container, _ = container_of(objects(render({"mode": mode, "extraEnv": extra})), mode)
        assert [e for e in container["env"] if e in extra] == extra, mode


def test_the_sidecar_can_use_a_database_role_of_its_own() -> None:
    """Least privilege in sidecar mode: secretKeyRefs.DUPGUARD_DATABASE_URL replaces the Airflow chart's
    metadata Secret (Airflow's own user) for the sidecar only; without it the sidecar reads that Secret."""
    own = {"name": "dupguard-db", "key": "url"}
    default, _ = container_of(objects(render({})), "sidecar")
    (url,) = [e for e in default["env"] if e["name"] == "DUPGUARD_DATABASE_URL"]
    assert "airflow_metadata_secret" in url["valueFrom"]["secretKeyRef"]["name"]
    container, _ = container_of(objects(render({"secretKeyRefs": {"DUPGUARD_DATABASE_URL": own}})), "sidecar")
    (url,) = [e for e in container["env"] if e["name"] == "DUPGUARD_DATABASE_URL"]
    assert url == {"name": "DUPGUARD_DATABASE_URL", "valueFrom": {"secretKeyRef": own}}
    assert "airflow_metadata_secret" not in json.dumps(container)
