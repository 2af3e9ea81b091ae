"""The guard's own state, without Airflow (policy.py loaded from its file, as Airflow loads it): the
per-run decision cache and the advisory lock ids two schedulers must agree on."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.guard.mutants import SHIM
from tests.guard.support import POLICY, load_policy


def test_the_decision_cache_keeps_the_most_recent_runs_up_to_its_size() -> None:
    """A run's decision is cached for its later task instances (mapped ones expanded later, a new DAG
    version): a cache of 2 holds 2 decisions, and a third one evicts the least recently used, never
    the one just made."""
    guard = load_policy()._DupguardGuard(cache_size=2)
    guard._remember(("d", "r1"), "")
    guard._remember(("d", "r2"), "asset_triggered__kept")
    assert dict(guard._decisions) == {("d", "r1"): "", ("d", "r2"): "asset_triggered__kept"}
    guard._remember(("d", "r3"), "")
    assert list(guard._decisions) == [("d", "r2"), ("d", "r3")]
    guard._remember(("d", "r2"), "asset_triggered__kept")  # used again: now the most recent
    guard._remember(("d", "r4"), "")
    assert list(guard._decisions) == [("d", "r2"), ("d", "r4")]


PINNED_IDS = [
    (("orders_consumer",), -4698287078334788198),
    (("b",), -8748487260073429452),
    (("partitioned_consumer", "2026-11-30T05:00:00"), 4519015944494272258),
]


@pytest.mark.parametrize(("lock_key", "lock_id"), PINNED_IDS)
def test_the_advisory_lock_id_of_a_dag_and_key_is_pinned(lock_key: tuple[str, ...], lock_id: int) -> None:
    """Every scheduler must compute the same PostgreSQL advisory lock id for one (dag[, partition key]),
    whichever guard release it runs (a rolling upgrade runs two): the blake2b-64 digest of
    "dupguard\\0dag[\\0key]", signed big-endian, so it fits PostgreSQL's bigint. Pinned literally."""
    assert load_policy()._dupguard_lock_id(lock_key) == lock_id


# Airflow 3.0 still runs on Python 3.9 and 3.10, where int.from_bytes has no default byte order: the
# guard must load there and compute the same ids, or it fails open wherever it takes its lock.
OLD_PYTHONS = ("3.9", "3.10")
LOCK_IDS = "import importlib.util, sys\n" + (
    "spec = importlib.util.spec_from_file_location('dupguard_policy_under_test', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "for key in sys.argv[2:]:\n"
    "    print(module._dupguard_lock_id(tuple(key.split('|'))))\n"
)


def old_python(minor: str) -> Path | None:
    """A CPython ``minor`` interpreter: on PATH, or one of pyenv's (this machine has both)."""
    found = shutil.which(f"python{minor}")
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [found] if found else []
    candidates += [str(p) for p in sorted(pyenv.glob(f"{minor}.*/bin/python{minor}"))]
    for candidate in candidates:
        proc = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True)
        if proc.returncode == 0 and proc.stdout.decode().strip() == str(tuple(int(p) for p in minor.split("."))):
            return Path(candidate)
    return None


@pytest.mark.parametrize("minor", OLD_PYTHONS)
def test_the_advisory_lock_ids_are_the_same_on_the_pythons_airflow_3_0_runs_on(minor: str, tmp_path: Path) -> None:
    """policy.py loaded by Python 3.9 / 3.10 from its file computes the pinned ids of every Python."""
    python = old_python(minor)
    if python is None:
        pytest.skip(f"no Python {minor} interpreter here")
    # Under mutation (scripts/mutation_guard.py) policy.py imports mutmut's trampoline, not installed
    # for these interpreters: the mutation runner's stand-in (same dispatch) is put on their path.
    shim = tmp_path / "mutmut" / "mutation"
    shim.mkdir(parents=True)
    (shim.parent / "__init__.py").write_text("")
    (shim / "__init__.py").write_text("")
    (shim / "trampoline.py").write_text(SHIM)
    keys = [key for key, _ in PINNED_IDS]
    proc = subprocess.run(
        [str(python), "-c", LOCK_IDS, str(POLICY), *("|".join(key) for key in keys)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [int(line) for line in proc.stdout.split()] == [lock_id for _, lock_id in PINNED_IDS]
