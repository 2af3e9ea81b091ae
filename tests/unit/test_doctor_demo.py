"""`dupguard doctor`, the first command the README recommends, on dupguard's own demo database, and on
a job table without the columns it reads: it answers, and says what it could not read."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from detector.app import demo
from detector.app.cli import main
from detector.config import SETTINGS


def _doctor(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, dict]:  # type: ignore[type-arg]
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    code = main(["doctor", "--database-url", f"sqlite:///{path}", "--format", "json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_doctor_reads_the_demo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "demo.db"
    demo.build(path)
    code, doc = _doctor(path, capsys, monkeypatch, "--since", "3650d")
    assert code == 0  # docs/tutorial.md: the incident is counted, nothing can duplicate now
    assert doc["duplicates"]["groups"] == 6
    # the demo's schedulers stopped long ago: none alive, which doctor can say because it could read it
    assert doc["schedulers_alive"] == 0 and doc["triggerers_alive"] == 0
    assert not any("job" in p for p in doc["problems"])


def test_job_table_without_state_is_said_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "demo.db"
    demo.build(path)
    with sqlite3.connect(path) as conn:  # a cut-down schema, as the demo's was
        for (name,) in conn.execute("SELECT name FROM pragma_table_info('job')").fetchall():
            if name in ("state", "latest_heartbeat"):
                conn.execute(f"ALTER TABLE job DROP COLUMN {name}")
    code, doc = _doctor(path, capsys, monkeypatch)
    assert code in (0, 1)
    assert doc["schedulers_alive"] is None and doc["triggerers_alive"] is None
    assert "table job lacks column state, latest_heartbeat: the figures read from it are unknown" in doc["problems"]
