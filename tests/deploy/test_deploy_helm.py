"""The companion chart deploy/helm/dupguard, rendered offline with helm-python-sdk.

helm-python-sdk binds Helm's own Go engine (v4) through a bundled C library, so these renders are
what `helm template` produces, without a helm binary. Every combination of the chart's toggles is
rendered and every object is validated with kubernetes-validate in strict mode.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import (
    CHART,
    assert_hardened_container,
    load_documents,
    require_executable,
    require_module,
    validate_objects,
    validate_unseen,
    yamllint_strict,
)

SECRET_VARIANTS: dict[str, dict[str, Any]] = {
    "no-secrets": {},
    "inline-secrets": {
        "slack": {"channel": "#airflow", "botToken": "xoxb-test"},
        "airflow": {"apiUrl": "http://airflow-api-server:8080", "username": "dupguard", "password": "pw"},
        "database": {"lockDatabaseUrl": "postgresql://dupguard:pw@postgres:5432/airflow"},
    },
    # In sidecar mode the overlay reads the Secret named like the ConfigMap (<fullname>).
    "existing-secret": {"existingSecret": "dupguard"},
}
TOGGLES = {
    "enabled": [True, False],
    "mode": ["sidecar", "standalone"],
    "networkPolicy.enabled": [True, False],
    "sidecar.airflowNetworkPolicies": [True, False],
    "serviceAccount.create": [True, False],
    "podDisruptionBudget.enabled": [True, False],
    "metrics.prometheusAnnotations": [True, False],
    "remediation.mode": ["off", "dry-run", "fail", "skip"],
    "secrets": list(SECRET_VARIANTS),
}


def _set(values: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        values = values.setdefault(key, {})
    values[leaf] = value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


def combinations() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for combo in itertools.product(*TOGGLES.values()):
        values: dict[str, Any] = {}
        label = []
        for key, value in zip(TOGGLES, combo, strict=True):
            if key == "secrets":
                _merge(values, json.loads(json.dumps(SECRET_VARIANTS[value])))
            else:
                _set(values, key, value)
            label.append(f"{key}={value}")
        out.append((",".join(label), values))
    return out


def render(values: dict[str, Any], release: str = "dupguard") -> list[dict[str, Any]]:
    helm = require_module("helm_python")
    rendered = helm.Chart.load(CHART).render(values, name=release, namespace="airflow")
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if not path.endswith("NOTES.txt"):
            docs += load_documents(text)
    return docs


AIRFLOW_VALUES = "AirflowValues"  # by_kind's name for the sidecar's Airflow values (a second ConfigMap)


def kind_of(doc: dict[str, Any]) -> str:
    airflow_values = doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-airflow-values")
    return AIRFLOW_VALUES if airflow_values else str(doc["kind"])


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [kind_of(d) for d in docs]
    assert len(kinds) == len(set(kinds)), f"one object per kind expected, got {kinds}"
    return {kind_of(d): d for d in docs}


def test_chart_lints_clean() -> None:
    """helm lint (strict) finds nothing above "info" with the defaults and in standalone mode."""
    helm = require_module("helm_python")
    for values in ({}, {"mode": "standalone"}):
        report = helm.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        assert not problems, problems


@pytest.mark.timeout(900)
def test_every_toggle_combination_renders_valid_objects() -> None:
    """All toggle combinations render (fail/skip without the Airflow API too: the default backend, auto,
    may take db on the database source; test_deploy_render_checks.py sweeps the refusals); each
    distinct object passes kubernetes-validate --strict."""
    seen: set[str] = set()
    for label, values in combinations():
        docs = render(values)
        if not values["enabled"]:
            assert docs == [], f"{label}: enabled=false must render nothing"
            continue
        kinds = by_kind(docs)
        standalone = values["mode"] == "standalone"
        expected = {"ConfigMap"} if standalone else {"ConfigMap", AIRFLOW_VALUES}
        if values.get("slack") and not values.get("existingSecret"):
            expected.add("Secret")
        if standalone:
            expected |= {"Deployment", "Service"}
            if values["serviceAccount"]["create"]:
                expected.add("ServiceAccount")
            if values["podDisruptionBudget"]["enabled"]:
                expected.add("PodDisruptionBudget")
        if values["networkPolicy"]["enabled"] and (standalone or values["sidecar"]["airflowNetworkPolicies"]):
            expected.add("NetworkPolicy")
        assert set(kinds) == expected, f"{label}: rendered {sorted(kinds)}"
        assert kinds["ConfigMap"]["data"]["DUPGUARD_REMEDIATION"] == values["remediation"]["mode"]
        validate_unseen(docs, seen, label)


def test_enabled_false_renders_nothing_whatever_else_is_set() -> None:
    """The off switch wins over every other value (only NOTES.txt says so)."""
    values = _merge({"enabled": False, "mode": "standalone"}, SECRET_VARIANTS["inline-secrets"])
    helm = require_module("helm_python")
    rendered = helm.Chart.load(CHART).render(values, name="dupguard", namespace="airflow")
    manifests = {p: t for p, t in rendered.items() if not p.endswith("NOTES.txt")}
    assert all(not t.strip() for t in manifests.values()), manifests


def test_defaults_are_sidecar_dry_run() -> None:
    """Out of the box: sidecar mode, remediation dry-run, only the ConfigMap the sidecar reads and the
    one holding the Airflow values that add the sidecar."""
    kinds = by_kind(render({}))
    assert set(kinds) == {"ConfigMap", AIRFLOW_VALUES}
    data = kinds["ConfigMap"]["data"]
    assert data["DUPGUARD_REMEDIATION"] == "dry-run"
    assert kinds["ConfigMap"]["metadata"]["name"] == "dupguard", "the name the sidecar overlay reads"


def test_standalone_deployment_is_hardened_and_ready_checked() -> None:
    """Standalone: 2 replicas, readiness and liveness, pod security baseline, metrics annotations."""
    kinds = by_kind(render({"mode": "standalone", **SECRET_VARIANTS["inline-secrets"]}))
    deployment = kinds["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    (container,) = spec["containers"]
    assert_hardened_container(container, "standalone container")
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    env = {e["name"]: e for e in container["env"]}
    ref = env["DUPGUARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "airflow-metadata", "key": "connection"}
    assert {"configMapRef": {"name": "dupguard"}} in container["envFrom"]
    assert {"secretRef": {"name": "dupguard"}} in container["envFrom"]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(container["ports"][0]["containerPort"]) == "9469"
    assert kinds["Service"]["spec"]["ports"][0]["targetPort"] == "http"
    policy = kinds["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9469}]}]
    # Secrets go to the Secret, never to the ConfigMap.
    assert "xoxb-test" not in json.dumps(kinds["ConfigMap"])
    assert kinds["Secret"]["stringData"]["DUPGUARD_SLACK_BOT_TOKEN"] == "xoxb-test"
    assert kinds["Secret"]["stringData"]["DUPGUARD_LOCK_DATABASE_URL"].startswith("postgresql://")


def test_astronomer_metadata_secret_and_ca_bundle() -> None:
    """The metadata Secret name/key are configurable (Astronomer: <release>-metadata); CA is mounted."""
    values = {
        "mode": "standalone",
        "database": {"metadataSecret": {"name": "astro-metadata", "key": "connection"}},
        "airflow": {"apiUrl": "https://airflow.example.internal", "caBundle": {"configMap": "corp-ca"}},
        "networkPolicy": {"from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]},
    }
    docs = render(values)
    validate_objects(docs, "astronomer")
    kinds = by_kind(docs)
    (container,) = kinds["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["DUPGUARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "astro-metadata"
    assert kinds["ConfigMap"]["data"]["DUPGUARD_AIRFLOW_CA_BUNDLE"] == "/etc/dupguard/ca/ca.crt"
    assert {"name": "airflow-ca", "mountPath": "/etc/dupguard/ca", "readOnly": True} in container["volumeMounts"]
    assert kinds["NetworkPolicy"]["spec"]["ingress"][0]["from"] == values["networkPolicy"]["from"]


def test_sidecar_network_policy_selects_scheduler_pods() -> None:
    """Sidecar mode: the policy admits the metrics port on the Airflow scheduler pods only."""
    kinds = by_kind(render({"sidecar": {"airflowNetworkPolicies": True}}))
    selector = kinds["NetworkPolicy"]["spec"]["podSelector"]["matchLabels"]
    assert selector == {"tier": "airflow", "component": "scheduler", "release": "airflow"}


@pytest.mark.parametrize(
    "values",
    [
        {"mode": "daemonset"},
        {"remediation": {"mode": "on"}},
        {"remediation": {"mode": False}},  # a bare `off` in YAML
        {"remediation": {"backend": "sql"}},
        {"ledger": "maybe"},
        {"http": {"port": 80}},
        {"replicas": 0},
        {"unknownKey": 1},
        {"database": {"metadataSecret": {"name": "", "key": "connection"}}},
        {"slack": {"webhookUrl": "not a url"}},
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any]) -> None:
    """values.schema.json and the render checks turn typos and wrong enums into an error before anything
    is installed."""
    helm = require_module("helm_python")
    with pytest.raises(helm.HelmError):
        helm.Chart.load(CHART).render(values, name="dupguard")


def test_inline_secrets_and_existing_secret_conflict() -> None:
    """Setting both an existing Secret and inline secret values is an error, not a silent choice."""
    helm = require_module("helm_python")
    values = _merge({"existingSecret": "mine"}, json.loads(json.dumps(SECRET_VARIANTS["inline-secrets"])))
    with pytest.raises(helm.HelmError, match="existingSecret"):
        helm.Chart.load(CHART).render(values, name="dupguard")


def test_release_name_sets_object_names() -> None:
    """A release named otherwise gets <release>-dupguard names (its Airflow values read them)."""
    kinds = by_kind(render({}, release="guard"))
    assert kinds["ConfigMap"]["metadata"]["name"] == "guard-dupguard"


def test_rendered_output_passes_yamllint(tmp_path: Path) -> None:
    """The chart's output is tidy YAML (yamllint with deploy/yamllint.yaml)."""
    require_module("yamllint")
    helm = require_module("helm_python")
    chart = helm.Chart.load(CHART)
    files = []
    for n, values in enumerate(({}, {"mode": "standalone", **SECRET_VARIANTS["inline-secrets"]})):
        for path, text in chart.render(values, name="dupguard", namespace="airflow").items():
            if path.endswith(".yaml") and text.strip():
                out = tmp_path / f"{n}-{Path(path).name}"
                out.write_text(text.lstrip("\n"))
                files.append(str(out))
    yamllint_strict(files)


