"""The lock_pooled state: a pooler shares the leader lock's server session. A standby
whose attempt found another client's lock on its server session, and a leader whose heartbeat ran
elsewhere, are both down (dupguard_up 0, /readyz 503, DupguardDown) with the lock's reason: the
set-up needs DUPGUARD_LOCK_MODE=transaction or a direct lock URL. The leader's reason says it acts."""

from __future__ import annotations

from detector.app.leader import LOCK_POOLED, POOLED_ATTEMPT, LockProblem, _pooled_leader
from detector.app.status import State, Status, StatusBoard, evaluate
from detector.metrics import Metrics


def test_a_standby_that_found_the_lock_on_its_server_session_is_lock_pooled() -> None:
    status = evaluate(db_error=None, leader=False, poll_error=None, lock=POOLED_ATTEMPT)
    assert status.state is State.LOCK_POOLED and not status.up
    assert status.reason == POOLED_ATTEMPT.reason
    assert "DUPGUARD_LOCK_MODE=transaction" in status.reason and "DUPGUARD_LOCK_DATABASE_URL" in status.reason


def test_a_leader_whose_heartbeat_ran_elsewhere_is_lock_pooled_and_says_it_leads() -> None:
    problem = _pooled_leader(4321)
    status = evaluate(db_error=None, leader=True, poll_error=None, lock=problem, waiting=1.0)
    assert status.state is State.LOCK_POOLED and not status.up
    assert status.reason.startswith("holds the leader lock and polls, but the leader lock's heartbeat ran")
    assert "backend pid 4321" in status.reason and "DUPGUARD_LOCK_MODE=transaction" in status.reason
    assert evaluate(db_error=None, leader=True, poll_error="boom", lock=problem).state is State.POLL_FAILING


def test_other_lock_problems_do_not_change_a_leaders_state() -> None:
    other = LockProblem("lock_unavailable", "x")
    assert evaluate(db_error=None, leader=True, poll_error=None, lock=other).state is State.LEADING
    assert State.LOCK_POOLED.value == LOCK_POOLED


def test_the_state_gauge_has_a_lock_pooled_series() -> None:
    metrics = Metrics()
    board = StatusBoard(metrics)
    board.update(Status(State.LOCK_POOLED, POOLED_ATTEMPT.reason))
    sample = metrics.registry.get_sample_value
    assert sample("dupguard_state", {"state": "lock_pooled"}) == 1
    assert sample("dupguard_state", {"state": "starting"}) == 0 and sample("dupguard_up") == 0
