"""The daemon's idle loop (``Daemon._loop``): what its pauses and its last-poll gauge keep while the
loop got cheaper (benchmarks/results/measurements.md, "The idle loop's CPU"). A short pause sleeps instead of waiting
on ``stop``; a long one must still end the moment ``stop`` is set (SIGTERM within the grace period),
and the gauge, now read at scrape time, must still show the last successful poll."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime

from detector.app.daemon import Daemon, Parts
from detector.app.leader import AlwaysLeader
from detector.app.ledger import MemoryLedger
from detector.config import Config, load
from detector.core.model import Finding
from detector.core.ports import Polled
from detector.metrics import Metrics
from tests.daemon_harness import RecordingAlerter, RecordingRemediator

STAMP = "dupguard_last_successful_poll_timestamp_seconds"


@dataclass
class IdleSource:
    """A source with nothing new; counts its polls and says when the first one happened."""

    name: str = "database"
    family: str = "3.1"
    coverage_gap: str | None = None
    watching: bool = False
    polls: int = 0
    polled: threading.Event = field(default_factory=threading.Event)

    def ping(self) -> str | None:
        return None

    def start(self, now: datetime) -> None:
        self.watching = True

    def end(self) -> None:
        self.watching = False

    def stood_by(self, live_leader: bool) -> None:
        return None

    def poll(self, now: datetime) -> Polled:
        self.polls += 1
        self.polled.set()
        return Polled(new_runs=0, findings=[])

    def commit(self) -> None:
        return None

    def failed(self, exc: BaseException) -> str:
        return str(exc)

    def rejudge(self, dag_id: str, run_id: str, now: datetime) -> list[Finding] | None:
        return None

    def summary(self) -> dict[str, object]:
        return {}

    def close(self) -> None:
        return None


def _daemon(poll_interval: str) -> tuple[Daemon, IdleSource, Metrics]:
    config: Config = load(env={"DUPGUARD_DATABASE_URL": "sqlite:///x.db", "DUPGUARD_POLL_INTERVAL": poll_interval})
    source, metrics = IdleSource(), Metrics()
    parts = Parts(
        source=source,
        leadership=AlwaysLeader(),
        ledger=MemoryLedger(),
        remediator=RecordingRemediator(),
        alerter=RecordingAlerter(),
        metrics=metrics,
    )
    return Daemon(config, parts), source, metrics


def _loop_in_thread(daemon: Daemon) -> threading.Thread:
    thread = threading.Thread(target=daemon._loop, daemon=True)
    thread.start()
    return thread


def test_a_long_pause_ends_when_stop_is_set() -> None:
    """At an hour's poll interval the loop sleeps an hour after its first poll: ``stop`` must end that
    pause at once, not after it (a sleep there would outlast any pod's grace period)."""
    daemon, source, _ = _daemon("1h")
    thread = _loop_in_thread(daemon)
    assert source.polled.wait(30), "the loop never polled"
    daemon.stop.set()
    thread.join(30)  # a bound for a hang (the pause is an hour), not a speed figure
    assert not thread.is_alive(), "stop did not end the loop's long pause"
    assert source.polls == 1


def test_a_short_pause_lets_no_pass_start_after_stop() -> None:
    """At the default 10 ms the loop sleeps between passes; once ``stop`` is set it ends at the next
    turn: at most the pass already under way when it was set, none after."""
    daemon, source, _ = _daemon("10ms")
    thread = _loop_in_thread(daemon)
    assert source.polled.wait(30), "the loop never polled"
    daemon.stop.set()
    at_stop = source.polls
    thread.join(30)
    assert not thread.is_alive(), "stop did not end the loop"
    assert source.polls - at_stop <= 1


def test_the_last_poll_gauge_shows_the_last_successful_poll() -> None:
    """0 before any poll (the alert rules treat 0 as never polled), then the Unix time of the last
    successful pass, read when scraped."""
    daemon, _, metrics = _daemon("10ms")
    assert metrics.registry.get_sample_value(STAMP) == 0.0
    before = datetime.now().timestamp()
    assert daemon.poll_pass()
    stamp = metrics.registry.get_sample_value(STAMP)
    assert stamp is not None and before <= stamp <= datetime.now().timestamp()
    assert daemon.poll_pass()
    again = metrics.registry.get_sample_value(STAMP)
    assert again is not None and again >= stamp
