"""Shared by the guard tests: where the guard lives and how its package is built."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "detector" / "guard" / "policy.py"
GUARD_PACKAGE = ROOT / "deploy" / "airflow-guard"


def load_policy() -> ModuleType:
    """policy.py loaded from its file, as Airflow loads it (runs its module-level code: no Airflow needed)."""
    spec = importlib.util.spec_from_file_location("dupguard_policy_under_test", POLICY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def pip_installed_airflow(work: Path, version: str, wheel_dir: Path) -> Path:
    """A clean Airflow ``version`` venv (from constraints/, uv's cache makes it ~5 s) into which the
    guard is installed the way a user does it on a managed platform: ``pip install -r
    requirements.txt`` naming the built wheel. Nothing else is set up (no airflow_local_settings).
    Returns the venv's python."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is needed to create the clean Airflow venv (pip install uv)")
    venv = work / f"airflow-{version}-pip"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    python = sys.executable if sys.version_info[:2] == (3, 11) else shutil.which("python3.11") or sys.executable
    steps = [
        [uv, "venv", "-q", "--seed", "--python", python, str(venv)],
        [uv, "pip", "install", "-q", "-c", str(ROOT / "constraints" / f"airflow-{version}.txt"),
         f"apache-airflow=={version}", "psycopg2-binary", "asyncpg"],
    ]  # fmt: skip
    for cmd in steps:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd[:3])} failed:\n{proc.stderr[-3000:]}")
    (wheel,) = wheel_dir.glob("*.whl")
    requirements = work / "requirements.txt"
    requirements.write_text(f"airflow-dupguard-guard @ {wheel.resolve().as_uri()}\n")
    pip_env = {k: v for k, v in env.items() if k != "VIRTUAL_ENV"} | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-r", str(requirements)], capture_output=True, text=True, env=pip_env
    )
    if proc.returncode != 0:
        pytest.fail(f"pip install -r requirements.txt failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return venv / "bin" / "python"