def test_standalone_lock_mode_reaches_the_configmap() -> None:
    """Standalone behind PgBouncer: database.lockMode=transaction becomes DUPGUARD_LOCK_MODE."""
    kinds = by_kind(render({"mode": "standalone", "database": {"lockMode": "transaction"}}))
    assert kinds["ConfigMap"]["data"]["DUPGUARD_LOCK_MODE"] == "transaction"
    assert kinds["ConfigMap"]["data"]["DUPGUARD_CONFIG_SOURCE"] == "configmap/dupguard"
    (container,) = kinds["Deployment"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DUPGUARD_CONFIG_EXPECTED"] == kinds["ConfigMap"]["data"]["DUPGUARD_CONFIG_SOURCE"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"database": {"lockMode": "transaction"}}, "pgbouncer.enabled"),
    ],
)
def test_sidecar_mode_refuses_settings_the_overlay_would_ignore(values: dict[str, Any], message: str) -> None:
    """Known conflicts of sidecar mode fail the render instead of being silently ignored."""
    helm = require_module("helm_python")
    with pytest.raises(helm.HelmError, match=message):
        helm.Chart.load(CHART).render({"mode": "sidecar", "database": {}, **values}, name="dupguard")


def test_secret_keys_of_any_secret_reach_the_container_in_both_modes() -> None:
    """secretKeyRefs: one secretKeyRef per setting, from Secrets of any name and key, in the standalone
    Deployment and in the sidecar's Airflow values; an existingSecret of any name is read whole by both."""
    import yaml

    refs = {
        "DUPGUARD_AIRFLOW_PASSWORD": {"name": "airflow-api-user", "key": "password"},
        "DUPGUARD_SLACK_BOT_TOKEN": {"name": "slack", "key": "bot-token"},
    }
    values = {"secretKeyRefs": refs, "existingSecret": "corp-dupguard", "slack": {"channel": "#airflow"}}
    standalone = by_kind(render({"mode": "standalone", **values}))
    validate_objects(list(standalone.values()), "secretKeyRefs")
    (container,) = standalone["Deployment"]["spec"]["template"]["spec"]["containers"]
    sidecar = by_kind(render({"mode": "sidecar", **values}))[AIRFLOW_VALUES]["data"]["values.yaml"]
    (overlay,) = yaml.safe_load(sidecar)["scheduler"]["extraContainers"]
    for where in (container, overlay):
        env = {e["name"]: e.get("valueFrom", {}).get("secretKeyRef") for e in where["env"]}
        assert {k: env[k] for k in refs} == refs
        assert {"secretRef": {"name": "corp-dupguard"}} in where["envFrom"]


