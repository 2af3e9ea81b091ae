"""The Airflow-chart overlays and the plain manifests in deploy/k8s/.

The sidecar overlay is rendered the way the official Airflow chart renders it: a throw-away chart
whose pod template passes scheduler.extraContainers and extraVolumes through `tpl`, exactly like
the official chart's scheduler-deployment.yaml, with the chart's `airflow_metadata_secret` helper.
The resulting Pod is validated with kubernetes-validate --strict.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    DEPLOY,
    REPO,
    assert_hardened_container,
    load_documents,
    require_executable,
    require_module,
    throwaway_pod,
    validate_objects,
)

SIDECAR_OVERLAY = DEPLOY / "helm" / "values-airflow-sidecar.yaml"
GUARD_OVERLAY = DEPLOY / "helm" / "values-airflow-guard.yaml"
K8S = DEPLOY / "k8s"
PLACEHOLDER = "DUPGUARD GUARD SNIPPET PLACEHOLDER"

# What the official chart does with these values (chart/templates/scheduler/scheduler-deployment.yaml
# and _helpers.yaml, apache/airflow): tpl over toYaml of the lists, and the metadata Secret helper.
MIMIC_TEMPLATE = """\
apiVersion: v1
kind: Pod
metadata:
  name: {{ .Release.Name }}-scheduler
  {{- with .Values.scheduler.podAnnotations }}
  annotations: {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  containers:
    - name: scheduler
      image: apache/airflow:3.1.2
  {{- if .Values.scheduler.extraContainers }}
    {{- tpl (toYaml .Values.scheduler.extraContainers) . | nindent 4 }}
  {{- end }}
  volumes:
    - name: logs
      emptyDir: {}
  {{- if .Values.scheduler.extraVolumes }}
    {{- tpl (toYaml .Values.scheduler.extraVolumes) . | nindent 4 }}
  {{- end }}
"""
MIMIC_HELPERS = """\
{{- define "airflow_metadata_secret" -}}
  {{- default (printf "%s-airflow-metadata" .Release.Name) .Values.data.metadataSecretName }}
{{- end }}
"""


@pytest.fixture(scope="module")
def mimic_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("official-chart-mimic") / "airflow"
    (root / "templates").mkdir(parents=True)
    (root / "Chart.yaml").write_text("apiVersion: v2\nname: airflow\nversion: 1.18.0\n")
    (root / "values.yaml").write_text(
        "data:\n  metadataSecretName: ~\nscheduler:\n  podAnnotations: {}\n  extraContainers: []\n  extraVolumes: []\n"
    )
    (root / "templates" / "scheduler.yaml").write_text(MIMIC_TEMPLATE)
    (root / "templates" / "_helpers.yaml").write_text(MIMIC_HELPERS)
    return root


def render_overlay(chart: Path, release: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    helm = require_module("helm_python")
    values = yaml.safe_load(SIDECAR_OVERLAY.read_text())
    values.update(extra or {})
    rendered = helm.Chart.load(chart).render(values, name=release, namespace="airflow")
    (pod,) = load_documents(rendered["airflow/templates/scheduler.yaml"])
    return pod


def dupguard_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "dupguard"]
    return container


def test_sidecar_overlay_renders_a_valid_hardened_container(mimic_chart: Path) -> None:
    """The overlay, rendered like the official chart does, is a valid, hardened, liveness-only sidecar."""
    pod = render_overlay(mimic_chart, "airflow")
    validate_objects([pod], "scheduler pod with the sidecar overlay")
    container = dupguard_container(pod)
    assert_hardened_container(container, "sidecar overlay")
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert "readinessProbe" not in container, "a sidecar readiness probe would take the scheduler out"
    assert "startupProbe" not in container
    env = {e["name"]: e for e in container["env"]}
    assert env["DUPGUARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "airflow-airflow-metadata",
        "key": "connection",
    }
    port = container["ports"][0]
    assert port["containerPort"] == int(env["DUPGUARD_HTTP_PORT"]["value"]) == 9469
    assert len(port["name"]) <= 15
    annotations = pod["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9469",
        "prometheus.io/path": "/metrics",
    }
    for source in container["envFrom"]:
        ref = source.get("configMapRef") or source.get("secretRef")
        assert ref["name"] == "dupguard" and ref["optional"] is True, "settings are optional"


def test_sidecar_overlay_follows_the_charts_metadata_secret_name(mimic_chart: Path) -> None:
    """Another release name, or data.metadataSecretName, changes the Secret the sidecar reads."""
    pod = render_overlay(mimic_chart, "prod")
    env = {e["name"]: e for e in dupguard_container(pod)["env"]}
    assert env["DUPGUARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "prod-airflow-metadata"
    pod = render_overlay(mimic_chart, "prod", {"data": {"metadataSecretName": "my-metadata"}})
    env = {e["name"]: e for e in dupguard_container(pod)["env"]}
    assert env["DUPGUARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "my-metadata"


def test_sidecar_overlay_container_in_a_throwaway_pod() -> None:
    """Read as plain YAML (no Helm), the overlay's container and volume form a valid Pod."""
    scheduler = yaml.safe_load(SIDECAR_OVERLAY.read_text())["scheduler"]
    pod = throwaway_pod(scheduler["extraContainers"], scheduler["extraVolumes"])
    validate_objects([pod], "overlay container in a throw-away Pod")


def test_guard_overlay_is_python_the_official_chart_can_template() -> None:
    """airflowLocalSettings is valid Python, free of `{{` (the chart runs it through tpl), and either
    the marked placeholder with instructions or exactly `dupguard guard print-local-settings`."""
    text = GUARD_OVERLAY.read_text()
    values = yaml.safe_load(text)
    assert set(values) == {"airflowLocalSettings"}
    snippet = values["airflowLocalSettings"]
    assert isinstance(snippet, str)
    ast.parse(snippet)
    assert "{{" not in snippet
    if PLACEHOLDER in snippet:
        assert "dupguard guard print-local-settings" in text
        return
    dupguard = require_executable("dupguard")
    printed = subprocess.run(
        [dupguard, "guard", "print-local-settings"], capture_output=True, text=True, check=True
    ).stdout
    assert snippet.strip() == printed.strip(), "re-paste `dupguard guard print-local-settings`"
    assert "task_instance_mutation_hook" in snippet


def test_plain_manifests_are_valid_and_hardened() -> None:
    """Every object in deploy/k8s/ passes strict validation; the shipped Deployment is dry-run."""
    objects = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "sidecar-patch.yaml":
            continue
        objects += load_documents(path.read_text())
    validate_objects(objects, "deploy/k8s")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Deployment", "dupguard") in kinds and ("Secret", "dupguard") in kinds
    for obj in objects:
        if obj["kind"] == "Deployment":
            (container,) = obj["spec"]["template"]["spec"]["containers"]
            assert_hardened_container(container, "deploy/k8s standalone")
            assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        if obj["kind"] == "ConfigMap":
            assert obj["data"]["DUPGUARD_REMEDIATION"] == "dry-run"


def test_sidecar_patch_is_a_valid_pod_fragment() -> None:
    """The kubectl patch holds the same container as the overlay and validates inside a Pod."""
    patch = yaml.safe_load((K8S / "sidecar-patch.yaml").read_text())
    spec = patch["spec"]["template"]["spec"]
    validate_objects([throwaway_pod(spec["containers"], spec["volumes"])], "sidecar-patch.yaml")
    (container,) = spec["containers"]
    assert_hardened_container(container, "sidecar-patch.yaml")
    assert "readinessProbe" not in container


def test_plain_manifests_are_generated_from_the_chart() -> None:
    """deploy/k8s/ is up to date with the chart and the overlay (python deploy/k8s/generate.py)."""
    require_module("helm_python")
    result = subprocess.run(
        [sys.executable, str(K8S / "generate.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_yamllint_on_all_deploy_yaml() -> None:
    """yamllint --strict is clean on every YAML file under deploy/ (chart templates excepted: they are
    Go templates; their rendered output is linted in test_deploy_helm)."""
    require_module("yamllint")
    files = [str(p) for p in sorted(DEPLOY.rglob("*.yaml")) if "templates" not in p.relative_to(DEPLOY).parts]
    assert len(files) >= 8
    result = subprocess.run(
        [require_executable("yamllint"), "--strict", "-c", str(REPO / "deploy" / "yamllint.yaml"), *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
