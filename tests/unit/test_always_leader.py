"""One ``airflow standalone`` on SQLite (and ``--source api``) has no lock: its only replica always
leads, never waits to act, reports no lock problem and writes unfenced (benchmarks/results/mutation.md: these two
methods had no test at all under mutation)."""

from __future__ import annotations

import math

from detector.app.leader import AlwaysLeader
from tests.factories import T0


def test_the_only_replica_always_leads_unfenced() -> None:
    leadership = AlwaysLeader()
    for _ in range(2):
        assert leadership.ensure(T0) is True
        assert leadership.is_leader(T0) is True
    fence = leadership.fence()
    assert fence is not None and fence.valid() and fence.ends == math.inf and fence.backend_pid is None
    assert leadership.waiting() is None and leadership.problem is None
    leadership.release()
    assert leadership.is_leader(T0) is True, "nothing to release: it still leads"
