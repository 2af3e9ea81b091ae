"""The overlays rendered with the real official Apache Airflow chart (1.18.0), as an operator would.

The chart comes from ``DUPGUARD_AIRFLOW_CHART`` (a folder or .tgz), else ``../shared/charts/airflow-1.18.0``
beside the checkout, else a pull from the official repository; without one every test here fails
(tests/deploy/support.py ``locate_airflow_chart``). Ground truth comes from what the chart renders: the
metadata Secret it creates, the scheduler pod it builds, the PgBouncer ini it writes.

The sidecar overlay is what the companion chart renders from its own values (ConfigMap
``<fullname>-airflow-values``), with the companion chart's defaults or with custom values (another
release name, image, an existing Secret read whole and a secretKeyRef, another port).

Combinations: sidecar overlay, guard overlay, both; companion defaults / custom; release ``airflow`` /
``prod``; ``useStandardNaming`` on/off; ``pgbouncer.enabled`` on/off; LocalExecutor / CeleryExecutor;
``networkPolicies.enabled`` on/off; with and without a user's own ``scheduler.extraContainers``/
``extraVolumes`` and ``airflowLocalSettings`` (merged with deploy/helm/merge_values.py, the documented
recipe). The full product is 384 renders; the tests render an all-pairs sample (every value of every
factor meets every value of every other factor at least once) and validate every object with
kubernetes-validate --strict for Kubernetes 1.30 and the newest bundled version.
"""

from __future__ import annotations

import ast
import base64
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    AIRFLOW_CHART_ENV,
    CHART,
    DEPLOY,
    assert_hardened_container,
    load_chart,
    load_documents,
    load_script,
    locate_airflow_chart,
    require_module,
    validate_unseen,
)
from tests.deploy.test_deploy_settings_values import AUTH_VARIANTS, every_value, resolved_env

SIDECAR_OVERLAY = DEPLOY / "helm" / "values-airflow-sidecar.yaml"
GUARD_OVERLAY = DEPLOY / "helm" / "values-airflow-guard.yaml"
MERGE_SCRIPT = DEPLOY / "helm" / "merge_values.py"

USER_VALUES: dict[str, Any] = {
    "scheduler": {
        "extraContainers": [{"name": "log-shipper", "image": "busybox:1.36", "args": ["sleep", "infinity"]}],
        "extraVolumes": [{"name": "shipper-buffer", "emptyDir": {}}],
        "labels": {"team": "data"},
    },
    "airflowLocalSettings": "import logging\n\nUSER_SETTING = 'kept'\nlogging.getLogger(__name__).info('loaded')\n",
}

# The companion chart's release and values the sidecar overlay is rendered from.
COMPANIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "defaults": ("dupguard", {}),
    "custom": (
        "dg",
        {
            "image": {"repository": "registry.example.com/data/airflow-dupguard", "tag": "0.1.0-rc1"},
            "existingSecret": "corp-dupguard",
            "secretKeyRefs": {"DUPGUARD_SLACK_BOT_TOKEN": {"name": "slack", "key": "bot-token"}},
            "slack": {"channel": "#airflow"},
            "http": {"port": 9470},
        },
    ),
}

FACTORS: dict[str, list[Any]] = {
    "overlays": ["sidecar", "guard", "both"],
    "companion": list(COMPANIONS),
    "release": ["airflow", "prod"],
    "standard_naming": [False, True],
    "pgbouncer": [False, True],
    "executor": ["LocalExecutor", "CeleryExecutor"],
    "network_policies": [False, True],
    "user_values": [False, True],
}


def all_pairs(factors: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """A deterministic greedy all-pairs sample of the factors' product."""
    names = list(factors)
    uncovered = {
        ((a, va), (b, vb)) for a, b in itertools.combinations(names, 2) for va in factors[a] for vb in factors[b]
    }
    candidates = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*factors.values())]

    def pairs(c: dict[str, Any]) -> set[tuple[tuple[str, Any], tuple[str, Any]]]:
        return {((a, c[a]), (b, c[b])) for a, b in itertools.combinations(names, 2)}

    chosen = []
    while uncovered:
        best = max(candidates, key=lambda c: len(pairs(c) & uncovered))
        chosen.append(best)
        uncovered -= pairs(best)
    return chosen


COMBINATIONS = all_pairs(FACTORS)