def test_notes_fetch_this_releases_airflow_values() -> None:
    """Sidecar NOTES: the command that fetches this release's Airflow values and the Airflow release to
    upgrade with them (sidecar.airflowRelease); no flag to add by hand, whatever the release name."""
    helm = require_module("helm_python")
    values = {"sidecar": {"airflowRelease": "prod"}}
    notes = helm.Chart.load(CHART).render(values, name="dg", namespace="data")["dupguard/templates/NOTES.txt"]
    assert "kubectl -n data get configmap dg-dupguard-airflow-values" in notes
    assert "helm -n data upgrade prod apache-airflow/airflow --reuse-values -f dupguard-airflow-values.yaml" in notes
    assert "merge_values.py" in notes and "--set-string" not in notes


# --- source: api (managed platforms: no database Secret, one replica, Recreate) ---------------------

API = {"mode": "standalone", "source": "api", "airflow": {"apiUrl": "https://airflow.example.com/d1"}}
API_AUTH: dict[str, dict[str, Any]] = {
    "token-secret": {"airflow": {"tokenSecret": {"name": "astro-deployment-token", "key": "token"}}},
    "inline-token": {"airflow": {"token": "astro-token-value"}},
    "token-command": {
        "airflow": {"tokenCommand": "cat /var/run/airflow-token/token"},
        "extraVolumes": [{"name": "airflow-token", "secret": {"secretName": "rotated-token"}}],
        "extraVolumeMounts": [{"name": "airflow-token", "mountPath": "/var/run/airflow-token", "readOnly": True}],
    },
    "username-password": {"airflow": {"username": "dupguard", "password": "pw"}},
    "existing-secret": {"existingSecret": "dupguard-api"},
}


