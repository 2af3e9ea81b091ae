"""The in-scheduler guard (issue 6), run inside real Airflow 3.0.6, 3.1.2 and 3.2.2.

The checks run in each Airflow venv's own python (``tests/guard/driver.py``, Airflow's SQLAlchemy
1.4/2.0 next to the guard) against a fresh PostgreSQL database that Airflow migrated itself; this
repo-venv side only prepares the databases, the snippet and the wheel, and asserts on the JSON the
driver writes. Runs are created only by Airflow's scheduler code (``SchedulerJobRunner
._create_dagruns_for_dags`` in two threads, the race generators of scripts/airflow/).

All Airflow processes start on first use (about 8 processes of ~20-30 s, two at a time).
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from detector.guard_cli import print_local_settings
from tests.guard.support import ROOT, build_guard_site
from tests.pg import admin_url, database_url, execute_admin

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(1200)]

DRIVER = ROOT / "tests" / "guard" / "driver.py"
ASSET_VERSIONS = ("3.0.6", "3.1.2")
NOTE = "dupguard guard skipped this run as a duplicate of {kept} (HA scheduler race, apache/airflow#54491)"

# (version, mode, scenarios): one Airflow process each.
PLAN: list[tuple[str, str, tuple[str, ...]]] = [
    *[(v, "none", ("race",)) for v in ASSET_VERSIONS],
    *[(v, "local-settings", ("race", "broken-python", "broken-sql", "ordinary")) for v in ASSET_VERSIONS],
    *[(v, "entry-point", ("race",)) for v in ASSET_VERSIONS],
    ("3.2.2", "none", ("partitioned-serial",)),
    ("3.2.2", "local-settings", ("partitioned-serial", "partitioned-overlap")),
]


def clean_env() -> dict[str, str]:
    """This environment without anything that would point Airflow or Python elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DUPGUARD_"))}


def airflow_python(version: str) -> Path:
    python = ROOT / ".airflow-venvs" / version / "bin" / "python"
    if not python.is_file():
        pytest.fail(f"Airflow {version} venv missing ({python}): run scripts/airflow/venv.sh {version}")
    return python


@dataclass
class Runs:
    """Results of every PLAN entry, keyed by (version, mode); failures keep the driver's stderr."""

    results: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)

    def get(self, version: str, mode: str) -> dict[str, Any]:
        if (version, mode) in self.errors:
            pytest.fail(f"driver failed for Airflow {version} mode {mode}:\n{self.errors[(version, mode)]}")
        return self.results[(version, mode)]


