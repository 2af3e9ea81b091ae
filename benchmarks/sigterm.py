"""Seconds from SIGTERM to the end of a real ``dupguard run`` while every alert endpoint (Slack's webhook
or its bot API, the JSON webhook, Alertmanager) and the Airflow API hang (it took 5.3-5.6 s on
717859f; the documented bound is 5 s), or with ``--peer trickling`` answer a byte a second (8.07 s under
load on 7717dd3). The setup is tests/integration/test_sigterm.py's, which asserts the bound; this reports
the figure: each Slack mode ``--repeats`` times, with the load average.

    DUPGUARD_TEST_DATABASE_URL=... .venv/bin/python -m benchmarks.sigterm [--repeats 5] [--peer trickling] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.provenance import provenance
from tests.integration.test_remediation_dispatch import HangingServer
from tests.integration.test_sigterm import stuck_daemon
from tests.pg import Templates
from tests.trickle import TricklingServer

KILLED_AFTER = 30.0  # a run that has not ended by then is recorded as such, not waited for


def once(url: str, slack: str, log: Path, peer: str) -> dict[str, Any]:
    hanging = TricklingServer() if peer == "trickling" else HangingServer()
    try:
        proc = stuck_daemon(url, log, hanging, slack)
        load = os.getloadavg()[0]
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=KILLED_AFTER)
            took: float | None = round(time.monotonic() - sent, 3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            took = None
    finally:
        hanging.close()
    return {"slack": slack, "peer": peer, "seconds": took, "load_1m": round(load, 2), "exit_code": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--peer", choices=["hanging", "trickling"], default="hanging")
    parser.add_argument("--out", type=Path, default=None, help="also write the results here (JSON)")
    args = parser.parse_args()
    templates = Templates(made={})
    runs = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.repeats):
                for slack in ("webhook", "bot"):
                    runs.append(once(templates.clone("3.1.2"), slack, Path(tmp) / f"{slack}-{i}.log", args.peer))
    finally:
        templates.drop_all()
    done = [r["seconds"] for r in runs if r["seconds"] is not None]
    summary = {"runs": len(runs), "not_ended": len(runs) - len(done), "max_seconds": max(done, default=None)}
    if done:
        summary |= {"median_seconds": round(statistics.median(done), 3), "min_seconds": min(done)}
    doc = {
        "benchmark": "sigterm",
        "provenance": provenance(),
        "cores": os.cpu_count(),
        "summary": summary,
        "runs": runs,
    }
    text = json.dumps(doc, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