def combo_id(c: dict[str, Any]) -> str:
    flags = [k for k in ("standard_naming", "pgbouncer", "network_policies", "user_values") if c[k]]
    parts = [c["overlays"], c["companion"], c["release"], c["executor"].removesuffix("Executor").lower()]
    return "-".join([*parts, *flags])


@pytest.fixture(scope="module")
def airflow_chart(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_chart(locate_airflow_chart(tmp_path_factory.mktemp("airflow-chart")))


def _merge_module() -> Any:
    return load_script(MERGE_SCRIPT)


def companion_values(combo: dict[str, Any], **more: Any) -> tuple[str, dict[str, Any]]:
    """The companion release and values of a combination (it names the Airflow release it serves)."""
    release, values = COMPANIONS[combo["companion"]]
    sidecar = {"airflowRelease": combo["release"], "airflowNetworkPolicies": combo["network_policies"]}
    return release, _merge_module().merge(values, {"sidecar": sidecar, **more})


def sidecar_overlay(values: dict[str, Any], release: str = "dupguard") -> dict[str, Any]:
    """The Airflow values the companion chart renders for these values (its -airflow-values ConfigMap)."""
    (config,) = [d for d in render_companion(values, release) if d["metadata"]["name"].endswith("-airflow-values")]
    overlay: dict[str, Any] = yaml.safe_load(config["data"]["values.yaml"])
    return overlay


def airflow_values(combo: dict[str, Any]) -> dict[str, Any]:
    """What the operator passes to the Airflow chart: their values, then the overlays (merged)."""
    merge = _merge_module().merge
    values: dict[str, Any] = json.loads(json.dumps(USER_VALUES)) if combo["user_values"] else {}
    values = merge(
        values,
        {
            "useStandardNaming": combo["standard_naming"],
            "pgbouncer": {"enabled": combo["pgbouncer"]},
            "executor": combo["executor"],
            "networkPolicies": {"enabled": combo["network_policies"]},
        },
    )
    sidecar = sidecar_overlay(*reversed(companion_values(combo)))
    guard = yaml.safe_load(GUARD_OVERLAY.read_text())
    for overlay in {"sidecar": [sidecar], "guard": [guard], "both": [sidecar, guard]}[combo["overlays"]]:
        values = merge(values, overlay)
    return values


def render_airflow(chart: Any, values: dict[str, Any], release: str) -> list[dict[str, Any]]:
    rendered = chart.render(values, name=release, namespace="airflow")
    docs: list[dict[str, Any]] = []
    for path, text in sorted(rendered.items()):
        if not path.endswith("NOTES.txt"):
            docs += load_documents(text)
    return docs


def find(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    (obj,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(suffix)]
    return obj


def metadata_secret(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The Secret the chart itself creates for the metadata DB (ground truth for its name)."""
    (secret,) = [d for d in docs if d["kind"] == "Secret" and "connection" in d.get("data", {})
                 and d["metadata"]["name"].endswith("-metadata")]  # fmt: skip
    return secret


def scheduler_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The scheduler's pod template (a StatefulSet with LocalExecutor's persistent logs, else a Deployment)."""
    (workload,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")
                   and d["metadata"]["name"].endswith("-scheduler")]  # fmt: skip
    template: dict[str, Any] = workload["spec"]["template"]
    return template


def dupguard_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "dupguard"]
    return container


def render_companion(values: dict[str, Any], release: str = "dupguard") -> list[dict[str, Any]]:
    rendered = require_module("helm_python").Chart.load(CHART).render(values, name=release, namespace="airflow")
    return [d for path, text in rendered.items() if not path.endswith("NOTES.txt") for d in load_documents(text)]


_VALIDATED: set[str] = set()


def validate_once(docs: list[dict[str, Any]], where: str) -> None:
    """kubernetes-validate every object, skipping objects already validated in an earlier render."""
    validate_unseen(docs, _VALIDATED, where)


@pytest.mark.parametrize("combo", COMBINATIONS, ids=combo_id)
def test_overlays_on_the_real_chart(airflow_chart: Any, combo: dict[str, Any]) -> None:
    """Every object validates; the sidecar reads the chart's own metadata Secret, locks safely behind
    PgBouncer, is hardened and liveness-only; the guard lands in airflow_local_settings.py; a user's
    own containers, volumes and local settings survive the merge."""
    release = combo["release"]
    docs = render_airflow(airflow_chart, airflow_values(combo), release)
    validate_once(docs, combo_id(combo))
    pod = scheduler_pod(docs)
    names = [c["name"] for c in pod["spec"]["containers"]]
    secret = metadata_secret(docs)
    connection = base64.b64decode(secret["data"]["connection"]).decode()
    if combo["pgbouncer"]:
        ini = base64.b64decode(find(docs, "Secret", "-pgbouncer-config")["data"]["pgbouncer.ini"]).decode()
        assert "pool_mode = transaction" in ini and ":6543/" in connection

    if combo["overlays"] in ("sidecar", "both"):
        assert_sidecar_from_companion_values(pod, combo)
        container = dupguard_container(pod)
        assert_hardened_container(container, "sidecar")
        assert "readinessProbe" not in container and container["livenessProbe"]["httpGet"]["path"] == "/livez"
        env = {e["name"]: e for e in container["env"]}
        ref = env["DUPGUARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret["metadata"]["name"], "key": "connection"}
        expected = {
            (False, "airflow"): "airflow-metadata",
            (False, "prod"): "prod-metadata",
            (True, "airflow"): "airflow-metadata",
            (True, "prod"): "prod-airflow-metadata",
        }[(combo["standard_naming"], release)]
        assert ref["name"] == expected
        # Behind PgBouncer's transaction pooling a session advisory lock is not safe
        # (docs/explanation/airflow-internals.md, "Next to the official Helm chart").
        assert env["DUPGUARD_LOCK_MODE"]["value"] == ("transaction" if combo["pgbouncer"] else "auto")
        assert {"name": "dupguard-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}} in pod["spec"]["volumes"]
    else:
        assert "dupguard" not in names
    if combo["overlays"] in ("guard", "both"):
        config = find(docs, "ConfigMap", "-config")
        code = config["data"]["airflow_local_settings.py"]
        ast.parse(code)
        assert "def task_instance_mutation_hook" in code and code.startswith('"""dupguard in-scheduler guard')
    if combo["user_values"]:
        assert "log-shipper" in names, "the user's own sidecar must survive the overlay"
        assert "shipper-buffer" in {v["name"] for v in pod["spec"]["volumes"]}
        assert pod["metadata"]["labels"]["team"] == "data"
        if combo["overlays"] != "sidecar":
            code = find(docs, "ConfigMap", "-config")["data"]["airflow_local_settings.py"]
            assert "USER_SETTING = 'kept'" in code
    if combo["network_policies"] and combo["overlays"] != "guard":
        find(docs, "NetworkPolicy", "-scheduler-policy")


def assert_sidecar_from_companion_values(pod: dict[str, Any], combo: dict[str, Any]) -> None:
    """Nothing edited by hand: the sidecar's image, ConfigMap, Secrets and keys, port and checksum are the
    companion's; its NetworkPolicy and PodMonitor select these scheduler pods (from sidecar.airflowRelease)."""
    release, values = companion_values(combo, monitoring={"podMonitor": {"enabled": True}})
    companion = render_companion(values, release)
    (config,) = [d for d in companion if d["kind"] == "ConfigMap" and "DUPGUARD_CONFIG_SOURCE" in d["data"]]
    name = config["metadata"]["name"]
    assert name == ("dupguard" if release == "dupguard" else f"{release}-dupguard")
    container = dupguard_container(pod)
    image = values.get("image", {})
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]  # the default tag
    default_repository = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"]
    assert container["image"] == f"{image.get('repository', default_repository)}:{image.get('tag', app_version)}"
    env = {e["name"]: e for e in container["env"]}
    assert env["DUPGUARD_CONFIG_EXPECTED"]["value"] == config["data"]["DUPGUARD_CONFIG_SOURCE"] == f"configmap/{name}"
    assert pod["metadata"]["labels"]["dupguard-config"] == name
    secret = {"name": values["existingSecret"]} if "existingSecret" in values else {"name": name, "optional": True}
    assert container["envFrom"] == [{"configMapRef": {"name": name, "optional": True}}, {"secretRef": secret}]
    for setting, ref in values.get("secretKeyRefs", {}).items():
        assert env[setting]["valueFrom"]["secretKeyRef"] == ref
    port = values.get("http", {}).get("port", 9469)
    assert env["DUPGUARD_HTTP_PORT"]["value"] == str(port) == pod["metadata"]["annotations"]["prometheus.io/port"]
    assert container["ports"] == [{"name": "dupguard-http", "containerPort": port, "protocol": "TCP"}]
    overlay = sidecar_overlay(values, release)
    checksum = overlay["scheduler"]["podAnnotations"]["checksum/dupguard-config"]
    assert pod["metadata"]["annotations"]["checksum/dupguard-config"] == checksum
    (monitor,) = [d for d in companion if d["kind"] == "PodMonitor"]
    selectors = [monitor["spec"]["selector"]["matchLabels"]]
    selectors += [d["spec"]["podSelector"]["matchLabels"] for d in companion if d["kind"] == "NetworkPolicy"]
    assert len(selectors) == 1 + combo["network_policies"]
    for selector in selectors:
        assert selector.items() <= pod["metadata"]["labels"].items(), selector


def test_plain_overlays_without_merging_drop_user_entries(airflow_chart: Any) -> None:
    """Why the merge recipe exists: Helm's own layering (-f yours -f overlay) replaces the lists."""
    helm_layered = {**json.loads(json.dumps(USER_VALUES)), **yaml.safe_load(SIDECAR_OVERLAY.read_text())}
    pod = scheduler_pod(render_airflow(airflow_chart, helm_layered, "airflow"))
    assert "log-shipper" not in [c["name"] for c in pod["spec"]["containers"]]


def test_a_change_of_dupguards_settings_rolls_the_schedulers(airflow_chart: Any) -> None:
    """The overlay's checksum annotation: the scheduler pod template changes when a setting, a secret
    value or a Secret key dupguard reads changes (so `helm upgrade` rolls the schedulers), and only then:
    the same settings, or a change the sidecar does not read (a PodMonitor), leave it as it was."""

    def scheduler_template(**values: Any) -> dict[str, Any]:
        return scheduler_pod(render_airflow(airflow_chart, sidecar_overlay(values), "airflow"))

    base = scheduler_template(slack={"channel": "#a"})
    assert scheduler_template(slack={"channel": "#a"}) == base
    assert scheduler_template(slack={"channel": "#a"}, monitoring={"podMonitor": {"enabled": True}}) == base
    changed = [
        scheduler_template(slack={"channel": "#b"}),
        scheduler_template(slack={"channel": "#a", "botToken": "xoxb-1"}),
        scheduler_template(slack={"channel": "#a", "botToken": "xoxb-2"}),
        scheduler_template(slack={"channel": "#a"}, secretKeyRefs={"DUPGUARD_WEBHOOK_URL": {"name": "w", "key": "a"}}),
        scheduler_template(slack={"channel": "#a"}, secretKeyRefs={"DUPGUARD_WEBHOOK_URL": {"name": "w", "key": "b"}}),
        scheduler_template(slack={"channel": "#a"}, remediation={"mode": "off"}),
    ]
    checksums = [p["metadata"]["annotations"]["checksum/dupguard-config"] for p in [base, *changed]]
    assert len(set(checksums)) == len(checksums), checksums
    assert "xoxb" not in json.dumps(changed), "the checksum, never a secret, reaches the Airflow values"


def test_merge_values_takes_the_companions_configmap_as_printed_by_helm_template(tmp_path: Path) -> None:
    """GitOps without cluster access: `helm template ... --show-only templates/airflow-values.yaml` prints
    the ConfigMap; merge_values.py takes it as the overlay (its values.yaml), keeping the user's entries."""
    (config,) = [d for d in render_companion({}, "dg") if d["metadata"]["name"] == "dg-dupguard-airflow-values"]
    printed, mine = tmp_path / "airflow-values.yaml", tmp_path / "mine.yaml"
    printed.write_text(yaml.safe_dump(config))
    mine.write_text(yaml.safe_dump(USER_VALUES))
    merge = _merge_module()
    merged = merge.merge(USER_VALUES, merge.load_overlay(printed.read_text()))
    names = [c["name"] for c in merged["scheduler"]["extraContainers"]]
    assert names == ["log-shipper", "dupguard"]
    assert merged["scheduler"]["labels"] == {"team": "data", "dupguard-config": "dg-dupguard"}
    assert merge.main([str(mine), str(printed)]) == 0


def test_sidecar_on_a_mysql_metadata_db_fails_the_render(airflow_chart: Any) -> None:
    """A known conflict fails at render time with a message, instead of a sidecar that cannot work."""
    helm = require_module("helm_python")
    values = yaml.safe_load(SIDECAR_OVERLAY.read_text())
    values["data"] = {"metadataConnection": {"protocol": "mysql", "port": 3306}}
    with pytest.raises(helm.HelmError, match="PostgreSQL"):
        airflow_chart.render(values, name="airflow", namespace="airflow")


def test_merge_refuses_a_user_hook_that_would_switch_the_guard_off(tmp_path: Path) -> None:
    """A later task_instance_mutation_hook replaces dupguard's: refused unless it calls dupguard's body."""
    merge = _merge_module()
    snippet = yaml.safe_load(GUARD_OVERLAY.read_text())["airflowLocalSettings"]
    own = "def task_instance_mutation_hook(task_instance):\n    task_instance.queue = 'q'\n"
    with pytest.raises(merge.MergeError, match="_dupguard_task_instance_mutation_hook"):
        merge.merge_local_settings(own, snippet)
    calling = own + "    _dupguard_task_instance_mutation_hook(task_instance)\n"
    merged = merge.merge_local_settings(calling, snippet)
    ast.parse(merged)
    assert merge.merge_local_settings(merged, snippet) == merged, "re-merging is idempotent"
    mine, overlay = tmp_path / "mine.yaml", tmp_path / "bad.yaml"
    mine.write_text(yaml.safe_dump({"airflowLocalSettings": "from __future__ import division\n"}))
    assert merge.main([str(mine), str(GUARD_OVERLAY)]) == 2
    overlay.write_text(yaml.safe_dump({"scheduler": {"extraVolumes": [{"emptyDir": {}}]}}))
    mine.write_text(yaml.safe_dump({"scheduler": {"extraVolumes": [{"name": "a", "emptyDir": {}}]}}))
    assert merge.main([str(mine), str(overlay)]) == 2


def test_missing_chart_fails_naming_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No chart is a failure that names DUPGUARD_AIRFLOW_CHART, never a skip."""
    monkeypatch.setenv(AIRFLOW_CHART_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(pytest.fail.Exception, match=AIRFLOW_CHART_ENV):
        locate_airflow_chart(tmp_path)


@pytest.mark.parametrize("variant", AUTH_VARIANTS)
def test_every_companion_value_reaches_the_scheduler_pod(airflow_chart: Any, variant: str) -> None:
    """The platform team's setup: CeleryExecutor, two schedulers, PgBouncer, the companion with every
    value set (every setting, secrets from Secrets of their own names and keys, a database role of its
    own, extraEnv, extra volumes, a CA bundle). The scheduler pod's dupguard container gets each one:
    env entries over the companion's ConfigMap read with envFrom, as the kubelet builds it."""
    values, expected = every_value(variant)
    release, companion_docs = "dupguard", render_companion(json.loads(json.dumps(values)))
    airflow = _merge_module().merge(
        {"executor": "CeleryExecutor", "pgbouncer": {"enabled": True}, "scheduler": {"replicas": 2}},
        sidecar_overlay(values, release),
    )
    docs = render_airflow(airflow_chart, airflow, "airflow")
    validate_once(docs, f"every companion value ({variant})")
    pod = scheduler_pod(docs)
    container = dupguard_container(pod)
    env = resolved_env(container, companion_docs)
    expected["DUPGUARD_LOCK_MODE"] = "transaction"  # pgbouncer.enabled, through the Airflow chart's tpl
    assert {k: env.get(k) for k in expected} == expected
    assert [e["name"] for e in container["env"]].count("DUPGUARD_DATABASE_URL") == 1
    assert "airflow-metadata" not in json.dumps(container), "the sidecar's own role, not Airflow's user"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes["alertmanager-ca"] == {"name": "alertmanager-ca", "configMap": {"name": "alertmanager-ca"}}
    assert mounts["alertmanager-ca"] == "/etc/alertmanager-ca"
    assert volumes["dupguard-airflow-ca"]["configMap"]["name"] == "corp-ca"
    assert mounts["dupguard-airflow-ca"] == "/etc/dupguard/ca"
    (scheduler,) = [c for c in pod["spec"]["containers"] if c["name"] == "scheduler"]
    assert not {e["name"] for e in scheduler.get("env", [])} & set(expected), "only the sidecar gets them"