def migrate_template(version: str, work: Path) -> str:
    """A database migrated by Airflow `version` itself (`airflow db migrate`), used as a template."""
    name = f"guard_tpl_{version.replace('.', '_')}_{uuid.uuid4().hex[:6]}"
    execute_admin(f'CREATE DATABASE "{name}"')
    url = database_url(name).replace("postgresql://", "postgresql+psycopg2://", 1)
    home = work / f"migrate-{version}"
    home.mkdir()
    env = {
        **clean_env(),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS": "False",
    }
    proc = subprocess.run(
        [str(airflow_python(version)), "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"airflow {version} db migrate failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return name


@pytest.fixture(scope="session")
def guard_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("guard")


@pytest.fixture(scope="session")
def guard_site(guard_work: Path) -> Path:
    return build_guard_site(guard_work)


@pytest.fixture(scope="session")
def runs(guard_work: Path, guard_site: Path) -> Iterator[Runs]:
    """Every PLAN entry, run once per test session, two Airflow processes at a time."""
    for version in {v for v, _, _ in PLAN}:
        airflow_python(version)
    admin_url()
    snippet = guard_work / "airflow_local_settings.py"
    snippet.write_text(print_local_settings())
    databases: list[str] = []
    out = Runs()
    try:
        with ThreadPoolExecutor(3) as pool:
            templates = dict(
                zip(
                    sorted({v for v, _, _ in PLAN}),
                    pool.map(lambda v: migrate_template(v, guard_work), sorted({v for v, _, _ in PLAN})),
                    strict=True,
                )
            )
        databases += templates.values()

        def one(entry: tuple[str, str, tuple[str, ...]]) -> None:
            version, mode, scenarios = entry
            db = f"guard_{uuid.uuid4().hex[:10]}"
            execute_admin(f'CREATE DATABASE "{db}" TEMPLATE "{templates[version]}"')
            databases.append(db)
            result = guard_work / f"{version}-{mode}.json"
            cmd = [
                str(airflow_python(version)),
                str(DRIVER),
                "--scenarios",
                ",".join(scenarios),
                "--mode",
                mode,
                "--local-settings",
                str(snippet),
                "--site",
                str(guard_site),
                "--db-url",
                database_url(db),
                "--out",
                str(result),
            ]
            if mode == "none" and version in ASSET_VERSIONS:
                cmd += ["--snippet-names", str(snippet)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=clean_env())
            if proc.returncode != 0 or not result.is_file():
                out.errors[(version, mode)] = proc.stderr[-6000:]
            else:
                out.results[(version, mode)] = json.loads(result.read_text())

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(one, PLAN))
        yield out
    finally:
        for db in databases:
            execute_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')


def states(run: dict[str, Any]) -> set[str | None]:
    return {ti["state"] for ti in run["tis"]}


def race_pair(result: dict[str, Any], scenario: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(first run, duplicate) of a race: the one scheduler-a made, the one scheduler-b made."""
    jobs = result["job_ids"]
    asset_runs = [r for r in result[scenario]["runs"] if r["run_type"] == "asset_triggered"]
    (first,) = [r for r in asset_runs if r["creating_job_id"] == jobs["scheduler-a"]]
    (dup,) = [r for r in asset_runs if r["creating_job_id"] == jobs["scheduler-b"]]
    return first, dup


# 3.0 / 3.1: the DagModel-lock race ------------------------------------------------------------------


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_without_guard_both_runs_are_schedulable(runs: Runs, version: str) -> None:
    """Without the guard the race yields two runs of one trigger, every task instance runnable (NULL)."""
    result = runs.get(version, "none")
    assert result["policy"] == {"guard_module": None, "hookimpls": [], "is_noop": True}
    first, dup = race_pair(result, "race")
    assert first["run_after"] == dup["run_after"] and first["event_ids"] == dup["event_ids"] != []
    assert first["id"] < dup["id"]
    assert states(first) == states(dup) == {None}
    assert first["note"] is None and dup["note"] is None


@pytest.mark.parametrize("mode", ["local-settings", "entry-point"])
@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_creates_the_duplicate_skipped_and_leaves_the_first_run(runs: Runs, version: str, mode: str) -> None:
    """With the guard (either install route) the duplicate's task instances, mapped ones included,
    are SKIPPED from creation, with a run note naming the kept run; the first run is untouched; one
    query per new run."""
    result = runs.get(version, mode)
    assert result["policy"]["is_noop"] is False, "Airflow would not call the hook in verify_integrity"
    assert result["policy"]["guard_module"] == {"local-settings": "airflow_local_settings"}.get(
        mode, "dupguard_guard.policy"
    )
    first, dup = race_pair(result, "race")
    assert first["run_after"] == dup["run_after"] and first["id"] < dup["id"]
    assert states(first) == {None}, "the first run is untouched"
    assert first["note"] is None
    assert states(dup) == {"skipped"}
    assert sorted((t["task_id"], t["map_index"]) for t in dup["tis"]) == [
        ("extract", -1),
        ("fan", 0),
        ("fan", 1),
        ("fan", 2),
        ("load", -1),
    ]
    assert all(t["try_number"] == 0 for t in dup["tis"])
    assert dup["note"] == NOTE.format(kept=first["run_id"])
    assert dup["event_ids"] == first["event_ids"], "Airflow still records what the duplicate consumed"
    assert result["race"]["guard_queries"] == 2, "one lookup per new asset run, none per task instance"


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_cleared_duplicate_is_not_skipped_again(runs: Runs, version: str) -> None:
    """Clearing the guarded duplicate by hand makes its task instances runnable: the guard only acts
    on brand-new task instances, never on existing rows."""
    result = runs.get(version, "local-settings")
    jobs = result["job_ids"]
    (dup,) = [r for r in result["race"]["after_clear"] if r["creating_job_id"] == jobs["scheduler-b"]]
    assert states(dup) == {None}


@pytest.mark.parametrize("scenario", ["broken-python", "broken-sql"])
@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_a_failing_guard_leaves_run_creation_alone(runs: Runs, version: str, scenario: str) -> None:
    """A guard whose lookup raises (Python) or fails in PostgreSQL inside the scheduler's transaction
    fails open: both runs are created with untouched task instances and their consumed events, no
    note; the failing lookup is tried once per run, not once per task instance."""
    result = runs.get(version, "local-settings")
    first, dup = race_pair(result, scenario)
    assert states(first) == states(dup) == {None}
    assert len(first["tis"]) == len(dup["tis"]) == 5
    assert first["event_ids"] == dup["event_ids"] != []
    assert first["note"] is None and dup["note"] is None
    if scenario == "broken-sql":
        assert result[scenario]["guard_queries"] == 2


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_failure_is_logged_once_then_rate_limited(runs: Runs, version: str) -> None:
    """The first failure logs one warning with its traceback; the next ones (within 5 minutes) none."""
    result = runs.get(version, "local-settings")
    (record,) = result["broken-python"]["guard_logs"]
    assert record["level"] == "WARNING" and record["traceback"] is True
    assert "task instances left untouched" in record["message"]
    assert result["broken-sql"]["guard_logs"] == []


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_ignores_ordinary_runs(runs: Runs, version: str) -> None:
    """Scheduled and manual runs, successive asset runs made by alternating schedulers and a cleared
    asset run keep every task instance runnable; only asset runs cost a lookup."""
    result = runs.get(version, "local-settings")
    ordinary = result["ordinary"]["runs"]
    kinds = sorted(r["run_type"] for r in ordinary)
    assert kinds == ["asset_triggered"] * 3 + ["manual"] * 2 + ["scheduled"]
    for run in ordinary:
        assert "skipped" not in states(run), run
        assert run["note"] is None
    assert len({r["run_after"] for r in ordinary if r["run_type"] == "asset_triggered"}) == 3
    assert result["ordinary"]["guard_queries"] == 3


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_snippet_names_do_not_clobber_airflow_settings(runs: Runs, version: str) -> None:
    """Airflow copies every airflow_local_settings name into airflow.settings: the snippet's names
    that Airflow's settings module also has are the very same objects (modules, typing names)."""
    names = runs.get(version, "none")["snippet_names"]
    assert "task_instance_mutation_hook" in names["names"]
    different = [n for n, same in names["collisions"].items() if not same]
    assert names["collisions"] and not different, different
    assert all(
        n.startswith(("_dupguard", "_DUPGUARD", "_Dupguard")) or n in names["collisions"] or n in ALLOWED_NEW_NAMES
        for n in names["names"]
    ), names["names"]


ALLOWED_NEW_NAMES = {"task_instance_mutation_hook", "annotations", "OrderedDict", "threading", "time", "logging"}


# 3.2: partitioned ------------------------------------------------------------------------------------


def partition_pair(result: dict[str, Any], scenario: str) -> tuple[dict[str, Any], dict[str, Any]]:
    jobs = result["job_ids"]
    (first,) = [r for r in result[scenario]["runs"] if r["creating_job_id"] == jobs["scheduler-a"]]
    (second,) = [r for r in result[scenario]["runs"] if r["creating_job_id"] == jobs["scheduler-b"]]
    assert first["partition_key"] == second["partition_key"] and first["event_ids"] == second["event_ids"] != []
    assert first["id"] < second["id"]
    return first, second


def test_partitioned_without_guard_both_runs_are_schedulable(runs: Runs) -> None:
    """3.2.2, no guard: both schedulers read the pending partition row, B creates its run after A
    committed: two runs of one partition_key with the same events, all task instances runnable."""
    result = runs.get("3.2.2", "none")
    first, second = partition_pair(result, "partitioned-serial")
    assert states(first) == states(second) == {None}


def test_partitioned_guard_skips_when_the_first_run_is_committed(runs: Runs) -> None:
    """3.2.2 with the guard, B creating its run after A committed: B's task instances are SKIPPED,
    with the note; A is untouched. Airflow then points the partition row at B (the later writer)."""
    result = runs.get("3.2.2", "local-settings")
    assert all(states(r) == {None} for r in result["ordinary_runs"])
    first, second = partition_pair(result, "partitioned-serial")
    assert states(first) == {None} and first["note"] is None
    assert states(second) == {"skipped"}
    assert second["note"] == NOTE.format(kept=first["run_id"])
    assert second["id"] in result["partitioned-serial"]["apdr_pointers"].values()
    assert result["partitioned-serial"]["guard_queries"] == 2


def test_partitioned_guard_cannot_see_an_uncommitted_first_run(runs: Runs) -> None:
    """3.2.2 with the guard, B creating its run while A's run is not committed yet (the two creators
    are not serialised on 3.2): the guard sees nothing and both runs keep runnable task instances.
    Observed outcome, stated as it is: this case is left to the sidecar."""
    result = runs.get("3.2.2", "local-settings")
    first, second = partition_pair(result, "partitioned-overlap")
    assert states(first) == states(second) == {None}
    assert first["note"] is None and second["note"] is None
