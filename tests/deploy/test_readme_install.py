"""The README's install commands work as printed: no value guessed, no hand edit.

The `helm install` of the README's Install section is parsed as a shell would (its `--set` flags), the
companion chart is rendered with exactly those values, the Airflow values it renders are fed to the
official Airflow chart as the README's `helm upgrade` does, and the scheduler pod must then run the
dupguard sidecar of the released image with the settings the command gave (Slack channel and token,
Alertmanager, cluster name). The chart version and the image the README names are the chart's own.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.support import CHART
from tests.deploy.test_deploy_airflow_chart import (
    airflow_chart,  # noqa: F401 - the fixture
    dupguard_container,
    render_airflow,
    render_companion,
    scheduler_pod,
    sidecar_overlay,
)
from tests.deploy.test_deploy_settings_values import resolved_env

README = Path(__file__).resolve().parents[2] / "README.md"


def install_commands() -> list[list[str]]:
    """The shell commands of the README's first sh block that installs the chart, split as sh would."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if "helm install dupguard" in b]
    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def values_of(argv: list[str]) -> dict[str, Any]:
    """The values a `helm install --set a.b=c ...` gives (strings; what these commands set)."""
    values: dict[str, Any] = {}
    for flag, arg in itertools.pairwise(argv):
        if flag == "--set":
            dotted, _, value = arg.partition("=")
            *parents, leaf = dotted.split(".")
            node = values
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
    return values


def test_the_readme_names_this_charts_version_and_image() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    install = next(c for c in install_commands() if c[:3] == ["helm", "install", "dupguard"])
    assert install[install.index("--version") + 1] == chart["version"]
    repository = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"]
    assert f"`{repository}:{chart['appVersion']}`" in README.read_text()


def test_the_readme_install_gives_a_configured_sidecar(airflow_chart: Any) -> None:  # noqa: F811
    commands = install_commands()
    install = next(c for c in commands if c[:3] == ["helm", "install", "dupguard"])
    namespace = install[install.index("-n") + 1]
    values = values_of(install)
    companion = render_companion(values)
    upgrade = next(c for c in commands if c[:3] == ["helm", "upgrade", "airflow"])
    assert upgrade[upgrade.index("-n") + 1] == namespace and "dupguard-airflow-values.yaml" in upgrade
    docs = render_airflow(airflow_chart, sidecar_overlay(values), "airflow")
    container = dupguard_container(scheduler_pod(docs))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"ghcr.io/airflow-dupguard/airflow-dupguard:{chart['appVersion']}"
    env = resolved_env(container, companion)
    assert env["DUPGUARD_CLUSTER_NAME"] == "prod"
    assert env["DUPGUARD_SLACK_CHANNEL"] == "#airflow-alerts"
    assert env["DUPGUARD_ALERTMANAGER_URLS"] == "http://alertmanager-operated.monitoring:9093"
    assert env["DUPGUARD_SLACK_BOT_TOKEN"] == {"secretKeyRef": {"name": "slack", "key": "bot-token"}}
    assert env["DUPGUARD_REMEDIATION"] == "dry-run"
