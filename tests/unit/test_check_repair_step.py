"""The optional repair step of the check interface (for stranded events): the runner calls ``Check.repair`` after
each run of every kind, the same way (no branch per kind), with the ledger, the leader's fence, the alert
channels and the database clock; ``CheckBase``'s default repairs nothing; ``scan``'s ``observe`` never
calls it. Run on the demo's SQLite database, as tests/unit/test_checks_interface.py."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from detector.app import demo
from detector.app.ledger import MemoryLedger
from detector.checks.base import CheckBase, RepairContext
from detector.checks.runner import CheckRunner, observe
from detector.config import Config
from detector.core.checks import CheckContext, Observation
from detector.core.fence import UNFENCED, Fence
from detector.metadb.engine import AirflowDb, connect, make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.unit.test_checks_interface import NOW, FakeCheck, Recorder, _obs


@pytest.fixture
def airflow_db(tmp_path: Path) -> AirflowDb:
    demo.build(tmp_path / "airflow.db")  # the demo database tests/unit/test_checks_interface.py uses
    return open_airflow_db(make_engine(parse_url(f"sqlite:///{tmp_path / 'airflow.db'}"), read_only=True))


class RepairingCheck(FakeCheck):
    kind: ClassVar[str] = "test_repairing"

    def __init__(self, config: Config, metrics: Metrics) -> None:
        super().__init__(config, metrics)
        self.repairs: list[tuple[list[Observation], RepairContext]] = []

    def repair(self, found: list[Observation], rc: RepairContext) -> None:
        self.repairs.append((found, rc))


def test_the_runner_hands_every_run_to_the_repair_step_with_what_it_needs(airflow_db: AirflowDb) -> None:
    metrics, recorder, ledger = Metrics(), Recorder(), MemoryLedger()
    config = Config.of(database_url="sqlite://")
    check, plain = RepairingCheck(config, metrics), FakeCheck(config, metrics)
    check.found = plain.found = [_obs("a")]
    fence = Fence(term=4, ends=1.0, clock=lambda: 0.0)
    db = airflow_db
    runner = CheckRunner(db, [check, plain], ledger, recorder, metrics, cluster="prod-eu", fence=lambda: fence)
    runner.run("test_repairing", NOW)
    runner.run("test_repairing", NOW)
    runner.run("test_kind", NOW)  # CheckBase's default step: nothing happens, nothing fails
    assert [len(found) for found, _ in check.repairs] == [1, 1]  # every run, what it found (new or not)
    found, rc = check.repairs[0]
    assert found == [_obs("a")] and rc.ledger is ledger and rc.fence() is fence and rc.db is db
    assert (rc.cluster, rc.now) == ("prod-eu", NOW) and rc.db_now == check.contexts[0].db_now
    rc.notify(recorder.notices[0])
    assert recorder.notices[-1] is recorder.notices[0]  # the runner's alert channels


def test_scan_never_calls_the_repair_step_and_the_default_fence_is_unfenced(airflow_db: AirflowDb) -> None:
    db = airflow_db
    check = RepairingCheck(Config.of(database_url="sqlite://"), Metrics())
    check.found = [_obs("a")]
    with connect(db.engine) as conn:
        ctx = CheckContext(db_now=NOW, now=NOW, live=False)
        assert observe([check], conn, db, ctx) == ({"test_repairing": [_obs("a")]}, {})
    assert check.repairs == []
    runner = CheckRunner(db, [check], MemoryLedger(), Recorder(), Metrics(), cluster="c")
    runner.run("test_repairing", NOW)
    assert check.repairs[0][1].fence() is UNFENCED  # the only replica (SQLite, no lock)
    assert CheckBase.repair is not RepairingCheck.repair
