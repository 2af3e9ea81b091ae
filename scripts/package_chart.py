"""Lints the companion chart as `helm lint --strict` does and packages it (scripts/release.sh).

    python scripts/package_chart.py DEST_DIR

Uses helm-python-sdk (Helm's Go engine through a C library, from the test extra): no helm binary is
needed. Lint runs for the oldest Kubernetes the chart supports and fails on any warning or error; the
archive's name carries the chart's version, which must be pyproject.toml's (one version everywhere).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "dupguard"
KUBE_VERSION = "v1.30.0"  # tests/deploy/support.py's OLDEST_KUBERNETES_VERSION
WARNING = 2


def main(dest: Path) -> int:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    if (chart["version"], chart["appVersion"]) != (version, version):
        print(f"chart {chart['version']}/{chart['appVersion']} is not the package's {version}", file=sys.stderr)
        return 1
    report = helm_python.lint(CHART, strict=True, kube_version=KUBE_VERSION)
    problems = [m for m in report["messages"] if m["severity"] >= WARNING] + report["errors"]
    for problem in problems:
        print(f"helm lint: {problem}", file=sys.stderr)
    if problems:
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    print(helm_python.package(CHART, destination=dest))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
