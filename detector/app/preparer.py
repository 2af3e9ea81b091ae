"""Gets the remediation ready ahead of a duplicate (the api backend's token) in a thread of its own.

Why: this used to run inside the leader check, which the daemon also runs once before its
first poll. With Airflow's API hanging, the token request waits ``DUPGUARD_AIRFLOW_TIMEOUT`` (5 s),
so a starting leader watched nothing for that long, and each later check held the heartbeat past the
lease (3 check intervals): the leader kept dropping its term. Now a leader check only asks; only
this thread waits for the API (and a remediation, which asks for its token on its own).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from detector import logs
from detector.core.ports import Remediator

log = logs.get("dupguard.daemon")


class Preparer:
    """Runs ``remediator.prepare()`` when asked, one at a time; asks made meanwhile fold into one."""

    def __init__(self, remediator: Remediator, on_change: Callable[[], None]) -> None:
        self._remediator = remediator
        self._on_change = on_change  # called (from this thread) when ``problem`` changes
        self._due = threading.Event()
        self._closed = False
        self._start = threading.Lock()
        self._thread: threading.Thread | None = None
        self.problem: str | None = None  # why the remediation cannot act at once (last prepare)

    def request(self) -> None:
        """Ask for a preparation; returns at once."""
        with self._start:
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dupguard-prepare", daemon=True)
                self._thread.start()
        self._due.set()

    def close(self) -> None:
        """Stop after the preparation in flight (not waited for: it is bounded by the API timeout)."""
        with self._start:
            self._closed = True
        self._due.set()

    def _run(self) -> None:
        while True:
            self._due.wait()
            self._due.clear()
            if self._closed:
                return
            try:
                problem = self._remediator.prepare()
            except Exception:  # never raises by contract; a bug here must not end the thread
                log.exception("remediation_prepare_crashed")
                problem = "getting the remediation ready crashed (see the log)"
            if problem != self.problem:
                self.problem = problem
                self._on_change()
