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


CHILD = """
import logging, warnings
from detector import logs
logs.configure("info", "json")
logs.get("dupguard.test").info("own_event", answer=42)
logging.getLogger("sqlalchemy.pool").warning("connection %s invalidated", "c1")
logging.getLogger("urllib3.connectionpool").info("below the library threshold")
try:
    {}["missing"]
except KeyError:
    logging.getLogger("slack_sdk").exception("delivery failed")
    logs.get("dupguard.test").exception("own_failure")
warnings.warn("a library warning", UserWarning, stacklevel=1)
"""


def test_every_line_is_json_in_airflow_key_order_with_structured_exceptions() -> None:
    """JSON mode, in a real process: dupguard's lines, other libraries' stdlib logging and Python warnings
    are all one JSON object per line, starting timestamp, level, event, logger; exceptions are fields."""
    import subprocess

    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    lines = result.stderr.strip().splitlines()
    records = [json.loads(line) for line in lines]  # fails on any non-JSON line
    assert [r["event"] for r in records][:2] == ["own_event", "connection c1 invalidated"]
    assert len(records) == 5, "INFO of other libraries stays below their WARNING threshold"
    for record in records:
        assert list(record)[:4] == ["timestamp", "level", "event", "logger"], record
    by_event = {r["event"]: r for r in records}
    assert by_event["connection c1 invalidated"]["logger"] == "sqlalchemy.pool"
    for name in ("delivery failed", "own_failure"):
        (exception,) = by_event[name]["exception"]
        assert exception["exc_type"] == "KeyError" and exception["frames"], by_event[name]
        assert by_event[name]["level"] == "error"
    (warning,) = [r for r in records if r["logger"] == "py.warnings"]
    assert "a library warning" in warning["event"] and warning["level"] == "warning"


THREADS = """
import logging, sys, threading
from detector import logs
logs.configure("info", "json")
sys.setswitchinterval(1e-6)  # threads switch as often as the interpreter allows: any unlocked write interleaves
mine, scheduler = logs.get("dupguard.daemon"), logging.getLogger("apscheduler.executors.default")
def own(n):
    for i in range(400):
        mine.warning("poll_failed", thread=n, i=i, error="x" * 200)
def library(n):
    for i in range(400):
        scheduler.warning('Run time of job "Daemon.check_leader" was missed by 0:00:%02d.%d', n, i)
threads = [threading.Thread(target=f, args=(n,)) for n in range(4) for f in (own, library)]
for t in threads: t.start()
for t in threads: t.join()
"""


def test_one_json_object_per_line_from_every_thread_and_logger() -> None:
    """dupguard's structlog lines and a library's stdlib ``logging`` (APScheduler's "was missed" warning)
    written at once from many threads: every line is one whole JSON object, none is lost. Two records
    ended up on one line when the two paths wrote to stderr under different locks."""
    import subprocess

    result = subprocess.run([sys.executable, "-c", THREADS], capture_output=True, text=True, check=True, timeout=120)
    lines = result.stderr.splitlines()
    records = [json.loads(line) for line in lines]  # fails on two records on one line, or half of one
    assert all(isinstance(r, dict) for r in records)
    assert sum(r["logger"] == "dupguard.daemon" for r in records) == 4 * 400
    assert sum(r["logger"] == "apscheduler.executors.default" for r in records) == 4 * 400


def test_console_lines_escape_terminal_sequences_of_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """A DAG or run id is whatever a DAG author wrote: in console mode ``\\x1b[2J`` (clear screen), a
    newline that forges a second line and ``\\u202e`` (reverse text) are shown escaped, as the table
    output shows them, never obeyed by the terminal of whoever reads the log; lists too."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    logs.configure("info", "console")
    logs.get("dupguard.test").info("duplicate_detected", dag_id="etl\x1b[2J", run_ids=["a\x1b]0;x\x07"], note="a\nb")
    logs.get("dupguard.test").info("kept \u202erun")
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, repr(text)
    assert "etl\\x1b[2J" in text and "a\\nb" in text and "\\u202e" in text
    assert len(text.splitlines()) == 2


def test_console_tracebacks_escape_terminal_sequences_and_show_no_local_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An exception's message is text a DAG author may have written too (a DAG id in an error): in the
    console its ``\\x1b[2J`` and ``\\u202e`` are shown escaped like any value's, the traceback keeps its
    lines; and no frame's local variables are printed (they may hold secrets), whichever traceback
    formatter structlog would pick (rich's, where rich is installed, shows them)."""
    out = io.StringIO()
    monkeypatch.setattr(sys, "stderr", out)
    logs.configure("info", "console")

    def fail(dag_id: str) -> None:
        password = "hunter2-in-a-local"  # noqa: F841 - what a frame's locals may hold
        raise ValueError(f"no such DAG {dag_id}")

    try:
        fail("etl\x1b[2J\u202e")
    except ValueError:
        logs.get("dupguard.test").exception("poll_crashed")
    text = out.getvalue()
    assert "\x1b" not in text and "\u202e" not in text, repr(text)
    assert "ValueError: no such DAG etl\\x1b[2J\\u202e" in text
    assert "Traceback (most recent call last):" in text and len(text.splitlines()) > 3
    assert "hunter2" not in text
