"""What the trigger_event kind costs the REST source's poll (`--source api`), on a real Airflow 3.1.2 API
server: requests, and the API server's CPU, of one poll that finds a new run, by the run's kind.

The server (tests.airflow_server, one uvicorn worker) serves the Airflow-made ``trigger_event_two_runs``
database (its ``orders_consumer`` DAG is serialized, so per-DAG lists answer). Runs are committed the
way the scheduler leaves them after its loop (running, ``start_date`` set:
benchmarks.api_source.StartedWriter): an ordinary run (a task's event), a trigger-made run (an event
as ``Trigger.submit_event`` writes it, SQS-shaped payload with a new MessageId), and a second copy of
that message making a run (the duplicate). The source polls in process (``ApiSource``, the daemon's
own code) through a counting proxy; each case is repeated and the median taken. The same runs are
polled as Airflow 3.2.2 would be watched (``copies_possible`` False: one triggerer runs an asset
trigger, so no events read for a run the list clears), the cost before the kind existed.

    .venv/bin/python -m benchmarks.api_trigger_event_cost [--repeats 15]

Results: benchmarks/results/api_trigger_event_cost.json (and a copy with a timestamp tag).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.api_source import StartedWriter, group_cpu_seconds
from benchmarks.provenance import provenance
from tests.airflow_server import AirflowServer, CountingProxy, airflow_api_server
from tests.pg import Templates

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SCENARIO = "trigger_event_two_runs"
DAG = "orders_consumer"
USER = {"airflow_username": "admin", "airflow_password": "admin"}  # the test server's user


def trigger_event(writer: StartedWriter, message_id: str, at: datetime) -> int:
    """An asset_event as Trigger.submit_event writes it: no source task, extra from_trigger + payload."""
    extra = {"from_trigger": True, "payload": {"status": "success", "message_batch": [{"MessageId": message_id}]}}
    with writer.conn, writer.conn.cursor() as cur:
        cur.execute(
            "INSERT INTO asset_event (asset_id, extra, source_map_index, timestamp) "
            "VALUES (1, %s, -1, %s) RETURNING id",
            (json.dumps(extra), at),
        )
        return int(cur.fetchone()[0])


def one_poll(
    server: AirflowServer, version: str, make: Callable[[StartedWriter], None], repeats: int
) -> dict[str, Any]:
    """Median requests and API-server CPU of the poll that finds what ``make`` committed."""
    from detector.airflowapi.session import Session
    from detector.app.ledger import MemoryLedger
    from detector.config import Config
    from detector.metrics import Metrics
    from detector.sources.api.reader import Reader
    from detector.sources.api.source import ApiSource

    requests, cpu_ms, found = [], [], []
    pgid = server.process.pid
    for _ in range(repeats):
        server.reset(SCENARIO)
        writer = StartedWriter(server.db_url, seed=11)
        with CountingProxy(server.port) as proxy:
            config = Config.of(source="api", airflow_api_url=proxy.url, startup_lookback=timedelta(minutes=1), **USER)
            src = ApiSource(config, Reader(Session.from_config(config)), MemoryLedger(), Metrics(), version=version)
            now = datetime.now(UTC)
            src.start(now)
            for _ in range(2):  # the first full read, then one idle poll (the token is fetched by now)
                src.poll(now)
                src.commit()
            make(writer)
            before, cpu0 = sum(proxy.requests.values()), group_cpu_seconds(pgid)
            polled = src.poll(datetime.now(UTC))
            src.commit()
            cpu_ms.append(1000 * (group_cpu_seconds(pgid) - cpu0))
            requests.append(sum(proxy.requests.values()) - before)
            found.append(len(polled.findings))
            src.close()
        writer.close()
    return {
        "requests_median": statistics.median(requests),
        "requests_max": max(requests),
        "api_cpu_ms_median": round(statistics.median(cpu_ms), 1),
        "groups_found": sorted(set(found)),
    }


def cases() -> dict[str, Callable[[StartedWriter], None]]:
    def idle(writer: StartedWriter) -> None:
        del writer

    def ordinary(writer: StartedWriter) -> None:
        at = datetime.now(UTC)
        writer.run(DAG, at, [writer.event(at)])

    def trigger_made(writer: StartedWriter) -> None:
        at = datetime.now(UTC)
        writer.run(DAG, at, [trigger_event(writer, str(uuid.uuid4()), at)])

    def second_copy(writer: StartedWriter) -> None:
        message, at = str(uuid.uuid4()), datetime.now(UTC)
        writer.run(DAG, at, [trigger_event(writer, message, at)])
        later = at + timedelta(milliseconds=300)
        writer.run(DAG, later, [trigger_event(writer, message, later)])

    return {
        "idle": idle,
        "ordinary_run": ordinary,
        "trigger_made_run": trigger_made,
        "two_copies_two_runs": second_copy,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("DUPGUARD_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:55432/postgres")
    templates = Templates(made={})
    results: dict[str, Any] = {}
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            airflow_api_server("3.1.2", [SCENARIO], templates, Path(tmp)) as server,
        ):
            time.sleep(3)
            for version in ("3.1.2", "3.2.2"):
                for name, make in cases().items():
                    results[f"{name}@{version}"] = one_poll(server, version, make, args.repeats)
                    print(name, version, json.dumps(results[f"{name}@{version}"]), flush=True)
    finally:
        templates.drop_all()
    RESULTS.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": "api_trigger_event_cost",
        "at": datetime.now(UTC).isoformat(),
        "args": vars(args),
        "server": "Airflow 3.1.2 api-server, one worker; '@3.2.2': the same server watched as 3.2.2 would be",
        "results": results,
        "provenance": provenance(),
    }
    tag = datetime.now(UTC).strftime("%Y%m%d-%H%M")
    for name in ("api_trigger_event_cost.json", f"api_trigger_event_cost-{tag}.json"):
        (RESULTS / name).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
