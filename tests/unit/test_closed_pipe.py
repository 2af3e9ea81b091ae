"""A reader that stops reading (``dupguard scan --format json | head``) ends dupguard quietly.

The reader's end of the pipe is closed before dupguard writes a byte, so every write fails with EPIPE
(what ``head`` does one time in a few, depending on who is first): no traceback, and the exit status a
shell gives a writer killed by SIGPIPE (141), as ``yes | head`` does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from detector.app import demo

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("fmt", ["json", "table"])
def test_scan_into_a_closed_pipe_says_nothing_and_exits_141(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / "airflow.db"
    demo.build(path)
    args = [sys.executable, "-m", "detector", "scan", "--database-url", f"sqlite:///{path}", "--format", fmt]
    with subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before the first write
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141
    assert "Traceback" not in err and "BrokenPipeError" not in err
    assert err == ""