def _api_values(auth: str, **more: Any) -> dict[str, Any]:
    values = _merge(json.loads(json.dumps(API)), json.loads(json.dumps(API_AUTH[auth])))
    for key, value in more.items():
        _set(values, key, value)
    return values


@pytest.mark.parametrize("auth", sorted(API_AUTH))
def test_api_source_is_one_recreated_pod_without_a_database_secret(auth: str) -> None:
    """source api: every toggle combination renders valid objects (kubernetes-validate --strict); the
    Deployment has exactly one replica and strategy Recreate, nothing names the metadata Secret or
    sets DUPGUARD_DATABASE_URL, no PodDisruptionBudget (one pod), and the token reaches the container."""
    seen: set[str] = set()
    toggles = {
        "networkPolicy.enabled": [True, False],
        "serviceAccount.create": [True, False],
        "podDisruptionBudget.enabled": [True, False],
        "remediation.mode": ["dry-run", "fail"],
        "replicas": [3],
        "api.stateVolume.enabled": [True, False],
        "api.stateVolume.existingClaim": ["", "dupguard-state-mine"],
        "api.pollInterval": ["", "1s"],
    }
    for combo in itertools.product(*toggles.values()):
        label = f"{auth}," + ",".join(f"{k}={v}" for k, v in zip(toggles, combo, strict=True))
        values = _api_values(auth, **dict(zip(toggles, combo, strict=True)))
        docs = render(values)
        kinds = by_kind(docs)
        assert "PodDisruptionBudget" not in kinds, label
        state = values["api"]["stateVolume"]
        data = kinds["ConfigMap"]["data"]
        # The database source's 5ms is never the API's poll interval (200 requests a second).
        assert data.get("DUPGUARD_POLL_INTERVAL") == (values["api"]["pollInterval"] or None), label
        volumes = {v["name"]: v for v in kinds["Deployment"]["spec"]["template"]["spec"]["volumes"]}
        if state["enabled"]:
            assert data["DUPGUARD_STATE_FILE"] == "/var/lib/dupguard/state.json", label
            claim = state["existingClaim"] or "dupguard-state"
            assert volumes["state"]["persistentVolumeClaim"]["claimName"] == claim, label
            assert ("PersistentVolumeClaim" in kinds) == (not state["existingClaim"]), label
            if not state["existingClaim"]:
                assert kinds["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]
        else:
            assert "DUPGUARD_STATE_FILE" not in data and "state" not in volumes and "PersistentVolumeClaim" not in kinds
        deployment = kinds["Deployment"]["spec"]
        assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}, label
        text = json.dumps(docs)
        assert "DUPGUARD_DATABASE_URL" not in text and "airflow-metadata" not in text, label
        assert kinds["ConfigMap"]["data"]["DUPGUARD_SOURCE"] == "api"
        assert kinds["ConfigMap"]["data"]["DUPGUARD_AIRFLOW_API_URL"] == "https://airflow.example.com/d1"
        (container,) = kinds["Deployment"]["spec"]["template"]["spec"]["containers"]
        assert_hardened_container(container, label)
        env = {e["name"]: e for e in container["env"]}
        secret = kinds.get("Secret", {}).get("stringData", {})
        if auth == "token-secret":
            ref = env["DUPGUARD_AIRFLOW_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "astro-deployment-token", "key": "token"}
        elif auth == "inline-token":
            assert secret["DUPGUARD_AIRFLOW_TOKEN"] == "astro-token-value"
            assert "astro-token-value" not in json.dumps(kinds["ConfigMap"])
        elif auth == "token-command":
            assert secret["DUPGUARD_AIRFLOW_TOKEN_COMMAND"] == "cat /var/run/airflow-token/token"
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert mounts["airflow-token"] == "/var/run/airflow-token"
        elif auth == "existing-secret":
            assert {"secretRef": {"name": "dupguard-api"}} in container["envFrom"]
        validate_unseen(docs, seen, label)


def test_database_source_is_unchanged_by_the_api_switch() -> None:
    """The default source renders as before: the metadata Secret, 2 replicas, rolling updates."""
    kinds = by_kind(render({"mode": "standalone", **SECRET_VARIANTS["inline-secrets"]}))
    spec = kinds["Deployment"]["spec"]
    assert spec["replicas"] == 2 and "strategy" not in spec
    assert "DUPGUARD_SOURCE" not in kinds["ConfigMap"]["data"] and "PersistentVolumeClaim" not in kinds
    assert kinds["ConfigMap"]["data"]["DUPGUARD_POLL_INTERVAL"] == "5ms"
    (container,) = spec["template"]["spec"]["containers"]
    assert "DUPGUARD_DATABASE_URL" in {e["name"] for e in container["env"]}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (_merge(json.loads(json.dumps(API)), {"mode": "sidecar"}), "set mode: standalone"),
        (_api_values("inline-token", **{"remediation.backend": "db"}), "use DUPGUARD_REMEDIATION_BACKEND=api"),
        ({"mode": "standalone", "source": "api", "airflow": {"token": "t"}}, "airflow.apiUrl: DUPGUARD_SOURCE=api"),
        (API, "DUPGUARD_SOURCE=api needs DUPGUARD_AIRFLOW_TOKEN"),
        (_api_values("token-secret", **{"airflow.token": "t"}), "keep one"),
        (_api_values("token-command", **{"airflow.token": "t"}), "or DUPGUARD_AIRFLOW_TOKEN, not both"),
        (_api_values("token-command", **{"airflow.password": "p"}), "or DUPGUARD_AIRFLOW_PASSWORD, not both"),
        ({"source": "graphql"}, "source"),
    ],
    ids=[
        "sidecar",
        "db-backend",
        "no-url",
        "no-auth",
        "token-twice",
        "token-and-command",
        "password-and-command",
        "bad-enum",
    ],
)
def test_api_source_refuses_what_cannot_work(values: dict[str, Any], message: str) -> None:
    """Each of these would start a dupguard that cannot see or act: the render fails with the reason."""
    helm = require_module("helm_python")
    with pytest.raises(helm.HelmError, match=message):
        helm.Chart.load(CHART).render(json.loads(json.dumps(values)), name="dupguard")


