"""The in-scheduler guard (docs/how-to/guard.md), run inside real Airflow 3.0.6, 3.1.2 and 3.2.2.

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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from detector.app.guard_cli import print_local_settings
from detector.app.scan import scan
from detector.core.plan import Mode, Outcome, plan
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from tests.guard.support import ROOT, build_guard_site, pip_installed_airflow
from tests.pg import admin_url, database_url, drop_databases, execute_admin

pytestmark = [pytest.mark.airflow, pytest.mark.timeout(1200)]

DRIVER = ROOT / "tests" / "guard" / "driver.py"
ASSET_VERSIONS = ("3.0.6", "3.1.2")
NOTE = "dupguard guard skipped this run as a duplicate of {kept} (HA scheduler race, apache/airflow#54491)"
SKIP_WARNING = (
    "dupguard guard: creating run {run} of {dag} with every task skipped: duplicate of {kept} "
    "(HA scheduler race, apache/airflow#54491)"
)


@dataclass(frozen=True)
class Entry:
    """One Airflow process: its version, how the guard is installed, its scenarios, extra driver args."""

    version: str
    key: str  # what the tests ask for (version, key)
    mode: str
    scenarios: tuple[str, ...]
    args: tuple[str, ...] = ()


PLAN: list[Entry] = [
    *[Entry(v, "none", "none", ("race", "overlap", "metrics")) for v in ASSET_VERSIONS],
    *[
        Entry(
            v,
            "local-settings",
            "local-settings",
            (
                "race",
                "broken-python",
                "broken-sql",
                "ordinary",
                "overlap",
                "disjoint",
                "broken-finish",
                "broken-note",
                "small-cache",
                "race-again",
                "metrics",
                "notasks",
                "empty-window-race",
                "empty-window-lookalike",
                "alias-race",
                # 3.0 consumes no asset-alias events (scheduler_job_runner.py reads scheduled assets only)
                *(() if v == "3.0.6" else ("alias-overlap",)),
                "late-event",
                "second-consumer",
                "race-three",
                "bounds",
                "mapped-later",
                "mapped-later-cold",
            ),
        )
        for v in ASSET_VERSIONS
    ],
    *[Entry(v, "entry-point", "entry-point", ("race",)) for v in ASSET_VERSIONS],
    # [scheduler] use_row_level_locking = False; then Airflow's own scheduling loop (callbacks).
    *[
        Entry(
            v, "no-row-locking", "local-settings", ("unlocked", "unlocked-inverted", "callback"), ("--no-row-locking",)
        )
        for v in ASSET_VERSIONS
    ],
    # A clean 3.1.2 venv (what a managed platform allows) with the wheel pip-installed, no airflow_local_settings.
    Entry("3.1.2", "pip-installed", "installed", ("race", "overlap")),
    Entry("3.2.2", "none", "none", ("partitioned-serial", "partitioned-overlap")),
    # 3.3 locks both run-creation paths itself: the guard, installed, must do nothing there.
    Entry("3.3.2", "local-settings", "local-settings", ("partitioned-serial",)),
    # ... and installed from the wheel it leaves Airflow's is_noop alone there.
    Entry("3.3.2", "entry-point", "entry-point", ("partitioned-serial",)),
    Entry(
        "3.2.2",
        "local-settings",
        "local-settings",
        (
            "partitioned-serial",
            "partitioned-overlap",
            "partitioned-timeout",
            "partitioned-stress",
            "partitioned-inverted",
            "partitioned-late-event",
            "partitioned-again",
            "partitioned-two-keys",
            "partitioned-fresh-and-raced",
        ),
    ),
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
    databases: dict[tuple[str, str], str] = field(default_factory=dict)  # kept until the session ends

    held: bool = False  # loaded from DUPGUARD_GUARD_RESULTS: entries not in it are skipped

    def get(self, version: str, mode: str) -> dict[str, Any]:
        if self.held and (version, mode) not in self.results:
            pytest.skip(f"Airflow {version} {mode}: not in {HELD_RESULTS}")
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


# tests/guard/mutants.py judges each mutant's results with these tests: a JSON list of entries
# {version, key, result (the driver's JSON file), database (the Airflow database it left)}.
HELD_RESULTS = "DUPGUARD_GUARD_RESULTS"


def held_runs(path: Path) -> Runs:
    out = Runs(held=True)
    for entry in json.loads(path.read_text()):
        key = (entry["version"], entry["key"])
        out.results[key] = json.loads(Path(entry["result"]).read_text())
        out.databases[key] = entry["database"]
    return out


@pytest.fixture(scope="session")
def runs(request: pytest.FixtureRequest, guard_work: Path) -> Iterator[Runs]:
    """Every PLAN entry, run once per test session, two Airflow processes at a time."""
    if os.environ.get(HELD_RESULTS):
        yield held_runs(Path(os.environ[HELD_RESULTS]))
        return
    guard_site: Path = request.getfixturevalue("guard_site")
    versions = sorted({e.version for e in PLAN})
    for version in versions:
        airflow_python(version)
    admin_url()
    snippet = guard_work / "airflow_local_settings.py"
    snippet.write_text(print_local_settings())
    databases: list[str] = []
    out = Runs()
    try:
        with ThreadPoolExecutor(3) as pool:
            pip_python = pool.submit(pip_installed_airflow, guard_work, "3.1.2", guard_work / "dist")
            templates = dict(zip(versions, pool.map(lambda v: migrate_template(v, guard_work), versions), strict=True))
        databases += templates.values()

        def one(entry: Entry) -> None:
            db = f"guard_{uuid.uuid4().hex[:10]}"
            execute_admin(f'CREATE DATABASE "{db}" TEMPLATE "{templates[entry.version]}"')
            databases.append(db)
            out.databases[(entry.version, entry.key)] = db
            result = guard_work / f"{entry.version}-{entry.key}.json"
            python = pip_python.result() if entry.mode == "installed" else airflow_python(entry.version)
            cmd = [
                str(python),
                str(DRIVER),
                "--scenarios",
                ",".join(entry.scenarios),
                "--mode",
                entry.mode,
                "--local-settings",
                str(snippet),
                "--site",
                str(guard_site),
                "--db-url",
                database_url(db),
                "--out",
                str(result),
                *entry.args,
            ]
            if entry.mode == "none" and entry.version in ASSET_VERSIONS:
                cmd += ["--snippet-names", str(snippet)]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=clean_env())
            if proc.returncode != 0 or not result.is_file():
                out.errors[(entry.version, entry.key)] = proc.stderr[-6000:]
            else:
                out.results[(entry.version, entry.key)] = json.loads(result.read_text())

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(one, PLAN))
        yield out
    finally:
        drop_databases(databases)


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
    assert dup["state"] == "success" and first["state"] == "queued", "the duplicate is created finished"
    # Started and ended at once: without a start_date Airflow's API answers 500 for every event the
    # duplicate consumed, the kept run's too (apache/airflow#71360), and the REST source never judges them.
    assert dup["start_date"] is not None and dup["start_date"] == dup["end_date"]
    assert dup["api_serialisable"] is True
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
    # A's lookup: one small query that finds nothing; B's: that query finds A, then the event check.
    assert result["race"]["guard_statements"] == 3


def test_guard_skips_the_overlap_duplicate_on_an_alias_scheduled_dag(runs: Runs) -> None:
    """3.1 consumes a DAG's asset-alias events too (``AssetEvent.source_aliases``): the overlap race
    on a DAG scheduled on an alias. B read the queue after the alias's first event only and consumes
    it again; A consumed both: B is skipped, naming A. The event through another DAG's alias, in B's
    window, is none of this DAG's. (3.0 consumes no alias events at all: not run there.)"""
    result = runs.get("3.1.2", "local-settings")
    out = result["alias-overlap"]
    first, dup = race_pair(result, "alias-overlap")
    e1, e2 = out["events"]
    assert dup["run_after"] < first["run_after"]
    assert first["event_ids"] == sorted([e1, e2]) and dup["event_ids"] == [e1]
    assert out["other_event"] not in first["event_ids"] + dup["event_ids"]
    assert states(first) == {None} and first["note"] is None
    assert states(dup) == {"skipped"} and dup["note"] == NOTE.format(kept=first["run_id"])


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_skips_the_exact_duplicate_on_an_alias_scheduled_dag(runs: Runs, version: str) -> None:
    """The exact race on a DAG scheduled on an asset alias: both runs made from one queue read, the
    same run_after and the same consumed events (the alias's event on 3.1; none on 3.0, which reads
    scheduled assets only): B is skipped, naming A. On 3.0 the guard once counted the alias's events
    there too, which no 3.0 run consumes, and let this duplicate through."""
    result = runs.get(version, "local-settings")
    out = result["alias-race"]
    first, dup = race_pair(result, "alias-race")
    assert first["run_after"] == dup["run_after"] and first["id"] < dup["id"]
    assert first["event_ids"] == dup["event_ids"] == ([] if version == "3.0.6" else [out["event"]])
    assert states(first) == {None} and first["note"] is None
    assert states(dup) == {"skipped"} and dup["note"] == NOTE.format(kept=first["run_id"])


