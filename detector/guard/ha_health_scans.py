"""The findings behind the UI plugin's pages: ``dupguard scan`` and ``doctor`` as JSON, kept in memory.

A command and not dupguard's modules: the plugin runs in Airflow's API server, whose SQLAlchemy (1.4 on
Airflow 3.0/3.1) dupguard cannot use, and the guard's package brings none of dupguard's dependencies
(ui_plugin.py). Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any


class Scans:
    """The latest ``scan``/``doctor`` documents. A page never waits for a scan longer than it asks to: the
    first request starts one in the background, and one that finds the answer older than ``refresh``
    seconds starts the next (one at a time); meanwhile pages answer from memory."""

    def __init__(
        self,
        command: list[str],
        *,
        since: str,
        refresh: float,
        timeout: float,
        database_url: Callable[[], str],
    ) -> None:
        self.command = command
        self.since = since
        self.refresh = refresh
        self.timeout = timeout
        self.database_url = database_url
        self._refreshing = threading.Lock()  # held by the one refresh under way
        self._ready = threading.Event()  # set once the first documents are in
        self._at = float("-inf")
        self._docs: tuple[dict[str, Any], dict[str, Any] | None] | None = None

    def documents(self, wait: float | None = None) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
        """The documents; None if the first ones are not in within ``wait`` seconds (None: no limit)."""
        if time.monotonic() - self._at >= self.refresh and self._refreshing.acquire(blocking=False):
            threading.Thread(target=self._update_in_background, daemon=True).start()
        self._ready.wait(wait)
        return self._docs

    def _update_in_background(self) -> None:
        try:
            doctor = self._run("doctor")
            self._docs = (self._run("scan", "--since", self.since), None if doctor.get("error") else doctor)
            self._at = time.monotonic()
            self._ready.set()
        finally:
            self._refreshing.release()

    def _run(self, *args: str) -> dict[str, Any]:
        # The URL goes in the environment, never on the command line (``ps`` shows that to every user).
        env = dict(os.environ, DUPGUARD_DATABASE_URL=self.database_url())
        try:
            done = subprocess.run(
                [*self.command, *args, "--format", "json"],
                env=env,
                capture_output=True,
                timeout=self.timeout,
                check=False,
            )
            doc: dict[str, Any] = json.loads(done.stdout)
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            # Only the exception's kind: a message could quote the environment.
            message = f"{' '.join(self.command[:1])} {args[0]} failed ({type(exc).__name__})"
            return {"error": {"message": message}, "groups": [], "checks": {}}
        return doc