def test_api_source_lints_and_passes_yamllint(tmp_path: Path) -> None:
    helm = require_module("helm_python")
    require_module("yamllint")
    values = _api_values("token-command")
    report = helm.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
    assert not [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
    files = []
    for path, text in helm.Chart.load(CHART).render(values, name="dupguard", namespace="airflow").items():
        if path.endswith(".yaml") and text.strip():
            out = tmp_path / Path(path).name
            out.write_text(text.lstrip("\n"))
            files.append(str(out))
    yamllint_strict(files)


@pytest.mark.parametrize("auth", sorted(set(API_AUTH) - {"existing-secret"}))
def test_api_source_settings_are_accepted_by_dupguard(auth: str) -> None:
    """What the api Deployment hands the container (ConfigMap, chart Secret, env) passes `dupguard
    check-config`: source api without a database URL, the state file on the volume, the api source's
    own poll interval (not the database source's 5ms)."""
    import os
    import subprocess

    values = _api_values(auth, **{"remediation.mode": "fail"})
    kinds = by_kind(render(values))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")}
    env |= kinds["ConfigMap"]["data"] | kinds.get("Secret", {}).get("stringData", {})
    (container,) = kinds["Deployment"]["spec"]["template"]["spec"]["containers"]
    for var in container["env"]:
        env[var["name"]] = var.get("value", "value-from-a-secret")
    done = subprocess.run(
        [require_executable("dupguard"), "check-config"], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split(":", 1)[0]: line for line in done.stdout.splitlines()}
    assert "# DUPGUARD_SOURCE" in lines["source"] and "api" in lines["source"]
    assert "/var/lib/dupguard/state.json" in lines["state_file"]
    assert "5ms" not in lines["poll_interval"]
    assert "# default" in lines["database_url"]
