"""The overlays rendered with the real official Apache Airflow chart (1.18.0), as an operator would.

The chart comes from ``DUPGUARD_AIRFLOW_CHART`` (a folder or .tgz), else ``../shared/charts/airflow-1.18.0``
beside the checkout, else a pull from the official repository; without one every test here fails
(tests/deploy/support.py ``locate_airflow_chart``). Ground truth comes from what the chart renders: the
metadata Secret it creates, the scheduler pod it builds, the PgBouncer ini it writes.

Combinations: sidecar overlay, guard overlay, both; release ``airflow`` / ``prod``; ``useStandardNaming``
on/off; ``pgbouncer.enabled`` on/off; LocalExecutor / CeleryExecutor; ``networkPolicies.enabled`` on/off;
with and without a user's own ``scheduler.extraContainers``/``extraVolumes`` and ``airflowLocalSettings``
(merged with deploy/helm/merge_values.py, the documented recipe). The full product is 192 renders; the
tests render an all-pairs sample (every value of every factor meets every value of every other factor
at least once: 8 renders) and validate every object with kubernetes-validate --strict for Kubernetes
1.30 and the newest bundled version.
"""

from __future__ import annotations

import ast
import base64
import importlib.util
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
    locate_airflow_chart,
    require_module,
    validate_unseen,
)

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

FACTORS: dict[str, list[Any]] = {
    "overlays": ["sidecar", "guard", "both"],
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
    return "-".join([c["overlays"], c["release"], c["executor"].removesuffix("Executor").lower(), *flags])


@pytest.fixture(scope="module")
def airflow_chart(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_chart(locate_airflow_chart(tmp_path_factory.mktemp("airflow-chart")))


def _merge_module() -> Any:
    spec = importlib.util.spec_from_file_location("merge_values", MERGE_SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    overlays = {"sidecar": [SIDECAR_OVERLAY], "guard": [GUARD_OVERLAY], "both": [SIDECAR_OVERLAY, GUARD_OVERLAY]}
    for overlay in overlays[combo["overlays"]]:
        values = merge(values, yaml.safe_load(overlay.read_text()))
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
        # Behind PgBouncer's transaction pooling a session advisory lock is not safe (facts §6).
        assert env["DUPGUARD_LOCK_MODE"]["value"] == ("transaction" if combo["pgbouncer"] else "auto")
        assert env["DUPGUARD_CONFIG_EXPECTED"]["value"] == "configmap/dupguard"
        assert pod["metadata"]["labels"]["dupguard-config"] == "dupguard"
        for source in container["envFrom"]:
            ref = source.get("configMapRef") or source.get("secretRef")
            assert ref == {"name": "dupguard", "optional": True}
        assert {"name": "dupguard-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}} in pod["spec"]["volumes"]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9469"
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
        # The companion chart's sidecar policy must select exactly these scheduler pods.
        find(docs, "NetworkPolicy", "-scheduler-policy")
        companion = render_companion(
            {"sidecar": {"airflowNetworkPolicies": True, "schedulerPodLabels": {"release": release}}}
        )
        (policy,) = [d for d in companion if d["kind"] == "NetworkPolicy"]
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()


def test_plain_overlays_without_merging_drop_user_entries(airflow_chart: Any) -> None:
    """Why the merge recipe exists: Helm's own layering (-f yours -f overlay) replaces the lists."""
    helm_layered = {**json.loads(json.dumps(USER_VALUES)), **yaml.safe_load(SIDECAR_OVERLAY.read_text())}
    pod = scheduler_pod(render_airflow(airflow_chart, helm_layered, "airflow"))
    assert "log-shipper" not in [c["name"] for c in pod["spec"]["containers"]]


def test_companion_label_redirects_the_sidecar_settings(airflow_chart: Any) -> None:
    """A companion release named otherwise: one label makes the sidecar read that release's objects."""
    values = airflow_values({**COMBINATIONS[0], "overlays": "sidecar", "user_values": False})
    values["scheduler"]["labels"]["dupguard-config"] = "dg-dupguard"
    container = dupguard_container(scheduler_pod(render_airflow(airflow_chart, values, "airflow")))
    assert [s.get("configMapRef", s.get("secretRef"))["name"] for s in container["envFrom"]] == ["dg-dupguard"] * 2
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DUPGUARD_CONFIG_EXPECTED"] == "configmap/dg-dupguard"
    (config,) = [d for d in render_companion({}, release="dg") if d["kind"] == "ConfigMap"]
    assert config["metadata"]["name"] == "dg-dupguard"
    assert config["data"]["DUPGUARD_CONFIG_SOURCE"] == env["DUPGUARD_CONFIG_EXPECTED"]


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
