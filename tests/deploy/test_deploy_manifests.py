"""The Airflow-chart overlays read as plain YAML, and the plain manifests in deploy/k8s/.

The overlays rendered with the real official chart are in test_deploy_airflow_chart.py.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import yaml

from tests.deploy.support import (
    DEPLOY,
    assert_hardened_container,
    load_documents,
    require_executable,
    require_module,
    throwaway_pod,
    validate_objects,
    yamllint_strict,
)

SIDECAR_OVERLAY = DEPLOY / "helm" / "values-airflow-sidecar.yaml"
GUARD_OVERLAY = DEPLOY / "helm" / "values-airflow-guard.yaml"
K8S = DEPLOY / "k8s"
PLACEHOLDER = "DUPGUARD GUARD SNIPPET PLACEHOLDER"


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
    yamllint_strict(files)
