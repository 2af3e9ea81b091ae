"""Remediation latency: from detection (the moment ``execute()`` is called) to the committed state change.

Both backends, both writing modes, against a real Airflow 3.1.2 API server (tests.airflow_server)
on duplicates made by Airflow's own scheduler code (scenario ``race_asset_fanout``: three duplicate
pairs per load; the database is re-created from the scenario between loads, outside the measured
window). Each sample includes the guard's re-read; for ``api`` it includes the HTTP round trips
(token already cached, as in a running daemon), for ``db`` the locked transaction and its commit.

    .venv/bin/python -m benchmarks.remediation_latency [--samples 50]
    .venv/bin/python -m benchmarks.remediation_latency --gap --label after [--samples 50]

Prints a table and writes benchmarks/results/remediation_latency.json (``--name`` for another file).

``--gap`` measures the ``api`` backend's window between the guard's re-read and the
moment Airflow's write acts on the task instances, in which a task can still start. Phases, on one
host clock (wall time): the re-read; from its end to the PATCH leaving (token, request building);
from the PATCH leaving to the server's first write of a task instance (the lowest
``task_instance.updated_at``, set by Airflow's ORM in the PATCH's transaction: auth, loading the
run and its serialized DAG, ``set_dag_run_state_to_failed``'s reads); the rest of the round trip
(commit, response). The *gap* is from the end of the re-read to that server-side write. The API
server's pooled DB connections are refreshed after each database reset (they die with it), as in
a steady-state deployment. Results are merged by ``--label`` into
benchmarks/results/remediation_gap.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.provenance import provenance
from detector.actions.remediation.api import ApiBackend
from detector.actions.remediation.db import DbBackend
from detector.actions.remediation.guarded import GuardedRemediator
from detector.airflowapi.tokens import Budget as _Budget
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Mode, plan
from detector.core.ports import Result
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
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
    readback = make_engine(parse_url(server.db_url))  # the api backend's read-back after each write
    api = ApiBackend.from_config(config, readback, open_tables(server)) if backend_name == "api" else None
    if api is not None:
        api.tokens.get(_Budget())  # a running daemon holds a valid token already
    latencies: list[float] = []
    try:
        while len(latencies) < samples:
            url = server.reset(SCENARIO)
            readback.dispose()  # its connections died with the old database
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
        readback.dispose()
    return latencies


def open_tables(server: AirflowServer) -> Any:
    engine = make_engine(parse_url(server.db_url))
    try:
        return open_airflow_db(engine).tables
    finally:
        engine.dispose()


def warm_server_pool(server: AirflowServer, token: str, dag_id: str, run_id: str, width: int = 8) -> None:
    """Refresh every pooled DB connection of the API server (they died with the re-created database):
    ``width`` concurrent GETs, twice, so none of the measured PATCHes pays for a reconnect, as in a
    steady-state deployment."""
    import http.client
    from concurrent.futures import ThreadPoolExecutor
    from urllib.parse import quote

    path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"

    def get(_: int) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        try:
            conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
            answer = conn.getresponse()
            answer.read()
            return answer.status
        finally:
            conn.close()

    with ThreadPoolExecutor(width) as pool:
        for _ in range(2):
            assert set(pool.map(get, range(width))) == {200}


def warm(api: ApiBackend, dag_id: str, run_id: str) -> None:
    token = api.tokens.get(_Budget())
    for _ in range(2):
        response = api.dag_runs.get_dag_run_without_preload_content(
            dag_id, run_id, _request_timeout=api.timeout, _headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status == 200, response.data


class _Probe:
    """Wall-clock marks of the first call of each wrapped function during one action."""

    def __init__(self) -> None:
        self.marks: dict[str, tuple[float, float]] = {}

    def wrap(self, owner: Any, name: str, label: str) -> None:
        original = getattr(owner, name)
        probe = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                probe.marks.setdefault(label, (started, time.time()))

        setattr(owner, name, timed)


def measure_gap(server: AirflowServer, samples: int) -> list[dict[str, float]]:
    """Per ``api`` ``fail`` action: where the time between the guard's re-read and the write goes."""
    from sqlalchemy import text

    import detector.actions.remediation.guarded as remediation_module

    config = Config.of(
        database_url=server.db_url,
        remediation="fail",
        remediation_backend="api",
        airflow_api_url=server.url,
        airflow_username="admin",
        airflow_password="admin",  # noqa: S106 - the test server's throw-away user
    )
    probe = _Probe()
    probe.wrap(remediation_module, "read_state", "reread")
    rows: list[dict[str, float]] = []
    engine = make_engine(parse_url(server.db_url))
    try:
        while len(rows) < samples:
            url = server.reset(SCENARIO)
            engine.dispose()
            db = open_airflow_db(engine)
            remediator = build_remediator(config, engine, db.tables, Metrics())
            assert isinstance(remediator, GuardedRemediator)
            api = remediator.backend
            assert isinstance(api, ApiBackend)
            probe.wrap(api.tokens, "get", "token")
            probe.wrap(api, "_send", "http")
            remediator.prepare()  # a running daemon holds a valid token already
            stamp = datetime.now(UTC)
            actions = plan(scan(db, now=stamp).findings, Mode.FAIL, now=stamp)
            warm_server_pool(server, api.tokens.get(_Budget()), actions[0].dag_id, actions[0].kept_run_id)
            warm(api, actions[0].dag_id, actions[0].kept_run_id)
            for action in actions[: samples - len(rows)]:
                probe.marks.clear()
                started = time.time()
                result = remediator.execute(action)
                ended = time.time()
                if result.result is not Result.DONE:
                    raise SystemExit(f"gap: {result.result} {result.detail}")
                with engine.connect() as conn:
                    written = conn.execute(
                        text("SELECT min(updated_at) FROM task_instance WHERE dag_id=:d AND run_id=:r"),
                        {"d": action.dag_id, "r": action.run.run_id},
                    ).scalar_one()
                write = written.timestamp()
                reread, token, http = probe.marks["reread"], probe.marks.get("token"), probe.marks["http"]
                rows.append(
                    {
                        "reread_ms": (reread[1] - reread[0]) * 1000,
                        "token_ms": (token[1] - token[0]) * 1000 if token else 0.0,
                        "to_send_ms": (http[0] - reread[1]) * 1000,
                        "server_to_write_ms": (write - http[0]) * 1000,
                        "after_write_ms": (http[1] - write) * 1000,
                        "gap_ms": (write - reread[1]) * 1000,
                        "execute_ms": (ended - started) * 1000,
                    }
                )
            remediator.close()
            del url
    finally:
        engine.dispose()
    return rows


