"""`dupguard run --source api` against a real Airflow 3.1.2 API server: detection latency, requests per
minute (idle and at 10 new runs per second) and the API server's added CPU.

The API server (tests.airflow_server, one uvicorn worker) serves a database made by Airflow's own
scheduler code (fixture ``race_asset_fanout``: its DAGs are serialized, so per-DAG lists answer).
New runs are committed into that database by ``tests.writer.AirflowWriter`` the way the scheduler
commits them, already started (state running, ``start_date`` set: the scheduler starts a new run in
the loop that made it, 11-51 ms after creation, docs/explanation/airflow-internals.md, "From a new run to a running
task"; the API cannot serve the events of a run
before that, apache/airflow#71360). Latency = the ``duplicate_detected`` log line minus the wall clock
right after the duplicate's COMMIT returned. Requests are counted by a forwarding proxy
(tests.airflow_server.CountingProxy). CPU: /proc of the API server's process group (the server and
its worker), over the same wall-clock window with and without dupguard.

    .venv/bin/python -m benchmarks.api_source [--intervals 250ms,1s] [--pairs 40] [--window 30]

Last, with no dupguard running: the API server's CPU per request (a count, a page of 10 runs), the
floor those set for seeing 10 new runs a second at a 250 ms poll, and the CPU of a bare client that
only reads the newest page every interval while 10 runs/s are written (the least any poller costs).

Results: benchmarks/results/api_source.json (and a copy with a timestamp tag).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.provenance import provenance
from detector.durations import parse_duration
from tests.airflow_server import AirflowServer, CountingProxy, airflow_api_server
from tests.pg import Templates
from tests.writer import AirflowWriter

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
CLK = os.sysconf("SC_CLK_TCK")
SCENARIO = "race_asset_fanout"
DAGS = ("orders_consumer_1", "orders_consumer_2", "orders_consumer_3")


def group_cpu_seconds(pgid: int) -> float:
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += (int(fields[11]) + int(fields[12])) / CLK
    return total


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class StartedWriter(AirflowWriter):
    """Runs committed as the scheduler leaves them after its loop: running, with a start_date."""

    def run(self, dag_id: str, run_after: datetime, events: list[int], **kwargs: Any) -> Any:  # type: ignore[override]
        from tests.writer import Committed

        with self.conn:
            run_pk, run_id = self.begin_run(dag_id, run_after, events, **kwargs)
            with self.conn.cursor() as cur:
                cur.execute("UPDATE dag_run SET state='running', start_date=now() WHERE id=%s", (run_pk,))
        return Committed(run_pk, run_id, datetime.now(UTC))


def events(log: Path) -> list[dict[str, Any]]:
    text = log.read_text()
    out = []
    for line in text[: text.rfind("\n") + 1].splitlines():
        if line.startswith("{"):
            e = json.loads(line)
            e["_ts"] = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
            out.append(e)
    return out


@contextmanager
def daemon(url: str, interval: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "DUPGUARD_SOURCE": "api",
        "DUPGUARD_AIRFLOW_API_URL": url,
        "DUPGUARD_AIRFLOW_USERNAME": "admin",
        "DUPGUARD_AIRFLOW_PASSWORD": "admin",
        "DUPGUARD_LOG_FORMAT": "json",
        "DUPGUARD_POLL_INTERVAL": interval,
        "DUPGUARD_HTTP_PORT": "0",
        "DUPGUARD_STARTUP_LOOKBACK": "1m",
    }  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "detector", "run"], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 60
        while not any(e.get("event") == "watching" for e in events(log)):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"dupguard did not start:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        time.sleep(2)  # first polls, token
        yield proc
    finally:
        proc.terminate()
        proc.wait(15)


def load(writer: AirflowWriter, rate: float, seconds: float, stop: threading.Event) -> int:
    """Ordinary asset runs (each alone: its own event and run_after) at ``rate`` per second."""
    made, start = 0, time.monotonic()
    while not stop.is_set() and time.monotonic() - start < seconds:
        writer.ordinary(DAGS[made % len(DAGS)])  # DAGs Airflow knows: the API lists runs of known DAGs only
        made += 1
        time.sleep(max(0.0, start + made / rate - time.monotonic()))
    return made


def measure(server: AirflowServer, interval: str, pairs: int, window: float, work: Path) -> dict[str, Any]:
    pgid = server.process.pid
    writer = StartedWriter(server.db_url, seed=7)
    out: dict[str, Any] = {"interval": interval}
    # Baselines without dupguard: the API server idle, and serving nothing while 10 runs/s are written.
    cpu0, t0 = group_cpu_seconds(pgid), time.monotonic()
    time.sleep(window)
    idle_cpu = (group_cpu_seconds(pgid) - cpu0) / (time.monotonic() - t0)
    out["api_server_cpu_idle_pct"] = round(100 * idle_cpu, 3)
    with CountingProxy(server.port) as proxy, daemon(proxy.url, interval, work / f"run-{interval}.log"):
        log = work / f"run-{interval}.log"
        r0, cpu0, t0 = sum(proxy.requests.values()), group_cpu_seconds(pgid), time.monotonic()
        time.sleep(window)
        elapsed = time.monotonic() - t0
        out["requests_per_min_idle"] = round(60 * (sum(proxy.requests.values()) - r0) / elapsed, 1)
        with_dupguard_idle = (group_cpu_seconds(pgid) - cpu0) / elapsed
        out["api_server_cpu_with_dupguard_idle_pct"] = round(100 * with_dupguard_idle, 3)
        out["api_server_added_cpu_idle_pct_of_core"] = round(100 * (with_dupguard_idle - idle_cpu), 3)
        out["api_server_added_cpu_idle_ratio"] = (
            round((with_dupguard_idle - idle_cpu) / idle_cpu, 2) if idle_cpu else None
        )
        # 10 new runs per second.
        stop = threading.Event()
        r0, cpu0, t0 = sum(proxy.requests.values()), group_cpu_seconds(pgid), time.monotonic()
        made = load(writer, 10.0, window, stop)
        elapsed = time.monotonic() - t0
        out["runs_written_at_10_per_s"] = made
        out["requests_per_min_at_10_runs_per_s"] = round(60 * (sum(proxy.requests.values()) - r0) / elapsed, 1)
        at_load = (group_cpu_seconds(pgid) - cpu0) / elapsed
        out["api_server_cpu_at_10_runs_per_s_pct"] = round(100 * at_load, 3)
        # Without a client the API server does no more work when the scheduler writes runs: its idle CPU
        # is the baseline for the load too.
        out["api_server_added_cpu_at_10_runs_per_s_pct_of_core"] = round(100 * (at_load - idle_cpu), 3)
        out["api_server_added_cpu_at_10_runs_per_s_ratio"] = (
            round((at_load - idle_cpu) / idle_cpu, 2) if idle_cpu else None
        )
        out["requests_by_path_at_load"] = _by_kind(proxy)
        # Latency of duplicates committed at random moments.
        rng, commits = random.Random(11), {}
        time.sleep(2)
        for i in range(pairs):
            time.sleep(rng.uniform(0.2, 1.0))
            _first, dup = writer.duplicate_pair(DAGS[i % len(DAGS)], gap=timedelta(0))
            commits[dup.run_id] = dup.committed_at.timestamp()
        time.sleep(3)
        lat = [
            1000 * (e["_ts"] - commits[r])
            for e in events(log)
            if e.get("event") == "duplicate_detected"
            for r in e.get("duplicate_runs", [])
            if r in commits
        ]
    writer.close()
    out |= {
        "pairs": pairs,
        "detected": len(lat),
        "p50_ms": round(statistics.median(lat), 1) if lat else None,
        "p99_ms": round(pct(lat, 0.99), 1) if lat else None,
        "max_ms": round(max(lat), 1) if lat else None,
        "latencies_ms": [round(x, 1) for x in lat],
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    out |= unit_costs(server, StartedWriter(server.db_url, seed=8))
    seconds = parse_duration(interval).total_seconds()
    out["bare_client_cpu_pct_at_10_runs_per_s"] = bare_client(server, StartedWriter(server.db_url, seed=9), seconds)
    return out


def unit_costs(server: AirflowServer, writer: AirflowWriter, repeats: int = 60) -> dict[str, Any]:
    """What one request costs Airflow's API server, with no dupguard running: a count (``limit=0``,
    the idle poll) and a page of 10 runs; the difference is the cost of serialising a run. These set
    the floor of any client that must see every new run once through the public list."""
    from detector.airflowapi.session import Session
    from detector.config import Config
    from detector.sources.api.reader import Reader

    for i in range(12):  # runs to serialise
        writer.ordinary(DAGS[i % len(DAGS)])
    user = {"airflow_username": "admin", "airflow_password": "admin"}  # the test server's user
    config = Config.of(source="api", airflow_api_url=server.url, **user)
    reader = Reader(Session.from_config(config))
    since = datetime.now(UTC) - timedelta(minutes=5)
    reader.count_asset_runs(run_after_gte=since)  # token
    out: dict[str, Any] = {}
    pgid = server.process.pid
    for name, call in (
        ("count", lambda: reader.count_asset_runs(run_after_gte=since)),
        ("page_of_10", lambda: reader.newest_asset_runs(run_after_gte=since, offset=0, limit=10)),
    ):
        cpu0 = group_cpu_seconds(pgid)
        for _ in range(repeats):
            call()
        out[f"api_cpu_ms_per_{name}"] = round(1000 * (group_cpu_seconds(pgid) - cpu0) / repeats, 2)
    reader.http.close()
    out["api_cpu_ms_per_run_serialised"] = round(
        (out["api_cpu_ms_per_page_of_10"] - out["api_cpu_ms_per_count"]) / 10, 2
    )
    # Seeing 10 new runs a second at all: 10 runs serialised, plus the requests of 4 polls a second.
    out["floor_pct_at_10_runs_per_s_250ms"] = round(
        (10 * out["api_cpu_ms_per_run_serialised"] + 4 * out["api_cpu_ms_per_count"]) / 10, 2
    )
    return out


def bare_client(server: AirflowServer, writer: AirflowWriter, interval: float, seconds: float = 20.0) -> float:
    """The API server's added CPU (% of a core) for the least any poller can do while 10 runs/s are
    written: every ``interval`` one request for the newest runs written since the last one (a page of
    ``10 * interval`` runs, no count, no judging). What dupguard adds above this is its own."""
    from detector.airflowapi.session import Session
    from detector.config import Config
    from detector.sources.api.reader import Reader

    user = {"airflow_username": "admin", "airflow_password": "admin"}  # the test server's user
    reader = Reader(Session.from_config(Config.of(source="api", airflow_api_url=server.url, **user)))
    since = datetime.now(UTC) - timedelta(minutes=1)
    reader.count_asset_runs(run_after_gte=since)  # token
    page = max(1, round(10 * interval))
    stop = threading.Event()
    writing = threading.Thread(target=load, args=(writer, 10.0, seconds, stop))
    pgid = server.process.pid
    cpu0, t0 = group_cpu_seconds(pgid), time.monotonic()
    writing.start()
    while writing.is_alive():
        reader.newest_asset_runs(run_after_gte=since, offset=0, limit=page)
        time.sleep(interval)
    used = (group_cpu_seconds(pgid) - cpu0) / (time.monotonic() - t0)
    reader.http.close()
    return round(100 * used, 2)


def _by_kind(proxy: CountingProxy) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for (method, path), n in proxy.requests.items():
        if path.endswith("/upstreamAssetEvents"):
            kind = "upstreamAssetEvents"
        elif path.endswith("/taskInstances"):
            kind = "taskInstances"
        elif path.startswith("/api/v2/dags/~/dagRuns"):
            kind = "tail (dags/~/dagRuns)"
        elif "/dagRuns" in path:
            kind = f"{method} dag runs of one DAG"
        else:
            kind = f"{method} {path}"
        kinds[kind] = kinds.get(kind, 0) + n
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--intervals", default="250ms,1s")
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--window", type=float, default=30.0, help="seconds of each idle / load measurement")
    parser.add_argument("--workdir", help="keep the daemon logs here [default: a temporary folder]")
    args = parser.parse_args()
    os.environ.setdefault("DUPGUARD_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:55432/postgres")
    templates = Templates(made={})
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(args.workdir or tmp)
            work.mkdir(parents=True, exist_ok=True)
            with airflow_api_server("3.1.2", [SCENARIO], templates, work) as server:
                for interval in args.intervals.split(","):
                    server.reset(SCENARIO)
                    time.sleep(3)
                    results.append(measure(server, interval, args.pairs, args.window, work))
                    print(json.dumps({k: v for k, v in results[-1].items() if k != "latencies_ms"}), flush=True)
    finally:
        templates.drop_all()
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "api_source", "at": datetime.now(UTC).isoformat(), "args": vars(args), "results": results}
    doc["provenance"] = provenance()
    tag = datetime.now(UTC).strftime("%Y%m%d-%H%M")
    for name in ("api_source.json", f"api_source-{tag}.json"):
        (RESULTS / name).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
