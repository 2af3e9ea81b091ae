"""`make release` (scripts/release.sh) on a clean copy of this tree: the Python packages as PyPI checks
them, the chart linted and packaged, and the image built from the real Dockerfile (buildah, no Docker
engine) and then run as Kubernetes runs it: the image's non-root user, a read-only root, /tmp the only
writable place. The same scripts the release workflow runs; nothing here is a stand-in.

Cost: the first run on a machine bootstraps the base image (mmdebstrap) and downloads the locked
dependencies (about 6 minutes on 2 busy cores); later runs reuse the base and the dependency layer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.support import REPO

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
RUN_LOCAL = ["python3", "deploy/docker/run_local.py"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This tree as it is now (tracked and new files, ignored ones left out), committed in a fresh repo:
    the clean tree a release is made from, whatever the state of the working copy under test."""
    root = tmp_path_factory.mktemp("release") / "repo"
    listed = git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for rel in filter(None, listed):
        source = REPO / rel
        if source.is_file() and not source.is_symlink():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / rel)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=release test", "-c", "user.email=release@test.invalid", "commit", "-q", "-m", "tree")
    return root


def release(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    env["PYTHON"] = sys.executable  # this venv has build, twine and helm-python-sdk (the test extra)
    return subprocess.run(
        ["scripts/release.sh", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=1700
    )


def test_a_dirty_tree_is_refused(clean_copy: Path) -> None:
    (clean_copy / "detector" / "stray.py").write_text("# not committed\n")
    try:
        result = release(clean_copy, "--no-image")
    finally:
        (clean_copy / "detector" / "stray.py").unlink()
    assert result.returncode == 1, result.stderr
    assert "not clean" in result.stderr and "detector/stray.py" in result.stderr
    assert not (clean_copy / "dist").exists()


def test_a_tag_of_another_version_is_refused(clean_copy: Path) -> None:
    git(clean_copy, "tag", "v0.9.9")
    try:
        result = release(clean_copy, "--no-image")
    finally:
        git(clean_copy, "tag", "-d", "v0.9.9")
    assert result.returncode == 1
    assert f"tagged v0.9.9 but pyproject.toml says {VERSION}" in result.stderr


@pytest.fixture(scope="module")
def dist(clean_copy: Path) -> Iterator[Path]:
    result = release(clean_copy)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    yield clean_copy / "dist"
    for archive in (clean_copy / "dist" / "image").glob("*.oci.tar"):
        tag = archive.name.removeprefix("airflow-dupguard-").removesuffix(".oci.tar")
        subprocess.run(["buildah", "rmi", f"localhost/airflow-dupguard:{tag}"], capture_output=True, check=False)


@pytest.mark.timeout(1800)
def test_release_builds_every_artifact_with_checksums(dist: Path) -> None:
    files = sorted(p.relative_to(dist).as_posix() for p in dist.rglob("*") if p.is_file())
    tag = f"{VERSION}-{git(dist.parent, 'rev-parse', '--short=12', 'HEAD')}"  # the copy is not tagged
    assert files == [
        "SHA256SUMS",
        f"chart/dupguard-{VERSION}.tgz",
        f"image/airflow-dupguard-{tag}.oci.tar",
        f"python/airflow_dupguard-{VERSION}-py3-none-any.whl",
        f"python/airflow_dupguard-{VERSION}.tar.gz",
        f"python/airflow_dupguard_guard-{VERSION}-py3-none-any.whl",
        f"python/airflow_dupguard_guard-{VERSION}.tar.gz",
    ]
    check = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=dist, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert len(check.stdout.splitlines()) == len(files) - 1
    with tarfile.open(dist / "chart" / f"dupguard-{VERSION}.tgz") as chart:
        meta = yaml.safe_load(chart.extractfile("dupguard/Chart.yaml").read())  # type: ignore[union-attr]
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)


def image_name(dist: Path) -> str:
    (archive,) = (dist / "image").glob("*.oci.tar")
    return "localhost/airflow-dupguard:" + archive.name.removeprefix("airflow-dupguard-").removesuffix(".oci.tar")


def run_image(
    dist: Path, *args: str, env: tuple[str, ...] = (), entrypoint: str | None = None
) -> subprocess.CompletedProcess[str]:
    command = [*RUN_LOCAL, image_name(dist), *(f"--env={e}" for e in env)]
    if entrypoint:
        command.append(f"--entrypoint={entrypoint}")
    return subprocess.run([*command, "--", *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=300)


@pytest.mark.timeout(1800)
def test_the_image_runs_as_its_user_on_a_read_only_root(dist: Path) -> None:
    probe = run_image(
        dist, "-c", "id -u; id -g; touch /opt/dupguard/probe; touch /tmp/probe && echo tmp", entrypoint="/bin/sh"
    )
    assert probe.stdout.split() == ["10001", "10001", "tmp"], probe.stdout + probe.stderr
    assert "Read-only file system" in probe.stderr

    version = run_image(dist, "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"dupguard {VERSION}"), version.stderr

    config = run_image(
        dist, "check-config", env=("DUPGUARD_DATABASE_URL=postgresql://dupguard@airflow-db:5432/airflow",)
    )
    assert config.returncode == 0, config.stdout + config.stderr
    assert "database_url: 'postgresql+psycopg2://dupguard@airflow-db:5432/airflow'" in config.stdout
    assert "poll_interval: 5ms  # default" in config.stdout

    demo = run_image(dist, "demo")
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "would mark failed" in demo.stdout and "Demo database: /tmp/" in demo.stdout


@pytest.mark.timeout(1800)
def test_the_image_carries_its_oci_labels_and_user(dist: Path) -> None:
    inspected = subprocess.run(
        ["buildah", "inspect", "--type", "image", image_name(dist)], capture_output=True, text=True, check=True
    )
    config = json.loads(inspected.stdout)["OCIv1"]["config"]
    labels = config["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.revision"] == git(dist.parent, "rev-parse", "HEAD")
    assert labels["org.opencontainers.image.title"] == "airflow-dupguard"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["dupguard"]