def gap_main(args: argparse.Namespace) -> None:
    templates = Templates(made={})
    try:
        with airflow_api_server(args.version, [SCENARIO], templates, Path(tempfile.mkdtemp())) as server:
            samples = measure_gap(server, args.samples)
    finally:
        templates.drop_all()
    columns = list(samples[0])
    summary = {
        c: {
            "p50": round(statistics.median(s[c] for s in samples), 1),
            "p90": round(percentile([s[c] for s in samples], 90), 1),
            "max": round(max(s[c] for s in samples), 1),
        }
        for c in columns
    }
    print(f"api fail gap phases, Airflow {args.version}, {len(samples)} samples, label {args.label!r} (ms)")
    print(f"{'phase':20} {'p50':>8} {'p90':>8} {'max':>8}")
    for c in columns:
        print(f"{c:20} {summary[c]['p50']:>8} {summary[c]['p90']:>8} {summary[c]['max']:>8}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "remediation_gap.json"
    merged = json.loads(path.read_text()) if path.exists() else {}
    merged[args.label] = {
        "airflow_version": args.version,
        "samples": len(samples),
        "load_average": list(os.getloadavg()),
        "phases_ms": summary,
    }
    path.write_text(json.dumps(merged, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--version", default="3.1.2")
    parser.add_argument("--gap", action="store_true", help="measure the api backend's re-read -> write gap")
    parser.add_argument("--label", default="current", help="with --gap: the key of this run in the results")
    parser.add_argument("--name", default="remediation_latency", help="results file (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    if args.gap:
        gap_main(args)
        return
    templates = Templates(made={})
    rows: list[dict[str, Any]] = []
    try:
        with airflow_api_server(args.version, [SCENARIO], templates, Path(tempfile.mkdtemp())) as server:
            # skip through the API is refused on Airflow 3.1 (its scheduler can put skipped tasks back)
            for backend, mode in (("db", Mode.FAIL), ("db", Mode.SKIP), ("api", Mode.FAIL)):
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
    doc = {"airflow_version": args.version, "scenario": SCENARIO, "provenance": provenance(), "rows": rows}
    (RESULTS / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
