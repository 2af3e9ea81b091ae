"""The per-channel bound on requests per minute (``detector.actions.alerts.pace``), on a fake clock."""

from __future__ import annotations

import threading

import pytest

from detector.actions.alerts.pace import MARGIN, WINDOW, Pace
from detector.errors import AlertDeliveryError
from tests.sinks import per_minute


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_burst_goes_at_once_up_to_the_bound_then_waits_for_the_window() -> None:
    """20 requests at once leave at once; the 21st leaves when the first is a window (and the margin) old."""
    t = FakeTime()
    pace = Pace(20, clock=t.clock, sleep=t.sleep)
    waits = [pace.wait() for _ in range(21)]
    assert waits[:20] == [0.0] * 20
    assert waits[20] == WINDOW + MARGIN
    assert t.now == WINDOW + MARGIN


def test_no_window_of_a_long_storm_holds_more_than_the_bound() -> None:
    """500 requests asked for as fast as possible, and 300 more one every second: no 60 s window holds
    more than 20 of the times they left (counted as the benchmark counts arrivals), and every one left."""
    t = FakeTime()
    pace = Pace(20, clock=t.clock, sleep=t.sleep)
    left = []
    for i in range(800):
        if i >= 500:
            t.now += 1.0
        pace.wait()
        left.append(t.now)
    assert len(left) == 800
    assert per_minute(left) == 20
    assert per_minute([x + 0.9 * (i % 2) for i, x in enumerate(left)]) <= 20  # each a little late, or not


def test_requests_spread_out_are_never_held() -> None:
    t = FakeTime()
    pace = Pace(20, clock=t.clock, sleep=t.sleep)
    for _ in range(100):
        assert pace.wait() == 0.0
        t.now += 3.1


def test_zero_is_no_bound() -> None:
    t = FakeTime()
    pace = Pace(0, clock=t.clock, sleep=t.sleep)
    assert sum(pace.wait() for _ in range(1000)) == 0.0 and t.now == 0.0


def test_a_request_waiting_at_shutdown_is_not_sent() -> None:
    """Once the alerter gives up at shutdown (``stop``), a request waiting for its turn raises instead of
    going out later from a thread nobody waits for; so does any further one."""
    stop = threading.Event()
    pace = Pace(1, stop=stop)
    pace.wait()
    outcome: list[BaseException | float] = []

    def second() -> None:
        try:
            outcome.append(pace.wait())
        except AlertDeliveryError as exc:
            outcome.append(exc)

    waiting = threading.Thread(target=second)
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive()  # held: the window is full
    stop.set()
    waiting.join(5)
    assert [str(e) for e in outcome] == ["not sent before shutdown"]
    with pytest.raises(AlertDeliveryError):
        pace.wait()
