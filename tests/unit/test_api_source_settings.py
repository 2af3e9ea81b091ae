"""`--source api` settings and the file ledger that keeps its decisions without a database."""

from __future__ import annotations

from pathlib import Path

import pytest

from detector import config
from detector.app.ledger_file import FileLedger
from detector.core.ports import Pending
from detector.errors import ConfigError

API = {"DUPGUARD_SOURCE": "api", "DUPGUARD_AIRFLOW_API_URL": "https://airflow.example", "DUPGUARD_AIRFLOW_TOKEN": "t"}


def test_the_api_source_needs_no_database_url() -> None:
    """With the API, its URL and a token, the configuration is complete: no DUPGUARD_DATABASE_URL."""
    cfg = config.load({}, API)
    assert cfg.source == "api" and cfg.database_url is None


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"DUPGUARD_AIRFLOW_API_URL": ""}, "DUPGUARD_SOURCE=api needs DUPGUARD_AIRFLOW_API_URL"),
        ({"DUPGUARD_AIRFLOW_TOKEN": ""}, "DUPGUARD_SOURCE=api needs DUPGUARD_AIRFLOW_TOKEN"),
        ({"DUPGUARD_REMEDIATION_BACKEND": "db"}, "DUPGUARD_REMEDIATION_BACKEND=db writes to the metadata database"),
    ],
)
def test_api_source_problems_are_named(env: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load({}, API | env)
    assert any(problem in p for p in caught.value.problems), caught.value.problems


def test_state_file_is_refused_with_the_database_source() -> None:
    with pytest.raises(ConfigError) as caught:
        config.load({}, {"DUPGUARD_DATABASE_URL": "postgresql://x@h/db", "DUPGUARD_STATE_FILE": "/tmp/s.json"})
    assert any("DUPGUARD_STATE_FILE is for DUPGUARD_SOURCE=api" in p for p in caught.value.problems)


def test_file_ledger_keeps_claims_decisions_and_pending_across_a_restart(tmp_path: Path) -> None:
    """What one process claimed, decided and left pending is there for the next one (the restart)."""
    path = tmp_path / "state.json"
    first = FileLedger(str(path))
    assert first.claim_all("g1", ["detected", "action:r2"]) == {"detected", "action:r2"}
    first.record_decision(("dag", "r1"), [("dag", "r2")])
    first.add_pending(Pending("g1", "dag", "r2"))
    first.remember("dupguard|api-source", "cursor", "2026-11-30T04:10:28+00:00")
    second = FileLedger(str(path))
    assert second.durable
    assert second.claim_all("g1", ["detected", "action:r2", "action:r3"]) == {"action:r3"}
    assert second.decisions([("dag", "r1"), ("dag", "r2")]) == {("dag", "r1"): {"kept"}, ("dag", "r2"): {"duplicate"}}
    assert second.pending() == [Pending("g1", "dag", "r2")]
    assert second.recall("dupguard|api-source", "cursor") == "2026-11-30T04:10:28+00:00"
    second.drop_pending("dag", "r2")
    assert FileLedger(str(path)).pending() == []


def test_file_ledger_problems_are_one_line_config_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(ConfigError, match="unreadable"):
        FileLedger(str(broken))
    with pytest.raises(ConfigError, match="cannot write"):
        FileLedger(str(tmp_path / "missing-folder" / "state.json"))
