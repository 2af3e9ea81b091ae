"""The guard's own state, without Airflow (policy.py loaded from its file, as Airflow loads it): the
per-run decision cache and the advisory lock ids two schedulers must agree on."""

from __future__ import annotations

import pytest

from tests.guard.support import load_policy


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


@pytest.mark.parametrize(
    ("lock_key", "lock_id"),
    [
        (("orders_consumer",), -4698287078334788198),
        (("b",), -8748487260073429452),
        (("partitioned_consumer", "2026-11-30T05:00:00"), 4519015944494272258),
    ],
)
def test_the_advisory_lock_id_of_a_dag_and_key_is_pinned(lock_key: tuple[str, ...], lock_id: int) -> None:
    """Every scheduler must compute the same PostgreSQL advisory lock id for one (dag[, partition key]),
    whichever guard release it runs (a rolling upgrade runs two): the blake2b-64 digest of
    "dupguard\\0dag[\\0key]", signed big-endian, so it fits PostgreSQL's bigint. Pinned literally."""
    assert load_policy()._dupguard_lock_id(lock_key) == lock_id
