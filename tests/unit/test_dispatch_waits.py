"""How long the remediation dispatcher asks to wait, and when it stops waiting (the survivors
of ``detector/actions/remediation/dispatch.py`` that changed only a wait, benchmarks/results/mutation.md).

Nothing here measures time. Each wait the dispatcher makes is recorded where it is asked for, on clocks
the test moves: ``drain``'s polls (``run --once``), ``close``'s joins (SIGTERM's grace period), the
retry thread's wait for the next retry to come due, and a due retry's wait for room in a full queue
(the moments it can notice a shutdown). The durations compared are the ones the code asks for.
"""

from __future__ import annotations

import queue
import threading
import types
from typing import Any

import pytest

from detector.actions.remediation import dispatch
from detector.core.ports import Result
from tests.unit.test_dispatch_reports import _Blocking, _Frozen, _job, _Rig, _Scripted, _until, down, stopped


class _Time:
    """``dispatch.time``: a monotonic clock that moves only by what is slept or joined, every sleep kept."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if len(self.slept) > 1000:
            raise AssertionError(f"drain did not give up at its deadline: {self.slept[:3]} ...")


def _threading(**overrides: Any) -> types.SimpleNamespace:
    """``dispatch.threading`` with some of its classes replaced by recording ones."""
    names = {"Thread": threading.Thread, "Condition": threading.Condition, "Event": threading.Event}
    return types.SimpleNamespace(**(names | overrides))


def test_drain_polls_every_10_ms_and_gives_up_exactly_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run --once`` waits for its remediations with ``drain``: nobody serves the queue here, so it is
    never idle. A deadline already reached gives up before any poll; 50 ms is five polls of 10 ms, the
    last one landing exactly on the deadline."""
    clock = _Time()
    monkeypatch.setattr(dispatch, "time", clock)
    rig = _Rig(_Scripted(), workers=0)
    assert rig.dispatcher.drain(0.0)  # idle: nothing to wait for
    assert rig.dispatcher.submit(_job())
    assert not rig.dispatcher.drain(0.0)
    assert clock.slept == []
    assert not rig.dispatcher.drain(0.05)
    assert clock.slept == [0.01] * 5
    rig.dispatcher.close()


@pytest.mark.parametrize(
    ("timeout", "joins"),
    [
        (None, [2.0, 1.25, 0.5, 0.0]),  # the default: 2 s in all
        (1.0, [1.0, 0.25, 0.0, 0.0]),  # the daemon passes min(its shutdown timeout, 2 s)
    ],
)
def test_close_shares_one_deadline_among_its_threads_joins(
    monkeypatch: pytest.MonkeyPatch, timeout: float | None, joins: list[float]
) -> None:
    """Each join gets what is left of ``close``'s timeout, and none once it is spent, so SIGTERM ends
    within its grace period however many threads are stuck. Each join here takes 0.75 s of the
    test's clock."""
    clock = _Time()
    asked: list[float | None] = []

    class Thread(threading.Thread):
        def join(self, timeout: float | None = None) -> None:
            asked.append(timeout)
            super().join(timeout)
            clock.now += 0.75

    monkeypatch.setattr(dispatch, "time", clock)
    monkeypatch.setattr(dispatch, "threading", _threading(Thread=Thread))
    rig = _Rig(_Scripted(), workers=3)
    if timeout is None:
        rig.dispatcher.close()
    else:
        rig.dispatcher.close(timeout=timeout)
    assert asked == joins


@pytest.mark.parametrize(
    ("backoff", "wait"),
    [
        (0.25, 0.25),  # until the retry is due
        (4.0, 1.0),  # but at most a second at a time: a clock that moves without a notify is still read
    ],
)
def test_the_retry_thread_waits_until_the_next_retry_is_due(
    monkeypatch: pytest.MonkeyPatch, backoff: float, wait: float
) -> None:
    """After a failed attempt the retry is due one back-off later on the dispatcher's clock (frozen at
    100 s until the test moves it); the retry thread waits for exactly the time left, capped at 1 s,
    and with nothing scheduled it waits for a notify (None)."""
    clock = _Frozen()
    asked: set[float | None] = set()

    class Condition(threading.Condition):
        def wait(self, timeout: float | None = None) -> bool:
            asked.add(timeout)
            return super().wait(timeout)

    monkeypatch.setattr(dispatch, "threading", _threading(Condition=Condition))
    rig = _Rig(_Scripted(down, stopped), clock=clock, backoff=(backoff, 60.0))
    assert rig.dispatcher.submit(_job())
    assert rig.reported.wait(10)
    _until(lambda: bool(asked - {None}))  # waiting for the retry to come due
    clock.now = 100.0 + backoff
    assert rig.finals.wait(10), "not retried once its back-off ended"
    rig.dispatcher.close()
    assert asked - {None} == {wait}  # None: nothing scheduled, the thread waits for a notify
    assert [(r[0], r[2]) for r in rig.reports] == [(Result.FAILED, False), (Result.DONE, True)]


def test_a_due_retry_looks_for_room_in_a_full_queue_every_half_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """A retry that comes due while the queue is full waits for room 0.5 s at a time, never without a
    timeout: between two waits it sees a shutdown, so ``close`` is not held by a full queue."""
    puts: list[float | None] = []

    class Queue(queue.Queue[object]):
        def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
            if block:  # submit and close never block (put_nowait)
                puts.append(timeout)
            super().put(item, block, timeout)

    monkeypatch.setattr(dispatch, "queue", types.SimpleNamespace(Queue=Queue, Full=queue.Full))
    clock = _Frozen()
    busy = _Blocking(stopped)
    rig = _Rig(_Scripted(down, busy, stopped, stopped), workers=1, queue_size=1, clock=clock)
    assert rig.dispatcher.submit(_job())
    assert rig.reported.wait(10)  # its first attempt failed: a retry is due at 100.02
    assert rig.dispatcher.submit(_job())
    assert busy.entered.wait(10)  # the worker is busy
    assert rig.dispatcher.submit(_job())  # the queue is full
    clock.now = 100.0 + 0.02
    _until(lambda: len(puts) >= 2)  # the first wait for room ended without room; it looks again
    busy.release.set()
    assert rig.dispatcher.drain(10), rig.reports
    rig.dispatcher.close()
    assert set(puts) == {0.5}
    assert [r for r in rig.reports if r[2]] == [(Result.DONE, "stopped", True, False)] * 3