def late_row_runs(result: dict[str, Any], scenario: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the run scheduler-c made while the late producer's transaction was open, the other asset runs)."""
    jobs = set(result["job_ids"].values())
    asset_runs = [r for r in result[scenario]["runs"] if r["run_type"] == "asset_triggered"]
    (made_meanwhile,) = [r for r in asset_runs if r["creating_job_id"] not in jobs]
    return made_meanwhile, [r for r in asset_runs if r is not made_meanwhile]


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_skips_the_exact_duplicate_whose_event_window_is_empty(runs: Runs, version: str) -> None:
    """The exact race on runs that consume no event: their trigger, a producer's queue row committed
    after run P was made, has an event timestamped before P's run_after, so their window (P's
    run_after, run_after] is empty. Same run_after from the same queue row: B is skipped, naming A
    (not the manual run with that very run_after, which no asset event made)."""
    result = runs.get(version, "local-settings")
    out = result["empty-window-race"]
    made_meanwhile, _ = late_row_runs(result, "empty-window-race")
    first, dup = race_pair(result, "empty-window-race")
    (manual,) = [r for r in out["runs"] if r["run_type"] == "manual"]
    assert made_meanwhile["event_ids"] == [out["p_event"]] and made_meanwhile["run_after"] < first["run_after"]
    assert first["run_after"] == dup["run_after"] == manual["run_after"] and manual["id"] < first["id"]
    assert first["event_ids"] == dup["event_ids"] == [], "the window is empty"
    assert all(out["late_event"] not in r["event_ids"] for r in out["runs"])
    assert states(first) == {None} and first["note"] is None
    assert states(dup) == {"skipped"} and dup["note"] == NOTE.format(kept=first["run_id"])


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_lets_a_run_with_an_empty_window_through(runs: Runs, version: str) -> None:
    """No race: A (a later run_after) was made while the late producer's queue row was written but
    not committed; B, made from that row afterwards, is its only run: an earlier run_after than A's
    and an empty window, so nothing ties it to A. Not a duplicate: both stay runnable."""
    result = runs.get(version, "local-settings")
    out = result["empty-window-lookalike"]
    made_meanwhile, others = late_row_runs(result, "empty-window-lookalike")
    jobs = result["job_ids"]
    (a,) = [r for r in others if r["creating_job_id"] == jobs["scheduler-a"]]
    (b,) = [r for r in others if r["creating_job_id"] == jobs["scheduler-b"]]
    assert made_meanwhile["run_after"] < b["run_after"] < a["run_after"] and a["id"] < b["id"]
    assert made_meanwhile["event_ids"] == [out["p_event"]] and a["event_ids"] == [out["a_event"]]
    assert b["event_ids"] == [], "the window is empty"
    assert states(a) == states(b) == {None}
    assert a["note"] is None and b["note"] is None and b["state"] == "queued"


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_skips_the_duplicate_on_a_dag_that_ran_before(runs: Runs, version: str) -> None:
    """The race on a DAG with an earlier asset run: the runs consume only the events after that
    run's run_after; the duplicate is skipped although the earlier event was consumed by neither."""
    result = runs.get(version, "local-settings")
    out = result["race-again"]
    first, dup = race_pair(result, "race-again")
    (earlier,) = [r for r in out["runs"] if r["creating_job_id"] not in result["job_ids"].values()]
    assert earlier["run_after"] < first["run_after"] == dup["run_after"]
    assert earlier["event_ids"] and not set(earlier["event_ids"]) & set(first["event_ids"])
    assert first["event_ids"] == dup["event_ids"] != []
    assert states(earlier) == states(first) == {None}
    assert states(dup) == {"skipped"} and dup["note"] == NOTE.format(kept=first["run_id"])


@pytest.mark.parametrize("scenario", ["mapped-later", "mapped-later-cold"])
@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_a_mapped_task_expanded_after_the_runs_creation_is_left_alone(runs: Runs, version: str, scenario: str) -> None:
    """A task mapped over its upstream's XCom is expanded by Airflow's scheduling loop in
    a later session than the runs' creation. The guard acts only in a run's creating transaction:
    the cleared duplicate runs as asked (its expanded task instances are scheduled exactly like the
    kept run's, nothing skipped), it is not finished again and keeps its one note, and nothing is
    logged; with the decision cache emptied (the other scheduler's process) each run is looked up
    once more and then left alone."""
    result = runs.get(version, "local-settings")
    out = result[scenario]
    jobs = result["job_ids"]

    def pair(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
        (first,) = [r for r in rows if r["creating_job_id"] == jobs["scheduler-a"]]
        (dup,) = [r for r in rows if r["creating_job_id"] == jobs["scheduler-b"]]
        return first, dup

    created_first, created_dup = pair(out["created"])
    assert states(created_first) == {None}
    assert states(created_dup) == {"skipped"} and created_dup["state"] == "success", "the race was guarded"
    first, dup = pair(out["runs"])

    def schedule(run: dict[str, Any]) -> list[tuple[str, int, str | None]]:
        return [(t["task_id"], t["map_index"], t["state"]) for t in run["tis"]]

    assert [(t, i) for t, i, _ in schedule(first) if t == "fan"] == [("fan", 0), ("fan", 1), ("fan", 2)]
    assert schedule(dup) == schedule(first), "the cleared duplicate is scheduled like the kept run"
    assert "skipped" not in states(first)
    assert first["state"] == dup["state"] == "running" and dup["end_date"] is None
    assert first["note"] is None and dup["note"] == NOTE.format(kept=first["run_id"])
    assert out["guard_logs"] == []
    assert out["guard_calls"] == (2 if scenario == "mapped-later-cold" else 0)


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
def test_a_failure_while_finishing_the_duplicate_leaves_no_note(runs: Runs, version: str) -> None:
    """Airflow's own ``DagRun.set_state`` raises when the guard finishes the duplicate,
    after it changed the run. The guard fails open all or nothing: the duplicate is created as
    Airflow made it (queued, no dates, every task instance runnable) and carries no note, so the
    sidecar does not call it prevented but plans to stop it like any duplicate."""
    result = runs.get(version, "local-settings")
    first, dup = race_pair(result, "broken-finish")
    assert dup["note"] is None, "a note on a run that goes ahead makes the sidecar report it prevented"
    assert (dup["state"], dup["start_date"], dup["end_date"]) == ("queued", None, None)
    assert states(first) == states(dup) == {None} and len(dup["tis"]) == 5
    assert first["note"] is None and first["state"] == "queued"
    assert first["event_ids"] == dup["event_ids"] != []
    assert daemon_outcomes(runs, version, "local-settings")[dup["run_id"]] is Outcome.REMEDIATE
    # The error logged is Airflow's, not one raised while putting the run back.
    errors = [log["error"] for log in result["broken-finish"]["guard_logs"]]
    assert errors == ["RuntimeError: forced failure in DagRun.set_state"]


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_a_failure_while_adding_the_note_puts_the_finished_duplicate_back(runs: Runs, version: str) -> None:
    """Adding the note raises after the guard finished the duplicate (state success, start and end
    dates set): the run is put back as Airflow made it (queued, no dates, task instances runnable),
    with no note, and the error logged is that failure."""
    result = runs.get(version, "local-settings")
    first, dup = race_pair(result, "broken-note")
    assert (dup["state"], dup["start_date"], dup["end_date"], dup["note"]) == ("queued", None, None, None)
    assert states(first) == states(dup) == {None} and len(dup["tis"]) == 5
    errors = [log["error"] for log in result["broken-note"]["guard_logs"]]
    assert errors == ["RuntimeError: forced failure while adding the note"]


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_a_duplicate_decided_again_in_its_transaction_gets_one_note(runs: Runs, version: str) -> None:
    """With a decision cache that holds no run, every task instance of a run is decided again in the
    creating transaction (one lookup each): the duplicate is still skipped with one note, its
    creation does not fail, and the first run is untouched."""
    result = runs.get(version, "local-settings")
    first, dup = race_pair(result, "small-cache")
    assert states(first) == {None} and first["note"] is None
    assert states(dup) == {"skipped"} and dup["state"] == "success"
    assert dup["note"] == NOTE.format(kept=first["run_id"])
    assert result["small-cache"]["guard_queries"] == 10, "each of the 2 x 5 task instances decided"


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_installing_the_guard_changes_airflows_task_instance_created_counter(runs: Runs, version: str) -> None:
    """Pinned (docs/how-to/guard.md, "Side effect on Airflow's metrics"): registering a
    task_instance_mutation_hook clears its ``is_noop``, and ``DagRun.verify_integrity`` then counts
    ``task_instance_created`` per task instance instead of per task. One run of a DAG whose task
    ``fan`` is mapped over three literals: PythonOperator 1 without the guard, 3 with it; the same
    five task instances either way. On every DAG, not only asset-triggered ones."""
    plain, guarded = runs.get(version, "none"), runs.get(version, "local-settings")
    assert plain["policy"]["is_noop"] is True and guarded["policy"]["is_noop"] is False
    assert plain["metrics"]["task_instance_created"] == {"EmptyOperator": 2, "PythonOperator": 1}
    assert guarded["metrics"]["task_instance_created"] == {"EmptyOperator": 2, "PythonOperator": 3}
    assert plain["metrics"]["task_instances"] == guarded["metrics"]["task_instances"] == 5


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_the_guard_never_sees_a_consumer_dag_without_tasks(runs: Runs, version: str) -> None:
    """As docs/how-to/guard.md says under "What it does not cover": the hook runs per task instance, so a
    race on a consumer DAG without tasks never reaches the guard: both runs are created queued with
    no note, Airflow's scheduling loop finishes both and sends the DAG callback for each, the
    duplicate's too. The sidecar finds the pair and plans to stop the duplicate."""
    result = runs.get(version, "local-settings")
    out = result["notasks"]
    assert out["guard_calls"] == 0
    first, dup = race_pair({**result, "notasks": {"runs": out["runs"]}}, "notasks")
    assert first["run_after"] == dup["run_after"] and first["event_ids"] == dup["event_ids"] != []
    assert (first["state"], dup["state"]) == ("queued", "queued") and first["tis"] == dup["tis"] == []
    assert first["note"] is None and dup["note"] is None
    assert {r["run_id"]: r["state"] for r in out["after_scheduling"]} == {
        first["run_id"]: "success",
        dup["run_id"]: "success",
    }
    assert sorted(c["run_id"] for c in out["callbacks"]) == sorted([first["run_id"], dup["run_id"]])
    assert daemon_outcomes(runs, version, "local-settings").get(dup["run_id"]) is Outcome.REMEDIATE


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
    assert result["ordinary"]["guard_statements"] == 3, "one small query per ordinary asset run, as before"


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
    assert second["state"] == "success"
    assert second["id"] in result["partitioned-serial"]["apdr_pointers"].values()
    assert result["partitioned-serial"]["guard_queries"] == 2
    # What the scheduler's log says about it, word for word (operators search for it), and the count.
    dag_id = second["dag_id"]
    warning = SKIP_WARNING.format(run=second["run_id"], dag=dag_id, kept=first["run_id"])
    assert [log["message"] for log in result["guard_logs"]].count(warning) == 1
    assert result["partitioned-serial"]["guard_after"]["skipped_runs"] == 1


def test_partitioned_guard_leaves_an_asset_run_without_partition_alone(runs: Runs) -> None:
    """3.2.2: an ordinary asset run of a DAG scheduled on a plain asset (Airflow 3.2 locks that path
    itself): the guard runs no lookup and logs nothing; the run is as Airflow made it."""
    out = runs.get("3.2.2", "local-settings")["asset_run"]
    (run,) = out["runs"]
    assert run["run_type"] == "asset_triggered" and run["partition_key"] is None and run["event_ids"] != []
    assert states(run) == {None} and run["note"] is None and run["state"] == "queued"
    assert out["guard_queries"] == 0
    assert out["guard_logs"] == [], "no guard error"


def test_partitioned_guard_lets_a_run_with_a_late_event_through(runs: Runs) -> None:
    """3.2.2: both schedulers read the pending row; an event for the same partition key is
    committed after A read the row's events and before A committed, so Airflow adds it to that
    same row. A consumed only the first event; B (after A's commit) consumes both. Not a duplicate:
    skipping B would leave the late event run by no run. Both keep runnable task instances."""
    result = runs.get("3.2.2", "local-settings")
    out = result["partitioned-late-event"]
    jobs = result["job_ids"]
    (first,) = [r for r in out["runs"] if r["creating_job_id"] == jobs["scheduler-a"]]
    (second,) = [r for r in out["runs"] if r["creating_job_id"] == jobs["scheduler-b"]]
    assert first["partition_key"] == second["partition_key"] and first["id"] < second["id"]
    assert first["event_ids"] == [out["race_event_id"]]
    assert second["event_ids"] == sorted([out["race_event_id"], out["late_event_id"]])
    assert states(first) == states(second) == {None}
    assert first["note"] is None and second["note"] is None
    assert second["state"] == "queued"
    # The late event was consumed before B decided, by A's run of a second consumer of the asset
    # (committed with A's): B's twin must be a run that consumed it, not any run.
    (other,) = [r for r in out["late_consumer_runs"] if r["creating_job_id"] == jobs["scheduler-a"]]
    assert out["late_event_id"] in other["event_ids"] and out["race_event_id"] in other["event_ids"]


def test_partitioned_without_guard_overlapping_creators_both_run(runs: Runs) -> None:
    """3.2.2, no guard, B creating its run while A's run is not committed yet: two runnable runs."""
    first, second = partition_pair(runs.get("3.2.2", "none"), "partitioned-overlap")
    assert states(first) == states(second) == {None}


def test_partitioned_guard_serialises_overlapping_creators(runs: Runs) -> None:
    """3.2.2 with the guard, B creating its run while A's is not committed: B's guard finds A's
    (dag, partition key) lock taken, waits for A's commit, then sees A's run: B's task instances are
    SKIPPED and its run finished, with the note; A is untouched."""
    result = runs.get("3.2.2", "local-settings")
    out = result["partitioned-overlap"]
    first, second = partition_pair(result, "partitioned-overlap")
    assert states(first) == {None} and first["note"] is None and first["state"] == "queued"
    assert states(second) == {"skipped"} and second["state"] == "success"
    assert second["note"] == NOTE.format(kept=first["run_id"])
    assert out["guard_after"]["lock_waits"] >= 1, "B really waited for A's lock"
    assert out["guard_after"]["lock_timeouts"] == 0
    assert out["guard_after"]["skipped_runs"] == 2, "this one and partitioned-serial's"


def test_partitioned_guard_lock_timeout_lets_the_run_through(runs: Runs) -> None:
    """A creator that cannot take the (dag, key) lock within its wait budget (another session holds
    it) creates its run untouched (fail open) and says so in a warning: both runs stay runnable,
    nothing hangs, and the sidecar's planner sees the pair as a duplicate to remediate."""
    result = runs.get("3.2.2", "local-settings")
    first, second = partition_pair(result, "partitioned-timeout")
    assert states(first) == states(second) == {None}
    assert first["note"] is None and second["note"] is None
    before = result["partitioned-overlap"]["guard_after"]["lock_timeouts"]
    assert result["partitioned-timeout"]["guard_after"]["lock_timeouts"] == before + 2, "A's wait and B's"
    assert any("created unguarded" in log["message"] for log in result["guard_logs"])
    # The sidecar still sees the pair: a confirmed duplicate it would remediate (the later one).
    assert daemon_outcomes(runs, "3.2.2", "local-settings")[second["run_id"]] is Outcome.REMEDIATE


def test_partitioned_guard_stress_two_schedulers_many_dags_and_keys(runs: Runs) -> None:
    """Two schedulers that both read every pending row of 8 DAGs x 4 keys create runs at once: no
    deadlock or error, every pending row consumed, every (dag, key) keeps exactly one runnable run,
    and each extra run is skipped with the note naming it (a wait that timed out would leave a second
    runnable run: counted, and then allowed)."""
    result = runs.get("3.2.2", "local-settings")
    out = result["partitioned-stress"]
    assert all(pointer is not None for pointer in out["pending"].values())
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in out["runs"]:
        groups.setdefault((run["dag_id"], run["partition_key"]), []).append(run)
    assert len(groups) == 8 * 4
    timeouts = out["guard_after"]["lock_timeouts"] - result["partitioned-timeout"]["guard_after"]["lock_timeouts"]
    raced = prevented = 0
    for members in groups.values():
        live = [r for r in members if states(r) != {"skipped"}]
        skipped = [r for r in members if states(r) == {"skipped"}]
        assert len(live) >= 1, members
        raced += len(members) > 1
        prevented += len(skipped)
        for dup in skipped:
            assert dup["state"] == "success" and dup["note"] == NOTE.format(kept=live[0]["run_id"])
    assert raced > 0, "the two schedulers did race"
    assert prevented == raced - timeouts
    print(f"stress: {raced} raced, {prevented} prevented, {timeouts} lock timeouts, {out['seconds']} s")


def test_partitioned_guard_names_the_twin_on_a_key_that_ran_before(runs: Runs) -> None:
    """3.2.2: the race on a partition key that already had its run (an earlier row and event): the
    duplicate is skipped with the note naming the race's first run, not the key's earlier run."""
    result = runs.get("3.2.2", "local-settings")
    out = result["partitioned-again"]
    (earlier,) = out["first_round"]
    first, second = partition_pair(result, "partitioned-again")
    assert earlier["id"] < first["id"] and earlier["partition_key"] == first["partition_key"]
    assert earlier["event_ids"] != first["event_ids"]
    assert states(first) == {None} and first["note"] is None and first["state"] == "queued"
    assert states(second) == {"skipped"} and second["state"] == "success"
    assert second["note"] == NOTE.format(kept=first["run_id"])


def test_partitioned_guard_waits_once_per_transaction_and_never_past_its_budget(runs: Runs) -> None:
    """3.2.2: one scheduler transaction creates the runs of two keys of one DAG while other sessions
    hold both keys' locks (driver: a virtual clock; the first holder lets go once the waiter's clock
    passes the deadline, the second at the first sleep of the second wait). The budget is per
    transaction and the last sleep ends at the deadline: two waits, two timeouts, no lock let go
    while the guard waited, both runs untouched."""
    result = runs.get("3.2.2", "local-settings")
    out = result["partitioned-two-keys"]
    before, after = out["counters_before"], out["guard_after"]
    assert len(out["waited"]) == 2 and {tuple(k)[1] for k in out["waited"]} == set(out["keys"])
    assert after["lock_waits"] == before["lock_waits"] + 2
    assert after["lock_timeouts"] == before["lock_timeouts"] + 2
    assert out["released_in_wait"] == []
    assert sorted(r["partition_key"] for r in out["runs"]) == sorted(out["keys"])
    for run in out["runs"]:
        assert states(run) == {None} and run["note"] is None and run["state"] == "queued"


def test_partitioned_guard_decides_each_run_of_a_transaction_as_itself(runs: Runs) -> None:
    """3.2.2: B's transaction creates two runs of one DAG, first one nobody ran (not a duplicate),
    then one A's committed run already ran: only the second is skipped, its note naming A's."""
    result = runs.get("3.2.2", "local-settings")
    out, jobs = result["partitioned-fresh-and-raced"], result["job_ids"]
    by = {(r["creating_job_id"], r["partition_key"]): r for r in out["runs"]}
    assert len(by) == len(out["runs"]) == 3
    kept = by[(jobs["scheduler-a"], out["raced"])]
    fresh = by[(jobs["scheduler-b"], out["fresh"])]
    dup = by[(jobs["scheduler-b"], out["raced"])]
    assert fresh["id"] < dup["id"], "B created the fresh key's run first"
    events = out["events"]
    assert kept["event_ids"] == dup["event_ids"] == sorted([events["raced_eu"], events["raced_us"]])
    assert fresh["event_ids"] == sorted([events["fresh_eu"], events["fresh_us"]])
    for run in (kept, fresh):
        assert states(run) == {None} and run["note"] is None and run["state"] == "queued"
    assert states(dup) == {"skipped"} and dup["state"] == "success"
    assert dup["note"] == NOTE.format(kept=kept["run_id"])


# 3.0 / 3.1: overlap duplicates, no row-level locking, the look of a guarded run ----------------------


def overlap_pair(result: dict[str, Any], scenario: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(A's run, B's run) of an overlap race, with the facts that make it one: different run_after
    (B's earlier), B's events a non-empty subset of A's."""
    first, dup = race_pair(result, scenario)
    assert dup["run_after"] < first["run_after"]
    assert first["id"] < dup["id"]
    assert dup["event_ids"] and set(dup["event_ids"]) < set(first["event_ids"])
    return first, dup


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_without_guard_the_overlap_race_runs_an_event_twice(runs: Runs, version: str) -> None:
    """Without the guard, the overlap race (B read the queue before asset b's event arrived, A after)
    gives two runnable runs with different run_after that both consume asset a's event."""
    first, dup = overlap_pair(runs.get(version, "none"), "overlap")
    assert states(first) == states(dup) == {None}


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_skips_the_overlap_duplicate(runs: Runs, version: str) -> None:
    """The overlap duplicate is created skipped and finished, with the note; A
    is untouched; still one lookup per new asset run."""
    result = runs.get(version, "local-settings")
    first, dup = overlap_pair(result, "overlap")
    assert states(first) == {None} and first["note"] is None
    assert states(dup) == {"skipped"} and dup["state"] == "success"
    assert dup["note"] == NOTE.format(kept=first["run_id"])
    assert result["overlap"]["guard_queries"] == 2
    assert result["overlap"]["guard_statements"] == 3


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_leaves_a_race_with_disjoint_events_alone(runs: Runs, version: str) -> None:
    """The look-alike: B read the queue after A and creates a later run that consumes only the new
    event. Not a duplicate: both runs keep runnable task instances."""
    result = runs.get(version, "local-settings")
    first, second = race_pair(result, "disjoint")
    assert first["run_after"] < second["run_after"]
    assert first["event_ids"] and second["event_ids"]
    assert not set(first["event_ids"]) & set(second["event_ids"])
    assert states(first) == states(second) == {None}
    assert first["note"] is None and second["note"] is None


def at(text: str) -> datetime:
    """A timestamp the driver wrote (isoformat), comparable whatever its digits."""
    return datetime.fromisoformat(text)


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_lets_a_run_with_an_event_committed_late_through(runs: Runs, version: str) -> None:
    """The 3.1 counterpart of partitioned-late-event: an event committed after A read the events,
    timestamped before the runs' run_after, is in B's window (``_create_dag_runs_asset_triggered``:
    ``timestamp <= run_after``, no earlier asset run of the DAG), so B consumes it and A did not: B's
    run is not a duplicate and runs. Nothing else in its window makes it one: a second consumer DAG's
    run that consumed the late event (and whose run_after is inside the window), nor a manual run of
    the DAG after the late event's timestamp."""
    result = runs.get(version, "local-settings")
    out = result["late-event"]
    first, dup = race_pair(result, "late-event")
    late, race = out["events"]["late"], out["events"]["race"]
    late_at = at(out["event_times"][str(late)])
    (manual,) = [r for r in out["runs"] if r["run_type"] == "manual"]
    (other,) = out["other_runs"]
    assert first["run_after"] == dup["run_after"] and first["id"] < dup["id"]
    assert first["event_ids"] == [race] and dup["event_ids"] == sorted([late, race])
    assert other["event_ids"] == [late]
    assert late_at < at(other["run_after"]) < at(dup["run_after"])
    assert late_at < at(manual["run_after"]) < at(dup["run_after"])
    assert states(first) == states(dup) == {None}
    assert dup["state"] == "queued" and dup["note"] is None and first["note"] is None


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_keeps_the_duplicates_twin_of_its_own_dag(runs: Runs, version: str) -> None:
    """A second consumer DAG of the race's asset had its run made first (the lower id), with a later
    run_after, consuming the race's event too: the duplicate's kept run is still A's, of its DAG."""
    result = runs.get(version, "local-settings")
    out = result["second-consumer"]
    first, dup = race_pair(result, "second-consumer")
    (other,) = out["other_runs"]
    assert other["id"] < first["id"] and at(other["run_after"]) > at(first["run_after"])
    assert first["event_ids"] == dup["event_ids"] == [out["events"][0]]
    assert set(first["event_ids"]) < set(other["event_ids"])
    assert states(first) == states(other) == {None} and other["note"] is None
    assert states(dup) == {"skipped"} and dup["note"] == NOTE.format(kept=first["run_id"])


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_names_the_first_run_in_a_three_scheduler_race(runs: Runs, version: str) -> None:
    """Three creators of one run: the second and the third are skipped, each with a note naming the
    first (the kept run), although the third's lookup finds two committed twins; an event that
    arrived after the runs' run_after is none of theirs."""
    result = runs.get(version, "local-settings")
    out = result["race-three"]
    first, dup = race_pair(result, "race-three")
    (third,) = [r for r in out["runs"] if r["creating_job_id"] == out["scheduler_c"]]
    assert first["id"] < dup["id"] < third["id"]
    assert first["run_after"] == dup["run_after"] == third["run_after"]
    assert first["event_ids"] == dup["event_ids"] == third["event_ids"] == [out["events"][0]]
    assert at(out["event_times"][str(out["events"][1])]) > at(first["run_after"])
    assert states(first) == {None} and first["state"] == "running" and first["note"] is None
    for run in (dup, third):
        assert states(run) == {"skipped"} and run["state"] == "success"
        assert run["note"] == NOTE.format(kept=first["run_id"])


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_event_window_bounds_at_equality(runs: Runs, version: str) -> None:
    """An event timestamped exactly at a run's run_after belongs to that run's window, not to the next
    one's: the first run consumed its own such event; in the overlap race after it, B's only event is
    timestamped exactly at B's run_after, A consumed it: B is the overlap duplicate, skipped."""
    result = runs.get(version, "local-settings")
    out = result["bounds"]
    times = {int(k): at(v) for k, v in out["event_times"].items()}
    earliest, shared, second = out["events"]
    (earlier,) = [r for r in out["runs"] if r["creating_job_id"] not in result["job_ids"].values()]
    first, dup = race_pair(result, "bounds")
    assert earlier["event_ids"] == [earliest] and times[earliest] == at(earlier["run_after"])
    assert times[shared] == at(dup["run_after"]) < at(first["run_after"])
    assert first["event_ids"] == [shared, second] and dup["event_ids"] == [shared]
    assert states(earlier) == states(first) == {None}
    assert states(dup) == {"skipped"} and dup["note"] == NOTE.format(kept=first["run_id"])


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_serialises_creators_without_row_level_locking(runs: Runs, version: str) -> None:
    """[scheduler] use_row_level_locking = False: no DagModel lock, so B creates its run while A's is
    uncommitted. The guard's per-DAG lock makes B wait for A's commit: B's run is skipped."""
    result = runs.get(version, "no-row-locking")
    first, dup = race_pair(result, "unlocked")
    assert first["run_after"] == dup["run_after"] and first["event_ids"] == dup["event_ids"] != []
    assert states(first) == {None}
    assert states(dup) == {"skipped"} and dup["state"] == "success"
    assert dup["note"] == NOTE.format(kept=first["run_id"])
    assert result["unlocked"]["lock_waits"] == 1


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guard_without_row_level_locking_keeps_the_first_committed_run_whatever_its_id(
    runs: Runs, version: str
) -> None:
    """No row-level locking, the creators in the other order: A's run is flushed first (the lower
    id) but B's guard takes the per-DAG lock first and B commits first. A's guard waits for B's
    commit, finds B's run (the higher id) and skips A; B is untouched. The daemon keeps B too (never
    a guarded run) and reports A as prevented."""
    result = runs.get(version, "no-row-locking")
    first, second = race_pair(result, "unlocked-inverted")  # first = A's, the lower id
    assert first["id"] < second["id"]
    assert first["run_after"] == second["run_after"] and first["event_ids"] == second["event_ids"] != []
    assert states(second) == {None} and second["note"] is None and second["state"] == "queued"
    assert states(first) == {"skipped"} and first["state"] == "success"
    assert first["note"] == NOTE.format(kept=second["run_id"])
    assert result["unlocked-inverted"]["lock_waits"] == 1, "A's guard waited for B's lock"
    outcomes = daemon_outcomes(runs, version, "no-row-locking")
    assert outcomes[first["run_id"]] is Outcome.PREVENTED
    assert second["run_id"] not in outcomes, "the live run is the one kept, never a target"


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_with_row_level_locking_the_guard_takes_no_lock_of_its_own(runs: Runs, version: str) -> None:
    """Under Airflow's DagModel row lock the guard adds no lock: while each creator of the race is
    still in its transaction (its run and task instances made, the guard's decision taken) the
    database holds no advisory lock; a lock there would serialise every DAG's run creation across
    schedulers. Without row-level locking the creator holds exactly its per-DAG lock at that
    moment: what shows the probe sees the guard's locks."""
    assert runs.get(version, "local-settings")["race"]["advisory_locks"] == {"scheduler-a": 0, "scheduler-b": 0}
    assert runs.get(version, "no-row-locking")["unlocked"]["advisory_locks_a"] == [1]


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_guarded_duplicate_sends_no_dag_callback(runs: Runs, version: str) -> None:
    """After the race on a DAG with on_success_callback, Airflow's own scheduling
    loop runs both runs to their end. The kept run finishes and its callback is sent once; the
    guarded duplicate was created finished (success, every task skipped, the note) and the scheduler
    never sends a DAG callback for it."""
    result = runs.get(version, "no-row-locking")
    first, dup = race_pair(result, "callback")
    assert first["state"] == "success" and states(first) == {"success"}
    assert dup["state"] == "success" and states(dup) == {"skipped"}
    assert dup["note"] == NOTE.format(kept=first["run_id"])
    assert result["callback"]["callbacks"] == [{"run_id": first["run_id"], "is_failure": False, "msg": "success"}]


# What dupguard's daemon makes of it -------------------------------------------------------------------


def daemon_outcomes(runs: Runs, version: str, key: str) -> dict[str, Outcome]:
    """run_id -> the outcome the daemon's planner gives each duplicate found in that Airflow database
    (the same scan -> find_duplicates -> plan path, with task progress and notes read by queries)."""
    runs.get(version, key)
    engine = make_engine(parse_url(database_url(runs.databases[(version, key)])))
    try:
        report = scan(open_airflow_db(engine), now=datetime.now(UTC))
        return {a.run.run_id: a.outcome for a in plan(report.findings, Mode.FAIL, now=report.scanned_at)}
    finally:
        engine.dispose()


@pytest.mark.parametrize("version", ASSET_VERSIONS)
def test_daemon_reports_guarded_duplicates_as_prevented_by_their_note(runs: Runs, version: str) -> None:
    """The daemon recognises a guarded run by the guard's note. Duplicates the guard
    made (no row-level locking race, callback race) are PREVENTED; a duplicate whose every task an
    operator skipped by hand (no guard) is not: it is planned like any duplicate (the remediation
    then finds nothing left to stop)."""
    result = runs.get(version, "no-row-locking")
    guarded = {race_pair(result, s)[1]["run_id"] for s in ("unlocked", "callback")}
    outcomes = daemon_outcomes(runs, version, "no-row-locking")
    assert {r: outcomes.get(r) for r in guarded} == dict.fromkeys(guarded, Outcome.PREVENTED)

    plain = runs.get(version, "none")
    (hand,) = [r for r in plain["race"]["hand_skipped"] if r["creating_job_id"] == plain["job_ids"]["scheduler-b"]]
    assert states(hand) == {"skipped"} and hand["note"] is None
    assert daemon_outcomes(runs, version, "none")[hand["run_id"]] is Outcome.REMEDIATE


def test_pip_installed_guard_prevents_the_race_without_local_settings(runs: Runs) -> None:
    """In a clean Airflow 3.1.2 venv where the only change is `pip install -r
    requirements.txt` naming the guard's wheel (what a managed platform allows), Airflow loads the
    guard through its entry point, no airflow_local_settings exists, and both races are prevented."""
    result = runs.get("3.1.2", "pip-installed")
    assert result["policy"]["guard_module"] == "dupguard_guard.policy"
    assert result["policy"]["is_noop"] is False
    assert result["local_settings_files"] == []
    first, dup = race_pair(result, "race")
    assert states(first) == {None} and states(dup) == {"skipped"} and dup["state"] == "success"
    assert dup["note"] == NOTE.format(kept=first["run_id"])
    first, dup = overlap_pair(result, "overlap")
    assert states(first) == {None} and states(dup) == {"skipped"}


def test_partitioned_guard_inverted_order_keeps_the_first_committed_and_the_daemon_agrees(runs: Runs) -> None:
    """3.2.2: A's run is flushed first (lower id) but B's guard takes the (dag, key) lock first, so B
    commits first. A's guard waits, sees B's committed run and skips A: the lower-id run is the
    guarded one. The daemon keeps B too (never a guarded run) and reports A as prevented."""
    result = runs.get("3.2.2", "local-settings")
    first, second = partition_pair(result, "partitioned-inverted")  # first = A's, the lower id
    assert states(second) == {None} and second["note"] is None and second["state"] == "queued"
    assert states(first) == {"skipped"} and first["state"] == "success"
    assert first["note"] == NOTE.format(kept=second["run_id"])
    outcomes = daemon_outcomes(runs, "3.2.2", "local-settings")
    assert outcomes[first["run_id"]] is Outcome.PREVENTED
    assert second["run_id"] not in outcomes, "the live run is the one kept, never a target"


def test_guard_does_nothing_on_airflow_3_3(runs: Runs) -> None:
    """Airflow 3.3.2 with the guard installed: the partitioned race (both schedulers read the pending
    row; Airflow 3.3 locks it, FOR UPDATE SKIP LOCKED) makes one run, untouched, and the guard runs
    no query at all."""
    result = runs.get("3.3.2", "local-settings")
    assert result["policy"]["is_noop"] is False, "the hook is called"
    assert all(states(r) == {None} for r in result["ordinary_runs"])
    (only,) = result["partitioned-serial"]["runs"]
    # Whichever scheduler's SELECT ... FOR UPDATE SKIP LOCKED came first made it; the other got no row.
    assert only["creating_job_id"] in result["job_ids"].values()
    assert states(only) == {None} and only["note"] is None and only["state"] == "queued"
    assert result["guard"]["queries"] == 0 and result["guard"]["skipped_runs"] == 0


def test_guard_installed_from_the_wheel_leaves_airflows_is_noop_alone_on_airflow_3_3(runs: Runs) -> None:
    """On 3.3+, where the guard has nothing to do, the entry-point install does not clear
    ``task_instance_mutation_hook.is_noop`` (which would change Airflow's task_instance_created
    counters on every DAG); Airflow still registers the hook and nothing is created differently."""
    result = runs.get("3.3.2", "entry-point")
    assert result["policy"]["guard_module"] == "dupguard_guard.policy"
    assert result["policy"]["hookimpls"] != [] and result["policy"]["is_noop"] is True
    (only,) = result["partitioned-serial"]["runs"]
    assert states(only) == {None} and only["note"] is None
    assert result["guard"]["queries"] == 0
