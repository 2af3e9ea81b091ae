"""What a remediation result may claim: ``unknown`` shown and ranked as its own
status, notes that Airflow's record contradicts decide nothing, and check-config names what the api
backend cannot do. The real-server and real-database cases are in tests/integration/
test_remediation_proof.py and test_airflow_views.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from detector.actions.alerts.group_text import result_label, status_of
from detector.actions.remediation.guarded import judge, passive_result
from detector.actions.remediation.readback import NO_START_DATE
from detector.app.cli import main
from detector.config import SETTINGS
from detector.core.decisions import decisions_from_notes
from detector.core.detect import find_duplicates
from detector.core.model import Finding, TaskProgress
from detector.core.plan import Action, Mode, Outcome, note_for, plan
from detector.core.ports import RemediationResult, Result
from detector.metadb.run_state import RunState, TaskState
from tests.factories import T0, run

EVENTS = {1: frozenset({7}), 2: frozenset({7})}


def _action() -> tuple[Finding, Action]:
    [finding] = find_duplicates([run(id=1), run(id=2)], EVENTS, {})
    [action] = plan([finding], Mode.FAIL, now=T0)
    return finding, action


def _too_late_results(action: Action) -> list[RemediationResult]:
    """Every too-late text dupguard writes: the planner's, and both of the re-read's verdicts."""
    planned = passive_result(replace(action, outcome=Outcome.TOO_LATE))
    assert planned is not None
    found = [planned]
    for ti in (TaskState("extract", -1, "running", pid=42), TaskState("extract", -1, "failed")):
        state = RunState(action.run.id, action.dag_id, action.run.run_id, "running", (ti,))
        verdict = judge(action, state, remediate_started=False)
        assert verdict.result is Result.TOO_LATE
        found.append(RemediationResult(action, Result.TOO_LATE, verdict.detail))
    return found


def test_a_too_late_label_says_too_late_once() -> None:
    """The alert's line read "too late: … left alone: too late: … left alone" (the
    label, then a detail saying the same). Each too-late text now appears once, its reason kept."""
    _, action = _action()
    labels = [result_label(r) for r in _too_late_results(action)]
    assert [label.count("too late") for label in labels] == [1, 1, 1], labels
    assert [label.count("left alone") for label in labels] == [1, 0, 0], labels
    assert "its tasks had left queued when planned" in labels[0]
    assert "both runs executed" in labels[1] and "extract=running" in labels[1]
    assert "before any worker ran them" in labels[2]


def test_unknown_is_its_own_status_and_label() -> None:
    """A stop sent but not read back is neither stopped nor failed: its own status, above too_late
    (its severity is the group's level: oncall.guidance)."""
    _, action = _action()
    unknown = RemediationResult(action, Result.UNKNOWN, "read-back failed")
    late = RemediationResult(action, Result.TOO_LATE, "")
    status = status_of([unknown, late])
    assert status.name == "unknown"
    assert result_label(unknown).startswith("stop sent, not confirmed")


@pytest.mark.parametrize(
    ("state", "progress", "decides"),
    [
        ("queued", TaskProgress(total=2), False),  # copied or typed note: the run goes on
        ("running", TaskProgress(total=2, started=1), False),
        ("failed", TaskProgress(total=2, skipped=2), True),  # mode fail
        ("queued", TaskProgress(total=2, skipped=2), True),  # mode skip, before the scheduler ends it
        ("success", TaskProgress(total=2, skipped=2, guarded=True), True),  # the guard's run
    ],
)
def test_a_note_decides_only_what_airflow_shows(state: str, progress: TaskProgress, decides: bool) -> None:
    finding, _ = _action()
    noted = replace(run(id=2), state=state)
    notes = {2: note_for(finding, noted, T0)}
    prior = decisions_from_notes([run(id=1), noted], notes, {2: progress})
    assert (prior.stopped == {2}) is decides and (prior.kept == {1}) is decides
    assert (prior.disputed == {2}) is not decides


def test_notes_on_both_runs_resolve_the_group_afresh() -> None:
    """Each queued run's note names the other as kept: neither decides, the lower id is kept and the
    other remediated (was: both kept and stopped, the group never resolved)."""
    one, two = replace(run(id=1), state="queued"), replace(run(id=2), state="queued")
    [finding] = find_duplicates([one, two], EVENTS, {})
    notes = {2: note_for(finding, two, T0), 1: note_for(finding, two, T0).replace(one.run_id, two.run_id)}
    prior = decisions_from_notes([one, two], notes, {})
    assert prior.disputed == {1, 2} and not prior.stopped and not prior.kept
    [judged] = find_duplicates([one, two], EVENTS, {}, prior=prior)
    assert judged.kept == one
    assert [a.outcome for a in plan([judged], Mode.FAIL, now=T0)] == [Outcome.REMEDIATE]


def test_check_config_says_what_the_api_backend_cannot_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    common = ["check-config", "--database-url", "postgresql://u@h/db", "--airflow-api-url", "http://af:8080"]
    auth = ["--airflow-username", "u", "--airflow-password", "p"]
    assert main([*common, *auth, "--remediation", "fail", "--remediation-backend", "api"]) == 0
    assert NO_START_DATE.lstrip("; ") in capsys.readouterr().out
    assert main([*common, *auth, "--remediation", "fail", "--remediation-backend", "db"]) == 0
    assert "71360" not in capsys.readouterr().out
    # the default, auto: which backend depends on grants check-config cannot read; it says which and why
    assert main([*common, *auth, "--remediation", "fail"]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert note.startswith("# note: remediation_backend auto: db if the database role holds UPDATE on dag_run")
    assert "else api" in note and "71360" in note and "GRANT" in note and "docs/how-to/guard.md" in note
    # auto where db cannot write (SQLite is opened read-only): api, said as such
    sqlite = ["check-config", "--database-url", "sqlite:////x/airflow.db", "--airflow-api-url", "http://af:8080"]
    assert main([*sqlite, *auth, "--remediation", "fail"]) == 0
    note = capsys.readouterr().out.splitlines()[-1]
    assert "auto uses api" in note and NO_START_DATE.lstrip("; ") in note
