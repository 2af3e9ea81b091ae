"""Requests per alert sink per minute when a new leader picks up a storm's pending stops (failover) and
when the only replica restarts mid-storm. Real daemons on real PostgreSQL (the 3.1.2 schema) with the
``db`` backend in ``fail`` mode; their alerter is the real dispatcher with the real channels (Slack bot,
Slack incoming webhook, JSON webhook, Alertmanager) sending to the Slack stand-in and to a real
Alertmanager (``tests.sinks``). The bound is checked by counting the requests each sink received from
the moment of the switch, not by timing.

benchmarks/storm_sinks.py measures the same paths at 1,000 and 10,000 groups with the default bound.
"""

from __future__ import annotations

import time

import pytest

from tests.daemon_harness import Running, failed_runs, start_daemon, wait_for
from tests.pg import Templates
from tests.sinks import SINKS, Sinks, per_minute
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration

GROUPS = 300
# Low, so that a storm small enough for the suite passes it without a bound: 300 groups' pick-up
# sent 7 to 10 requests per sink within a minute (and far more at 10,000: benchmarks/results/).
BOUND = 5
DIGEST_DELAY = 1.0  # gathered outcomes leave every second instead of every ten: more requests, sooner


def _leads(d: Running) -> bool:
    return d.is_leader() and d.daemon.parts.leadership.waiting() is None


@pytest.mark.parametrize("path", ["pickup", "restart"])
def test_a_new_leader_finishing_a_storm_keeps_each_sink_within_its_bound(
    pg_templates: Templates, daemons: list[Running], path: str
) -> None:
    """300 groups in one commit; once every group was detected and a tenth of the duplicates were stopped
    the leader stops (pickup: the
    standby takes over; restart: the same replica starts again) and the new leader stops the rest. Every
    sink got the new leader's news, and none more than ``alert_requests_per_minute`` requests from the
    switch on, while every duplicate was stopped."""
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    with Sinks(digest_delay=DIGEST_DELAY) as sinks:

        def start() -> Running:
            d = start_daemon(
                url,
                real_remediation=True,
                alerter_factory=sinks.alerter,
                remediation="fail",
                remediation_backend="db",
                alert_requests_per_minute=BOUND,
                **sinks.settings(),
            )
            daemons.append(d)
            return d

        first = start()
        wait_for(lambda: _leads(first), 30, "the first leader")
        if path == "pickup":
            start()
        dups = [dup for _, dup in writer.storm(GROUPS)]
        writer.close()

        def detected() -> bool:  # as benchmarks/storm.py: every group judged by the first leader
            return {r.run_id for e in first.alerter.detected() for r in e.finding.runs} >= set(dups)

        wait_for(
            lambda: detected() and failed_runs(url, dups) >= GROUPS // 10, 30, "detections and a tenth of the stops"
        )
        first.stop()
        daemons.remove(first)
        switched = time.monotonic()
        if path == "restart":
            start()
        wait_for(lambda: failed_runs(url, dups) == GROUPS, 45, "every duplicate stopped")

        def heard() -> bool:
            times = sinks.times()
            return all(any(t >= switched for t in times[sink]) for sink in SINKS)

        wait_for(heard, 15, "the new leader's first request to every sink")
        time.sleep(3 * DIGEST_DELAY)  # the outcomes gathered last leave too (as far as the bound lets them)
        times = sinks.times()
        rejected = sinks.rejected()
    on_path = {sink: per_minute(times[sink], since=switched) for sink in SINKS}
    assert all(1 <= n <= BOUND for n in on_path.values()), on_path
    assert rejected == []
