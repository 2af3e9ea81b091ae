"""The example configurations in config/ pass `dupguard check-config`, as an operator would run it.

Each file names the environment variables its deployment provides (`# env:` line); the test gives them
placeholder values (a PostgreSQL URL for database URLs) and nothing else, so a setting the file gets
wrong, or one that needs a variable the file does not declare, fails.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.support import REPO, require_executable

CONFIG = REPO / "config"


def examples() -> list[Path]:
    return sorted(CONFIG.glob("*.yaml"))


def declared_env(path: Path) -> dict[str, str]:
    (line,) = [ln for ln in path.read_text().splitlines() if ln.startswith("# env:")]
    out = {}
    for name in line.removeprefix("# env:").split():
        out[name] = "postgresql://dupguard:placeholder@postgres:5432/airflow" if name.endswith("_URL") else "x"
        if name.endswith("WEBHOOK_URL"):
            out[name] = "https://hooks.example.com/placeholder"
    return out


def check_config(path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | declared_env(path)
    return subprocess.run(
        [require_executable("dupguard"), "check-config", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )


def test_the_examples_are_the_documented_set() -> None:
    """sidecar, standalone, PgBouncer, alert-only and the REST source, each listed in the README."""
    names = {p.name for p in examples()}
    assert names == {"sidecar.yaml", "standalone.yaml", "pgbouncer.yaml", "alert-only.yaml", "rest-source.yaml"}
    readme = (CONFIG / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in names)


@pytest.mark.parametrize("path", examples(), ids=lambda p: p.name)
def test_example_passes_check_config(path: Path) -> None:
    """`dupguard check-config --config <file>` exits 0 and shows the file's settings as effective."""
    result = check_config(path)
    assert result.returncode == 0, result.stdout + result.stderr
    for key in yaml.safe_load(path.read_text()):
        assert re.search(rf"^{key}: .*# config file key {key}$", result.stdout, re.MULTILINE), (
            f"{key} is not taken from the file:\n{result.stdout}"
        )
    assert "placeholder" not in result.stdout, "secrets and passwords are redacted"


def test_the_examples_and_the_chart_poll_at_the_default_interval() -> None:
    """Where the database source's poll interval is written out (config/sidecar.yaml, the k8s
    manifests, the chart's values) it is dupguard's default: the default is chosen for its idle CPU and
    its catch rate (benchmarks/results/measurements.md), and an example pinning another one would deploy that
    trade-off unsaid."""
    from detector.config import SETTINGS, format_duration

    default = format_duration(next(s for s in SETTINGS if s.name == "poll_interval").default)
    deploy = REPO / "deploy"
    written = {"config/sidecar.yaml": str(yaml.safe_load((CONFIG / "sidecar.yaml").read_text())["poll_interval"])}
    for name in ("standalone.yaml", "sidecar-config.yaml"):
        maps = [d for d in yaml.safe_load_all((deploy / "k8s" / name).read_text()) if d and d["kind"] == "ConfigMap"]
        written[f"deploy/k8s/{name}"] = next(m["data"]["DUPGUARD_POLL_INTERVAL"] for m in maps)
    values = yaml.safe_load((deploy / "helm" / "dupguard" / "values.yaml").read_text())
    written["deploy/helm/dupguard/values.yaml"] = values["pollInterval"]
    assert written == dict.fromkeys(written, default)
