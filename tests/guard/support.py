"""Shared by the guard tests: where the guard lives and how its package is built."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "detector" / "guard" / "policy.py"
GUARD_PACKAGE = ROOT / "deploy" / "airflow-guard"


def build_guard_site(work: Path) -> Path:
    """The airflow-dupguard-guard wheel, built from deploy/airflow-guard and unpacked as site-packages."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is needed to build deploy/airflow-guard (pip install uv)")
    dist = work / "dist"
    proc = subprocess.run([uv, "build", "--wheel", str(GUARD_PACKAGE), "-o", str(dist)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"building deploy/airflow-guard failed:\n{proc.stderr[-3000:]}")
    (wheel,) = dist.glob("*.whl")
    site = work / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site
