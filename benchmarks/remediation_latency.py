"""Remediation latency: from detection (the moment ``execute()`` is called) to the committed state change.

Both backends, both writing modes, against a real Airflow 3.1.2 API server (tests.airflow_server)
on duplicates made by Airflow's own scheduler code (scenario ``race_asset_fanout``: three duplicate
pairs per load; the database is re-created from the scenario between loads, outside the measured
window). Each sample includes the guard's re-read; for ``api`` it includes the HTTP round trips
(token already cached, as in a running daemon), for ``db`` the locked transaction and its commit.

    .venv/bin/python -m benchmarks.remediation_latency [--samples 50]

Prints a table and writes benchmarks/results/remediation_latency.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from detector.config import Config
from detector.db import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.plan import Mode, plan
from detector.ports import Result
from detector.remediation import GuardedRemediator
from detector.remediation_api import ApiBackend, _Budget
from detector.remediation_db import DbBackend
from detector.scan import scan
from tests.airflow_server import AirflowServer, airflow_api_server
from tests.pg import Templates

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SCENARIO = "race_asset_fanout"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def measure(server: AirflowServer, backend_name: str, mode: Mode, samples: int) -> list[float]:
    config = Config.of(
        database_url=server.db_url,
        remediation=mode.value,
        remediation_backend=backend_name,
        airflow_api_url=server.url,
        airflow_username="admin",
        airflow_password="admin",  # noqa: S106 - the test server's throw-away user
    )
    api = ApiBackend.from_config(config, open_tables(server)) if backend_name == "api" else None
    if api is not None:
        api.tokens.get(_Budget())  # a running daemon holds a valid token already
    latencies: list[float] = []
    try:
        while len(latencies) < samples:
            url = server.reset(SCENARIO)
            engine = make_engine(parse_url(url))
            try:
                db = open_airflow_db(engine)
                stamp = datetime.now(UTC)
                actions = plan(scan(db, now=stamp).findings, mode, now=stamp)
                backend = api if api is not None else DbBackend(engine, db.tables)
                remediator = GuardedRemediator(
                    configured_mode=mode, backend=backend, engine=engine, tables=db.tables, metrics=Metrics()
                )
                if api is not None:  # the API server's pool reconnects to the re-created database first
                    warm(api, actions[0].dag_id, actions[0].kept_run_id)
                for action in actions[: samples - len(latencies)]:
                    started = time.perf_counter()
                    result = remediator.execute(action)
                    elapsed = time.perf_counter() - started
                    if result.result is not Result.DONE:
                        raise SystemExit(f"{backend_name}/{mode}: {result.result} {result.detail}")
                    latencies.append(elapsed)
            finally:
                engine.dispose()
    finally:
        if api is not None:
            api.close()
    return latencies


def open_tables(server: AirflowServer) -> Any:
    engine = make_engine(parse_url(server.db_url))
    try:
        return open_airflow_db(engine).tables
    finally:
        engine.dispose()


def warm(api: ApiBackend, dag_id: str, run_id: str) -> None:
    token = api.tokens.get(_Budget())
    for _ in range(2):
        response = api.dag_runs.get_dag_run_without_preload_content(
            dag_id, run_id, _request_timeout=api.timeout, _headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status == 200, response.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--version", default="3.1.2")
    args = parser.parse_args()
    templates = Templates(made={})
    rows: list[dict[str, Any]] = []
    try:
        with airflow_api_server(args.version, [SCENARIO], templates, Path(tempfile.mkdtemp())) as server:
            for backend in ("db", "api"):
                for mode in (Mode.FAIL, Mode.SKIP):
                    ms = [x * 1000 for x in measure(server, backend, mode, args.samples)]
                    rows.append(
                        {
                            "backend": backend,
                            "mode": mode.value,
                            "samples": len(ms),
                            "p50_ms": round(statistics.median(ms), 1),
                            "p90_ms": round(percentile(ms, 90), 1),
                            "p99_ms": round(percentile(ms, 99), 1),
                            "max_ms": round(max(ms), 1),
                        }
                    )
    finally:
        templates.drop_all()
    header = f"{'backend':8} {'mode':5} {'n':>4} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}"
    print(f"Remediation latency, execute() -> committed, Airflow {args.version} API server, {platform.node()}")
    print(header)
    for r in rows:
        print(
            f"{r['backend']:8} {r['mode']:5} {r['samples']:>4} {r['p50_ms']:>8} {r['p90_ms']:>8} "
            f"{r['p99_ms']:>8} {r['max_ms']:>8}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "remediation_latency.json").write_text(
        json.dumps({"airflow_version": args.version, "scenario": SCENARIO, "rows": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    main()
