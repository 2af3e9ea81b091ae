"""Was the consumer paused when an event was registered (detector.checks.stranded_events.rule_pauses), and what
the rule, the alert and the repair make of it. The log rows are shaped as Airflow 3.0.6-3.3.2 write them
(tests/integration/test_pause_log_api.py checks them on a real API server; the CLI's in the
stranded_paused_run fixtures)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from detector.checks.stranded_events.rule import find_stranded, observe
from detector.checks.stranded_events.rule_pauses import (
    PATCH_DAG,
    PATCH_DAGS,
    PAUSE,
    UNPAUSE,
    PauseLog,
    PauseRecord,
    paused_at,
    record,
    with_pauses,
)
from detector.checks.stranded_events.rule_repair import Refusal, plan_requeue
from tests.unit.test_stranded_repair import SET, STATE
from tests.unit.test_stranded_rule import STRANDED

T = STRANDED.timestamp  # the event's time
FLOOR = STRANDED.schedule_floor
DAG = STRANDED.dag_id
US = timedelta(microseconds=1)
OLD = PauseLog((), FLOOR - timedelta(days=1) if FLOOR else None)  # the log reaches back before the DAG


def _log(*records: PauseRecord, oldest: datetime | None = None) -> PauseLog:
    return PauseLog(records, oldest if oldest is not None else OLD.oldest)


def pause(at: datetime, dag: str | None = DAG) -> PauseRecord:
    return PauseRecord(at, dag, True)


def unpause(at: datetime, dag: str | None = DAG) -> PauseRecord:
    return PauseRecord(at, dag, False)


def test_an_event_between_a_pause_and_an_unpause_is_not_stranded() -> None:
    log = _log(pause(T - timedelta(seconds=1)), unpause(T + timedelta(seconds=1)))
    assert paused_at(log, DAG, T, FLOOR) is True
    assert find_stranded(with_pauses([STRANDED], log)) == []
    assert len(find_stranded([STRANDED])) == 1  # the rule without the log


def test_pause_record_boundary() -> None:
    """Airflow writes the row before the change commits: a pause at the event's very time counts."""
    assert paused_at(_log(pause(T)), DAG, T, FLOOR) is True  # exactly at the event
    assert paused_at(_log(pause(T - US)), DAG, T, FLOOR) is True  # just before
    assert paused_at(_log(pause(T + US)), DAG, T, FLOOR) is False  # just after: unpaused at the event


def test_unpause_record_boundary() -> None:
    assert paused_at(_log(pause(T - timedelta(hours=1)), unpause(T)), DAG, T, FLOOR) is False
    assert paused_at(_log(pause(T - timedelta(hours=1)), unpause(T + US)), DAG, T, FLOOR) is True
    assert paused_at(_log(pause(T - timedelta(hours=1)), unpause(T - US)), DAG, T, FLOOR) is False


def test_an_unpause_after_with_nothing_before_means_paused_until_then() -> None:
    """A DAG created paused (Airflow's default) and unpaused after the event."""
    assert paused_at(_log(unpause(T + timedelta(seconds=5))), DAG, T, FLOOR) is True


def test_other_dags_records_do_not_count() -> None:
    assert paused_at(_log(pause(T - timedelta(seconds=1), "other")), DAG, T, FLOOR) is False


@pytest.mark.parametrize("which", ["bulk before", "bulk after", "direction-less before", "direction-less after"])
def test_records_that_do_not_say_make_the_state_unknown(which: str) -> None:
    rec = {
        "bulk before": PauseRecord(T - US, None, True),
        "bulk after": PauseRecord(T + US, None, False),
        "direction-less before": PauseRecord(T - US, DAG, None),
        "direction-less after": PauseRecord(T + US, DAG, None),  # 3.0.x's patch_dag: a pause or an unpause
    }[which]
    assert paused_at(_log(rec), DAG, T, FLOOR) is None


def test_log_purge_boundary() -> None:
    """No record before the event: unpaused only if the log's oldest row is not newer than the DAG's first
    schedule reference (a purge may have taken the pause that said otherwise)."""
    assert FLOOR is not None
    assert paused_at(_log(oldest=FLOOR), DAG, T, FLOOR) is False  # exactly at the floor
    assert paused_at(_log(oldest=FLOOR - US), DAG, T, FLOOR) is False
    assert paused_at(_log(oldest=FLOOR + US), DAG, T, FLOOR) is None  # purged: evidence gone
    assert paused_at(_log(pause(T + timedelta(seconds=1)), oldest=FLOOR + US), DAG, T, FLOOR) is None
    assert paused_at(PauseLog((), None), DAG, T, FLOOR) is False  # an empty log: nothing ever written
    assert paused_at(PauseLog((), None, readable=False), DAG, T, FLOOR) is None  # no SELECT on log


def test_unknown_is_reported_as_a_warning_and_refused_by_the_repair() -> None:
    purged = PauseLog((), FLOOR + timedelta(seconds=1) if FLOOR else None)
    [s] = find_stranded(with_pauses([STRANDED], purged))
    obs = observe(s, T)
    assert (obs.severity, obs.confidence) == ("warning", "suspected")
    assert any("cannot say whether" in line for line in obs.lines)
    known = observe(find_stranded(with_pauses([STRANDED], OLD))[0], T)
    assert (known.severity, known.confidence) == ("error", "confirmed")
    unknown_set = replace(SET, events=tuple(replace(e, paused_then=None) for e in SET.events))
    refusal = plan_requeue(unknown_set, STATE)
    assert isinstance(refusal, Refusal) and refusal.outcome == "refused" and "paused" in refusal.reason


def test_one_event_known_unpaused_keeps_the_error() -> None:
    e2 = replace(STRANDED, event_id=4, timestamp=T + timedelta(seconds=0.5), paused_then=None)
    [s] = find_stranded([replace(STRANDED, paused_then=False), e2])
    assert observe(s, T).severity == "error"


@pytest.mark.parametrize(
    ("event", "dag_id", "extra", "names_dag", "direction", "expected"),
    [
        (PAUSE, DAG, '{"host_name": "h", "full_command": "[...]"}', True, True, PauseRecord(T, DAG, True)),
        (UNPAUSE, DAG, None, True, False, PauseRecord(T, DAG, False)),
        (PAUSE, "orders_.*", None, False, True, PauseRecord(T, None, True)),  # --treat-dag-id-as-regex
        (PATCH_DAG, DAG, json.dumps({"is_paused": True, "method": "PATCH"}), True, True, PauseRecord(T, DAG, True)),
        (PATCH_DAG, DAG, json.dumps({"is_paused": False, "method": "PATCH"}), True, True, PauseRecord(T, DAG, False)),
        (PATCH_DAG, DAG, json.dumps({"is_paused": False, "method": "PATCH"}), True, False, PauseRecord(T, DAG, None)),
        (PATCH_DAG, DAG, json.dumps({"method": "PATCH"}), True, True, PauseRecord(T, DAG, None)),
        (PATCH_DAG, DAG, "not json", True, True, PauseRecord(T, DAG, None)),
        (PATCH_DAGS, None, json.dumps({"is_paused": True}), False, True, PauseRecord(T, None, None)),
    ],
)
def test_log_rows_as_airflow_writes_them(
    event: str, dag_id: str, extra: str | None, names_dag: bool, direction: bool, expected: PauseRecord
) -> None:
    assert record(event, dag_id, T, extra, names_dag=names_dag, patch_direction=direction) == expected
