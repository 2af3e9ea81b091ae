"""Logging set-up: JSON with Airflow 3's keys, and no stale stream after stderr is replaced."""

from __future__ import annotations

import io
import json
import sys

import pytest

from detector import logs


def test_json_lines_have_airflow_keys_and_follow_a_replaced_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """After configure, logs go to whatever sys.stderr is now, as JSON with timestamp/level/event/logger."""
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    logs.configure("info", "json")
    first.close()  # e.g. a test's capture ends
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logs.get("dupguard.test").info("something_happened", answer=42)
    record = json.loads(second.getvalue().strip().splitlines()[-1])
    assert {"timestamp", "level", "event", "logger"} <= record.keys()
    assert (record["event"], record["logger"], record["answer"]) == ("something_happened", "dupguard.test", 42)
