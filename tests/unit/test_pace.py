"""Which interval when (``detector.core.pace``): fast for a hold after the asset queues stir, at rest
otherwise; and which poll counts as a stir. Pure: monotonic seconds and fingerprints passed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import pytest

from detector.app.daemon import Daemon, Parts
from detector.app.leader import AlwaysLeader
from detector.app.ledger import MemoryLedger
from detector.config import Config, load
from detector.core.pace import Pace, stirred
from detector.core.ports import Polled
from detector.metrics import Metrics
from tests.daemon_harness import RecordingAlerter, RecordingRemediator
from tests.unit.test_idle_loop import IdleSource

FAST, REST, HOLD = 0.005, 0.25, 5.0


def _pace() -> Pace:
    return Pace(fast=FAST, rest=REST, hold=HOLD)


def test_rests_until_something_stirs() -> None:
    """A daemon that never saw a queue change nor an asset run polls at the rest interval."""
    pace = _pace()
    assert [pace.wait(t, stir=False) for t in (0.0, 1.0, 100.0)] == [REST, REST, REST]


def test_fast_for_the_hold_after_a_stir_then_rest() -> None:
    """After a stir: fast until ``hold`` has passed, then back to rest without another stir."""
    pace = _pace()
    assert pace.wait(10.0, stir=True) == FAST
    assert pace.wait(10.0 + HOLD - 0.001, stir=False) == FAST
    assert pace.wait(10.0 + HOLD, stir=False) == REST
    assert pace.wait(10.0 + 2 * HOLD, stir=False) == REST


def test_each_stir_extends_the_hold() -> None:
    """A second stir inside the hold (the race's second run, a new queue row) restarts it: the
    duplicate that follows the first run a loop later is still met by fast polls."""
    pace = _pace()
    pace.wait(0.0, stir=True)
    pace.wait(4.0, stir=True)
    assert pace.wait(8.0, stir=False) == FAST
    assert pace.wait(9.0, stir=False) == REST


def test_rest_never_polls_faster_than_the_poll_interval() -> None:
    """A rest interval set below ``poll_interval`` polls at ``poll_interval``: rest means slower."""
    pace = Pace(fast=0.5, rest=0.1, hold=1.0)
    assert pace.wait(0.0, stir=False) == 0.5
    assert pace.slowest == 0.5


def test_a_poll_that_found_asset_runs_is_followed_at_once() -> None:
    """The race's second run commits milliseconds after the first, often while the first is judged: the
    poll after one that found asset runs goes at once; the one after that is fast again, for the hold."""
    pace = _pace()
    assert pace.wait(0.0, stir=True, asset_runs=True) == 0.0
    assert pace.wait(0.01, stir=False) == FAST
    assert pace.wait(HOLD + 1.0, stir=False) == REST


@pytest.mark.parametrize(
    ("before", "after", "asset_runs", "expected"),
    [
        (None, (0, None, 0), 0, False),  # the first reading is a baseline, not a change
        ((1, "t1", 0), (1, "t1", 0), 0, False),  # a queue row that stands (an AND of assets waiting)
        ((0, None, 0), (1, "t1", 0), 0, True),  # a queue row appeared
        ((1, "t1", 0), (0, None, 0), 0, True),  # a run consumed it
        ((1, "t1", 1), (1, "t1", 0), 0, True),  # a run of a DAG held by max_active_runs ended
        ((1, "t1", 0), None, 0, False),  # a pass that read no fingerprint changes nothing
        ((1, "t1", 0), (1, "t1", 0), 1, True),  # a new asset-triggered run
        (None, None, 2, True),
    ],
)
def test_what_stirs(before: object, after: object, asset_runs: int, expected: bool) -> None:
    assert stirred(before, after, asset_runs) is expected  # type: ignore[arg-type]


# --- the daemon's loop: the wait after each poll ---------------------------------------------------


@dataclass
class StirringSource(IdleSource):
    """An idle source whose polls report the given stirs in turn (None: a source without a fingerprint)."""

    stirs: list[bool | None] = field(default_factory=list)
    asset_runs: dict[int, int] = field(default_factory=dict)  # poll number (from 1) -> its new asset runs

    def poll(self, now: datetime) -> Polled:
        self.polls += 1
        runs = self.asset_runs.get(self.polls, 0)
        return Polled(new_runs=runs, findings=[], stirred=self.stirs[self.polls - 1], asset_runs=runs)


class PauseRecorder(Daemon):
    """Records each pause instead of sleeping; stops after the source's last scripted poll."""

    waits: list[float]

    def _pause(self, seconds: float) -> None:
        self.waits.append(seconds)
        source = self.parts.source
        assert isinstance(source, StirringSource)
        if source.polls >= len(source.stirs):
            self.stop.set()


def _loop_waits(stirs: list[bool | None], asset_runs: dict[int, int] | None = None, **env: str) -> list[float]:
    config: Config = load(env={"DUPGUARD_DATABASE_URL": "sqlite:///x.db", **env})
    source = StirringSource(stirs=stirs, asset_runs=asset_runs or {})
    parts = Parts(
        source=source,
        leadership=AlwaysLeader(),
        ledger=MemoryLedger(),
        remediator=RecordingRemediator(),
        alerter=RecordingAlerter(),
        metrics=Metrics(),
    )
    daemon = PauseRecorder(config, parts)
    daemon.waits = []
    daemon._loop()
    return daemon.waits


def test_the_loop_rests_and_hurries_as_the_source_says() -> None:
    """The database source's polls: at rest the rest interval; after a stir the poll interval (the hold
    is long enough to cover these polls)."""
    waits = _loop_waits(
        [False, False, True, False],
        DUPGUARD_POLL_INTERVAL="5ms",
        DUPGUARD_POLL_REST_INTERVAL="300ms",
        DUPGUARD_POLL_HOLD="1h",
    )
    assert waits == [0.3, 0.3, 0.005, 0.005]


def test_a_source_without_a_fingerprint_polls_at_the_poll_interval() -> None:
    """The REST API source cannot see the queues (``stirred`` None): it keeps its one interval."""
    waits = _loop_waits([None, None], DUPGUARD_POLL_INTERVAL="250ms", DUPGUARD_POLL_REST_INTERVAL="2s")
    assert waits == [0.25, 0.25]


def test_the_loop_polls_again_at_once_after_finding_asset_runs() -> None:
    """The poll that found an asset run (the race's first) is followed at once, not after the poll interval:
    its partner, committed while the first was judged, is fetched without a pause."""
    waits = _loop_waits(
        [False, True, True, False],
        asset_runs={2: 1},
        DUPGUARD_POLL_INTERVAL="5ms",
        DUPGUARD_POLL_REST_INTERVAL="300ms",
        DUPGUARD_POLL_HOLD="1h",
    )
    assert waits == [0.3, 0.0, 0.005, 0.005]
