"""One version everywhere: the package (pyproject.toml, the one source; `dupguard --version` reads it back
through importlib.metadata), the guard package, the chart's version and appVersion (the image tag the
chart uses by default), the Dockerfile's default label, the newest CHANGELOG release, and every place
the docs name a dupguard version to install or run."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version as installed_version
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SEMVER = r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?"

# How docs, manifests and comments name the dupguard version a reader should use. Each pattern's group 1
# is the version; the ones that name an older release on purpose (CHANGELOG, docs/how-to/deploy-kubernetes.md's
# "From 0.1.0 to 1.0.0") never use these forms.
CURRENT_VERSION_FORMS = {
    "image reference": re.compile(rf"airflow-dupguard:({SEMVER})\b"),
    "pip pin": re.compile(rf"airflow-dupguard(?:-guard)?(?:\[[a-z,]+\])?==({SEMVER})\b"),
    "helm image tag": re.compile(rf"image\.tag=({SEMVER})\b"),
    "helm chart version": re.compile(rf"(?:oci://\S+/dupguard|dupguard-)\S*\s+--version\s+({SEMVER})\b"),
    "chart archive": re.compile(rf"\bdupguard-({SEMVER})\.tgz\b"),
    "distribution file": re.compile(rf"\bairflow_dupguard(?:_guard)?-({SEMVER})(?:-py3|\.tar\.gz)"),
    "kubernetes label": re.compile(rf"app\.kubernetes\.io/version:\s*\"?({SEMVER})\b"),
    "release tag": re.compile(rf"\bgit tag (?:-[a-z] )*v({SEMVER})\b"),
}


def pyproject_version(path: Path) -> str:
    return str(tomllib.loads(path.read_text())["project"]["version"])


VERSION = pyproject_version(REPO / "pyproject.toml")


def test_the_package_version_is_semver() -> None:
    assert re.fullmatch(SEMVER, VERSION), VERSION


def test_the_guard_package_is_released_with_the_same_version() -> None:
    assert pyproject_version(REPO / "deploy" / "airflow-guard" / "pyproject.toml") == VERSION


def test_the_chart_and_its_default_image_tag_carry_the_package_version() -> None:
    chart = yaml.safe_load((REPO / "deploy" / "helm" / "dupguard" / "Chart.yaml").read_text())
    assert chart["version"] == VERSION
    assert chart["appVersion"] == VERSION  # the image tag when image.tag is empty (the default)
    values = yaml.safe_load((REPO / "deploy" / "helm" / "dupguard" / "values.yaml").read_text())
    assert values["image"]["tag"] == "", "a pinned image.tag would drift from appVersion"


def test_dupguard_version_reports_the_installed_package_version() -> None:
    """`dupguard --version` reads the installed metadata: a stale install (built before a version
    bump) fails here, as it would ship the wrong version in the image."""
    assert installed_version("airflow-dupguard") == VERSION, "reinstall: pip install -e ."
    result = subprocess.run(
        [sys.executable, "-m", "detector", "--version"], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert result.stdout.strip() == f"dupguard {VERSION}"


def changelog_releases() -> list[tuple[str, str | None]]:
    text = (REPO / "CHANGELOG.md").read_text()
    return [(m[1], m[2]) for m in re.finditer(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, re.M)]


def test_changelog_has_unreleased_first_then_the_current_release() -> None:
    releases = changelog_releases()
    assert releases[0] == ("Unreleased", None)
    assert releases[1][0] == VERSION, "the newest CHANGELOG release must be pyproject's version"
    assert releases[1][1] is not None, "a release section carries its date: ## [X.Y.Z] - YYYY-MM-DD"
    text = (REPO / "CHANGELOG.md").read_text()
    section = text.split(f"## [{VERSION}]", 1)[1].split("\n## [", 1)[0]
    assert "\n### Upgrading\n" in section, "a release says how to upgrade from the one before"


def test_changelog_cites_no_tracker_numbers() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    assert not re.search(r"\bissues? \d+|§", text, re.I), "readers do not have the tracker: say the reason"


def documented_versions() -> list[tuple[str, str, str]]:
    files = [REPO / "README.md", REPO / "Dockerfile", REPO / "Makefile"]
    for folder, pattern in (("docs", "*.md"), ("deploy", "*"), ("config", "*"), (".github", "*"), ("scripts", "*")):
        files += [p for p in sorted((REPO / folder).rglob(pattern)) if p.is_file() and p.suffix != ".tgz"]
    found = []
    for path in files:
        text = path.read_text(errors="replace")
        for form, pattern in CURRENT_VERSION_FORMS.items():
            found += [(path.relative_to(REPO).as_posix(), form, m[1]) for m in pattern.finditer(text)]
    return found


def test_docs_and_manifests_name_only_the_current_version() -> None:
    found = documented_versions()
    # Not vacuous: the deploy guide's build and install commands and the plain manifests use these forms.
    assert {"image reference", "helm image tag", "kubernetes label"} <= {form for _, form, _ in found}
    wrong = [f"{path}: {form} {version}" for path, form, version in found if version != VERSION]
    assert not wrong, f"these name another version than {VERSION}:\n" + "\n".join(wrong)


@pytest.mark.parametrize(
    ("line", "form"),
    [
        ("docker run --rm airflow-dupguard:0.9.1 --help", "image reference"),
        ("pip install airflow-dupguard-guard==0.9.1", "pip pin"),
        ("--set image.tag=0.9.1", "helm image tag"),
        ("helm install dupguard oci://ghcr.io/o/charts/dupguard --version 0.9.1", "helm chart version"),
        ("    app.kubernetes.io/version: 0.9.1", "kubernetes label"),
        ("COPY dist/airflow_dupguard_guard-0.9.1-py3-none-any.whl /tmp/", "distribution file"),
        ("twine check dist/airflow_dupguard-0.9.1.tar.gz", "distribution file"),
    ],
)
def test_each_form_catches_an_old_version(line: str, form: str) -> None:
    match = CURRENT_VERSION_FORMS[form].search(line)
    assert match is not None and match[1] == "0.9.1"
