"""SIGTERM must stop the daemon whatever the main thread was doing (a hang seen under load: the
handler's ``stop.set()`` waited for the Event's lock, held by the main thread it interrupted inside
``stop.wait()``; gdb showed ``on_signal -> Event.set -> Condition.__enter__`` on top of ``Event.wait``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

from detector.app.run import stop_on_signal


def test_a_signal_landing_while_the_waiter_holds_the_events_lock_still_stops() -> None:
    """The handler runs in the thread that holds ``stop``'s internal lock, as Python runs it in the
    main thread in the middle of ``Event.wait``; it must return at once, and ``stop`` be set once the
    lock is let go."""
    stop = threading.Event()
    handler = stop_on_signal(stop)
    returned = threading.Event()

    def interrupted_waiter() -> None:
        with stop._cond:  # type: ignore[attr-defined]  # where Event.wait is when the signal lands
            handler(signal.SIGTERM, None)
            returned.set()

    thread = threading.Thread(target=interrupted_waiter, daemon=True)
    thread.start()
    thread.join(10)  # a bound for a hang, not a speed target: the handler does no waiting at all
    assert returned.is_set(), "the signal handler blocked on the lock its own thread holds"
    assert stop.wait(10), "stop was never set"


STUCK = """
import os, signal, threading, time
from detector import logs
from detector.app.run import stop_on_signal
logs.configure("info", "json")
stop, done = threading.Event(), threading.Event()
signal.signal(signal.SIGTERM, stop_on_signal(stop, done, deadline=0.5))
os.kill(os.getpid(), signal.SIGTERM)
stop.wait(10)
time.sleep(60)  # a shutdown step that never ends (done is never set)
"""


def test_a_shutdown_that_never_finishes_is_ended_at_the_deadline() -> None:
    """Whatever shutdown waits on, the process ends at the deadline after SIGTERM (the pod's grace
    period is what counts), saying so; it would have slept for a minute."""
    result = subprocess.run([sys.executable, "-c", STUCK], capture_output=True, text=True, timeout=30)
    events = [json.loads(line)["event"] for line in result.stderr.splitlines()]
    assert result.returncode == 0 and events == ["stopping", "shutdown_deadline"], result.stderr
