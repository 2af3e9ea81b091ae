"""Detection latency while every remediation hangs on the Airflow API: detection must not wait for it.

`dupguard run` as its own process on the real Airflow 3.1.2 schema with ``DUPGUARD_REMEDIATION=fail``
and the ``api`` backend pointed at a local TCP server that accepts connections and never answers
(default ``DUPGUARD_AIRFLOW_TIMEOUT`` of 5 s: each action holds a worker ~21 s, 4 attempts, then
is retried later). Duplicate pairs are
committed at random moments (0.2-1.0 s apart); latency = the ``duplicate_detected`` log line minus
the wall clock right after the duplicate's COMMIT returned. The same load with ``dry-run`` (nothing
hangs) is the baseline. ``--code DIR`` runs the daemon from another checkout (e.g. the commit before
the worker pool) for a before/after comparison.

    .venv/bin/python -m benchmarks.detection_api_hang [--pairs 60] [--code /path/to/old/checkout]

Uses its own PostgreSQL cluster (port 55470, fsync off, as benchmarks.detection_latency); prints a
table and writes benchmarks/results/detection_api_hang.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.detection_latency import ROOT, fresh_db, pct, start_cluster, stop_cluster, wait_watching
from benchmarks.provenance import provenance
from tests.writer import AirflowWriter

RESULTS = ROOT / "benchmarks" / "results"


class HangingServer:
    """Accepts TCP connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self.held:
            conn.close()


def measure(
    url: str, label: str, mode: str, api_url: str | None, pairs: int, code: Path, workdir: Path
) -> dict[str, Any]:
    name = "hang_" + "".join(c if c.isalnum() else "_" for c in label.lower())
    db_url = fresh_db(url, name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "PYTHONPATH": str(code),
        "DUPGUARD_DATABASE_URL": db_url,
        "DUPGUARD_LOG_FORMAT": "json",
        "DUPGUARD_HTTP_PORT": "0",
        "DUPGUARD_LEDGER": "off",
        "DUPGUARD_REMEDIATION": mode,
    }
    if api_url is not None:
        env |= {"DUPGUARD_AIRFLOW_API_URL": api_url, "DUPGUARD_AIRFLOW_TOKEN": "static-token"}
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "detector", "run"], env=env, stdout=out, stderr=out, cwd=code)
    commits: dict[str, float] = {}
    try:
        wait_watching(proc, log)
        writer, rng = AirflowWriter(db_url, seed=1), random.Random(2)
        for i in range(pairs):
            time.sleep(rng.uniform(0.2, 1.0))
            _first, dup = writer.duplicate_pair(f"consumer_{i}", gap=timedelta(0))
            commits[dup.run_id] = dup.committed_at.timestamp()
        time.sleep(2)
        writer.close()
    finally:
        proc.terminate()
        stopped = True
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:  # the old daemon: its loop is stuck in a remediation
            stopped = False
            proc.kill()
            proc.wait(15)
    latencies, finished = [], 0
    for line in log.read_text().splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event.get("event") == "duplicate_detected":
            for run_id in event["duplicate_runs"]:
                if run_id in commits:
                    ts = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                    latencies.append(1000 * (ts - commits[run_id]))
        elif event.get("event") == "remediation" and event.get("result") in ("done", "failed"):
            finished += 1
    return {
        "daemon": label,
        "pairs": pairs,
        "detected": len(latencies),
        "remediations_finished": finished,
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(pct(latencies, 0.99), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "stopped_within_15s_of_sigterm": stopped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=60)
    parser.add_argument("--code", type=Path, default=None, help="also measure the daemon of this checkout")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dupguard-bench-"))
    workdir.chmod(0o711)
    data = workdir / "pg"
    url = start_cluster(data)
    hanging = HangingServer()
    rows = []
    try:
        rows.append(measure(url, "dry-run (baseline)", "dry-run", None, args.pairs, ROOT, workdir))
        rows.append(measure(url, "fail, API hangs", "fail", hanging.url, args.pairs, ROOT, workdir))
        if args.code is not None:
            rows.append(measure(url, f"fail, API hangs ({args.code.name})", "fail", hanging.url, args.pairs,
                                args.code.resolve(), workdir))  # fmt: skip
    finally:
        hanging.close()
        stop_cluster(data)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for row in rows:
        row["provenance"] = provenance()
    (RESULTS / "detection_api_hang.json").write_text(json.dumps(rows, indent=2) + "\n")
    header = ["daemon", "detected", "remediations_finished", "p50_ms", "p99_ms", "max_ms"]
    header.append("stopped_within_15s_of_sigterm")
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for r in rows:
        cells = (str(r[h]) if h != "detected" else f"{r['detected']}/{r['pairs']}" for h in header)
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
