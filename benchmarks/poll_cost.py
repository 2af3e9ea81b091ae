"""Cost of one incremental poll (``IncrementalDetector.poll``) against 100k, 1M and 10M run histories.

Three scenarios, each timed over ``--iterations`` polls after ``--warmup`` untimed ones:

- ``idle``: nothing new since the last poll (the daemon's steady state);
- ``ordinary``: one new asset-triggered run (its own event, two task instances) became visible;
- ``duplicate``: a run was seen by the previous poll, then its HA-race twin (same dag_id,
  run_after and consumed events, the other scheduler's job) committed: the timed poll fetches it,
  its siblings, both runs' events and task progress, and must return exactly one finding.
- ``overlap``: the same, but the second run is the overlap race's (docs/how-to/guard.md): an earlier
  run_after and only one of the first run's two events. Its sibling has another run_after, so the
  poll also asks for the sibling's siblings (one more ``sibling_runs``); one finding, first run kept.

For every timed poll we record the client wall time of ``poll(conn, now)`` and its database time:
each statement the poll sent (captured with SQLAlchemy's ``before_cursor_execute``) is replayed on
the same connection under ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` and its planning + execution
times are summed. When pg_stat_statements is loaded, its mean execution time of the real (not
replayed) statements is reported as a cross-check. The plans of the last iteration are saved under
benchmarks/results/plans/poll/<size>/<scenario>/. Rows the benchmark inserts are deleted at the end.

    .venv/bin/python benchmarks/poll_cost.py --sizes 100k,1m,10m [--iterations 500]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import history
from sqlalchemy import event, select, union

from detector.core.model import ASSET_TRIGGERED, Run
from detector.metadb import consumption, dag_runs, siblings
from detector.metadb.engine import AirflowDb, connect, make_engine, open_airflow_db, parse_url
from detector.sources.database.poll import IncrementalDetector, NewRowTracker

SCENARIOS = ("idle", "ordinary", "duplicate", "overlap")
PLANS = history.RESULTS / "plans" / "poll"
SHIPPED_SIBLING_RUNS = siblings.sibling_runs
TARGET_MS = 5.0
TARGET_RATIO = 1.5


@dataclass
class Capture:
    """Statements the poll sends, with the name of the ``detector.metadb`` statement function that sent them."""

    on: bool = False
    statements: list[tuple[str, str, Any]] = field(default_factory=list)

    def __call__(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if not self.on:
            return
        frame = sys._getframe(1)
        name = "?"
        while frame is not None:
            if (
                frame.f_globals.get("__name__")
                in ("detector.metadb.dag_runs", "detector.metadb.consumption", "detector.metadb.partitions")
                or frame.f_code.co_name == "sibling_runs_union"
            ):
                name = frame.f_code.co_name
                break
            frame = frame.f_back  # type: ignore[assignment]
        self.statements.append((name, statement, parameters))


class Writer:
    """Commits rows the way Airflow 3.1's scheduler does: a run, its consumed events, its TIs (state NULL)."""

    def __init__(self, size: str) -> None:
        self.conn = history.connect(history.db_name(size), autocommit=False)
        with self.conn.cursor() as cur:
            cur.execute("SELECT max(id) FROM job")
            top = int(cur.fetchone()[0])
            self.jobs = (top - 1, top)  # the two schedulers currently running
            cur.execute("SELECT max(id) FROM dag_run")
            self.base_run = int(cur.fetchone()[0])
            cur.execute("SELECT max(id) FROM asset_event")
            self.base_event = int(cur.fetchone()[0])
        self.conn.commit()
        self.n = 0

    def event(self, cur: Any, dag: int, at: datetime) -> int:
        cur.execute(
            "INSERT INTO asset_event (asset_id, extra, source_task_id, source_dag_id, source_run_id, timestamp) "
            "VALUES (%s, '{}', 'publish', %s, %s, %s) RETURNING id",
            (1 + dag % history.ASSETS, f"producer_{dag:03d}", f"manual__{at.isoformat()}", at),
        )
        return int(cur.fetchone()[0])

    def run(self, dag: int, run_after: datetime, events: list[int], job: int, ti_states: tuple[str | None, ...]) -> int:
        self.n += 1
        dag_id = f"dag_{dag:03d}"
        run_id = f"asset_triggered__{run_after.isoformat()}_{uuid.uuid4().hex[:8]}"
        with self.conn.cursor() as cur:
            cur.execute(
                "INSERT INTO dag_run (dag_id, run_id, run_type, run_after, state, queued_at, creating_job_id, "
                "triggered_by, conf, clear_number, span_status, updated_at, created_dag_version_id) "
                "VALUES (%s, %s, 'asset_triggered', %s, 'queued', now(), %s, 'ASSET', '{}', 0, 'not_started', "
                "now(), md5('dv' || %s)::uuid) RETURNING id",
                (dag_id, run_id, run_after, job, dag),
            )
            run_pk = int(cur.fetchone()[0])
            for event_id in events:
                cur.execute("INSERT INTO dagrun_asset_event (dag_run_id, event_id) VALUES (%s, %s)", (run_pk, event_id))
            for task_id, state in zip(("extract", "load"), ti_states, strict=True):
                cur.execute(
                    "INSERT INTO task_instance (id, task_id, dag_id, run_id, map_index, pool, pool_slots, state, "
                    "start_date, try_number, span_status, dag_version_id) VALUES (%s, %s, %s, %s, -1, "
                    "'default_pool', 1, %s, CASE WHEN %s = 'running' THEN now() END, 0, 'not_started', "
                    "md5('dv' || %s)::uuid)",
                    (str(uuid.uuid4()), task_id, dag_id, run_id, state, state, dag),
                )
        self.conn.commit()
        return run_pk

    def ordinary(self) -> int:
        dag = self.n % history.DAGS
        at = datetime.now(UTC)
        with self.conn.cursor() as cur:
            event_id = self.event(cur, dag, at - timedelta(milliseconds=2))
        return self.run(dag, at, [event_id], self.jobs[self.n % 2], (None, None))

    def pair_first(self) -> tuple[int, int, datetime, list[int]]:
        """Scheduler A's run (its first task already running); returns (id, dag, run_after, events)."""
        dag = (7 * self.n) % history.DAGS
        at = datetime.now(UTC)
        with self.conn.cursor() as cur:
            events = [
                self.event(cur, dag, at - timedelta(seconds=30)),
                self.event(cur, dag, at - timedelta(milliseconds=2)),
            ]
        return self.run(dag, at, events, self.jobs[0], ("running", None)), dag, at, events

    def pair_second(self, dag: int, at: datetime, events: list[int]) -> int:
        """Scheduler B's stale copy: same dag_id, run_after and events; the other job."""
        return self.run(dag, at, events, self.jobs[1], (None, None))

    def overlap_second(self, dag: int, at: datetime, events: list[int]) -> int:
        """Scheduler B's older snapshot (overlap race): run_after 100 ms earlier, the first event only."""
        return self.run(dag, at - timedelta(milliseconds=100), events[:1], self.jobs[1], (None, None))

    def cleanup(self) -> None:
        with self.conn.cursor() as cur:
            # dagrun_asset_event and task_instance rows go with their runs (ON DELETE CASCADE)
            cur.execute("DELETE FROM dag_run WHERE id > %s", (self.base_run,))
            cur.execute("DELETE FROM asset_event WHERE id > %s", (self.base_event,))
            cur.execute("SELECT setval('dag_run_id_seq', %s)", (self.base_run,))
            cur.execute("SELECT setval('asset_event_id_seq', %s)", (self.base_event,))
        self.conn.commit()
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE dag_run, asset_event, dagrun_asset_event, task_instance")
        self.conn.close()


def explain(conn: Any, statements: list[tuple[str, str, Any]], fmt: str = "JSON") -> list[dict[str, Any]]:
    """Replay ``statements`` under EXPLAIN ANALYZE on ``conn`` (same transaction); one entry per statement."""
    raw = conn.connection.dbapi_connection
    out = []
    with raw.cursor() as cur:
        for name, statement, params in statements:
            if fmt == "JSON":
                cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params)
                plan = cur.fetchone()[0][0]
                out.append(
                    {
                        "query": name,
                        "planning_ms": plan["Planning Time"],
                        "execution_ms": plan["Execution Time"],
                        "plan": plan,
                        "sql": cur.mogrify(statement, params).decode(),
                    }
                )
            else:
                cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement, params)
                out.append({"query": name, "text": "\n".join(r[0] for r in cur.fetchall())})
    return out


def pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "p95": round(pct(values, 95), 3),
        "p99": round(pct(values, 99), 3),
        "max": round(max(values), 3),
    }


def stat_statements(admin: Any, dbname: str) -> dict[str, dict[str, float]] | None:
    """Per-statement totals from pg_stat_statements for ``dbname`` (SELECTs only), or None if absent."""
    with admin.cursor() as cur:
        try:
            cur.execute(
                "SELECT query, calls, total_exec_time FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) AND query LIKE 'SELECT %%' "
                "AND query NOT IN ('SELECT 1', 'SELECT $1')",
                (dbname,),
            )
        except Exception:  # noqa: BLE001 - the extension is optional
            return None
        return {q: {"calls": c, "total_ms": t} for q, c, t in cur.fetchall()}


def reset_stat_statements(admin: Any) -> bool:
    with admin.cursor() as cur:
        try:
            cur.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cur.execute("SELECT pg_stat_statements_reset()")
            return True
        except Exception:  # noqa: BLE001 - not in shared_preload_libraries
            return False


def save_plans(size: str, scenario: str, conn: Any, statements: list[tuple[str, str, Any]]) -> None:
    folder = PLANS / size / scenario
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    plans = explain(conn, statements)
    texts = explain(conn, statements, fmt="TEXT")
    for n, (plan, text) in enumerate(zip(plans, texts, strict=True), start=1):
        stem = f"{n:02d}-{plan['query']}"
        (folder / f"{stem}.json").write_text(json.dumps(plan, indent=2) + "\n")
        (folder / f"{stem}.txt").write_text(plan["sql"] + "\n\n" + text["text"] + "\n")


def sibling_runs_union(conn: Any, t: Any, run: Run, event_ids: list[int], window: timedelta) -> list[Run]:
    """The rewrite we suggest for ``siblings.sibling_runs``: one UNION arm per way of being a sibling.

    ``run_after = X OR id IN (subquery)`` cannot be answered from an index, so PostgreSQL reads every
    run of the DAG (idx_dag_run_dag_id) and filters: cost grows with history. Each arm here has its
    own index (idx_dag_run_run_after; idx_dagrun_asset_events_event_id then dag_run_pkey), and UNION
    is portable to SQLite.
    """
    dr, rev = t.dag_run, t.run_events
    base = dag_runs._run_select(t).where(dr.c.dag_id == run.dag_id, dr.c.run_type == ASSET_TRIGGERED)
    arms = [base.where(dr.c.run_after == run.run_after)]
    if event_ids:
        arms.append(base.where(dr.c.id.in_(select(rev.c.dag_run_id).where(rev.c.event_id.in_(sorted(event_ids))))))
    if t.family.has_partitions and run.partition_key is not None:
        arms.append(
            base.where(
                dr.c.run_after.between(run.run_after - window, run.run_after + window),
                dr.c.partition_key == run.partition_key,
            )
        )
    return [dag_runs._run(r) for r in conn.execute(union(*arms))]


def compare_sibling_rewrite(size: str, engine: Any, db: AirflowDb, capture: Capture, samples: int) -> dict[str, Any]:
    """EXPLAIN ANALYZE of sibling_runs as shipped vs the UNION rewrite, for the same sample of runs."""
    t = db.tables
    out: dict[str, list[float]] = {"shipped": [], "union": []}
    folder = PLANS / size
    with connect(engine) as conn:
        top = dag_runs.max_run_id(conn, t)
        ids = [top - k * max(1, top // samples) for k in range(samples)]
        runs = [r for r in dag_runs.new_runs(conn, t, top, ids, samples) if r.run_type == ASSET_TRIGGERED]
        events = consumption.consumed_events(conn, t, [r.id for r in runs])
        for n, run in enumerate(runs):
            got = {}
            for label, fn in (("shipped", SHIPPED_SIBLING_RUNS), ("union", sibling_runs_union)):
                capture.statements.clear()
                capture.on = True
                rows = fn(conn, t, run, sorted(events.get(run.id, ())), timedelta(seconds=60))
                capture.on = False
                got[label] = sorted(r.id for r in rows)
                statements = [(label, st, p) for _, st, p in capture.statements]
                plans = explain(conn, statements)
                out[label].append(sum(p["planning_ms"] + p["execution_ms"] for p in plans))
                if n == 0:
                    text = explain(conn, statements, fmt="TEXT")[0]["text"]
                    (folder / f"sibling_runs-{label}.txt").write_text(plans[0]["sql"] + "\n\n" + text + "\n")
            assert got["shipped"] == got["union"], got
    return {label: summary(v) for label, v in out.items()} | {"samples": len(runs)}


def measure(size: str, iterations: int, warmup: int, log: Any = print) -> dict[str, Any]:
    meta = history.ensure(size, log=log)
    engine = make_engine(parse_url(history.db_url(size)))
    db: AirflowDb = open_airflow_db(engine)
    capture = Capture()
    event.listen(engine, "before_cursor_execute", capture)
    writer = Writer(size)
    admin = history.connect()
    pgss = reset_stat_statements(admin)
    with connect(engine) as conn:
        high = dag_runs.max_run_id(conn, db.tables)
    detector = IncrementalDetector(tables=db.tables, tracker=NewRowTracker(high=high))
    results: dict[str, Any] = {
        "runs": meta.runs,
        "iterations": iterations,
        "warmup": warmup,
        "load_average_at_start": os.getloadavg(),
        "scenarios": {},
    }
    try:
        (PLANS / size).mkdir(parents=True, exist_ok=True)
        results["sibling_runs_rewrite_db_ms"] = rewrite = compare_sibling_rewrite(size, engine, db, capture, 200)
        log(
            f"  [{size}] sibling_runs DB ms median: shipped {rewrite['shipped']['median']:.3f}, "
            f"UNION rewrite {rewrite['union']['median']:.3f} ({rewrite['samples']} runs)"
        )
        for scenario in SCENARIOS:
            wall: list[float] = []
            dbms: list[float] = []
            exec_ms: list[float] = []
            per_query: dict[str, list[float]] = {}
            statements_per_poll = 0
            if pgss:
                reset_stat_statements(admin)
            for i in range(warmup + iterations):
                expect_findings = 0
                if scenario == "ordinary":
                    writer.ordinary()
                elif scenario in ("duplicate", "overlap"):
                    first, dag, at, events = writer.pair_first()
                    with connect(engine) as conn:
                        seen = detector.poll(conn, datetime.now(UTC))
                    assert [r.id for r in seen.new_runs] == [first] and not seen.findings, seen
                    make_second = writer.pair_second if scenario == "duplicate" else writer.overlap_second
                    second = make_second(dag, at, events)
                    expect_findings = 1
                with connect(engine) as conn:
                    now = datetime.now(UTC)
                    capture.statements.clear()
                    capture.on = True
                    t0 = time.perf_counter()
                    result = detector.poll(conn, now)
                    elapsed = (time.perf_counter() - t0) * 1000
                    capture.on = False
                    assert len(result.findings) == expect_findings, (scenario, result)
                    if scenario in ("duplicate", "overlap"):
                        f = result.findings[0]
                        assert f.kept.id == first and [d.id for d in f.duplicates] == [second], f
                        assert f.confidence.value == "confirmed", f
                    if i < warmup:
                        continue
                    statements = list(capture.statements)
                    plans = explain(conn, statements)
                    wall.append(elapsed)
                    dbms.append(sum(p["planning_ms"] + p["execution_ms"] for p in plans))
                    exec_ms.append(sum(p["execution_ms"] for p in plans))
                    statements_per_poll = len(statements)
                    for p in plans:
                        per_query.setdefault(p["query"], []).append(p["planning_ms"] + p["execution_ms"])
                    if i == warmup + iterations - 1:
                        save_plans(size, scenario, conn, statements)
            real = stat_statements(admin, history.db_name(size)) if pgss else None
            pgss_ms = None
            if real and scenario not in ("duplicate", "overlap"):  # every timed poll follows an untimed one
                pgss_ms = round(sum(v["total_ms"] for v in real.values()) / (warmup + iterations), 3)
            results["scenarios"][scenario] = {
                "client_ms": summary(wall),
                "db_ms": summary(dbms),
                "db_exec_ms": summary(exec_ms),
                "pg_stat_statements_exec_ms_per_poll": pgss_ms,
                "statements_per_poll": statements_per_poll,
                "db_ms_by_query_median": {q: round(statistics.median(v), 3) for q, v in per_query.items()},
            }
            s = results["scenarios"][scenario]
            log(
                f"  [{size}] {scenario:9s} client median {s['client_ms']['median']:.2f} ms p99 "
                f"{s['client_ms']['p99']:.2f} | db median {s['db_ms']['median']:.3f} ms p99 {s['db_ms']['p99']:.3f}"
                f" | {statements_per_poll} statements"
            )
        results["load_average_at_end"] = os.getloadavg()
    finally:
        writer.cleanup()
        admin.close()
        engine.dispose()
    return results


def render(sizes: dict[str, Any]) -> str:
    rows = []
    for scenario in SCENARIOS:
        for size, r in sizes.items():
            if scenario not in r["scenarios"]:
                continue  # measured before this scenario existed
            s = r["scenarios"][scenario]
            c, d = s["client_ms"], s["db_ms"]
            rows.append(
                [
                    scenario,
                    size,
                    s["statements_per_poll"],
                    f"{c['median']:.2f} / {c['p95']:.2f} / {c['p99']:.2f}",
                    f"{d['median']:.3f} / {d['p95']:.3f} / {d['p99']:.3f}",
                    f"{s['db_exec_ms']['median']:.3f}",
                    "-"
                    if s["pg_stat_statements_exec_ms_per_poll"] is None
                    else s["pg_stat_statements_exec_ms_per_poll"],
                    ", ".join(f"{q} {v:.3f}" for q, v in s["db_ms_by_query_median"].items()),
                ]
            )
    table = history.markdown_table(
        [
            "scenario",
            "history",
            "statements",
            "client ms median / p95 / p99",
            "DB ms (plan+exec) median / p95 / p99",
            "DB exec-only median",
            "pg_stat_statements mean exec ms/poll",
            "DB ms median by query",
        ],
        rows,
    )
    lines = [table, ""]
    if "100k" in sizes and "10m" in sizes:
        ratio_rows = []
        for scenario in SCENARIOS:
            if not all(scenario in sizes[k]["scenarios"] for k in ("100k", "10m")):
                continue
            small, big = sizes["100k"]["scenarios"][scenario], sizes["10m"]["scenarios"][scenario]
            db_ratio = big["db_ms"]["median"] / small["db_ms"]["median"]
            cl_ratio = big["client_ms"]["median"] / small["client_ms"]["median"]
            ok = big["db_ms"]["median"] < TARGET_MS and db_ratio <= TARGET_RATIO
            ratio_rows.append(
                [
                    scenario,
                    f"{big['db_ms']['median']:.3f} ms",
                    f"{db_ratio:.2f}",
                    f"{cl_ratio:.2f}",
                    "met" if ok else "**missed**",
                ]
            )
        lines.append(
            history.markdown_table(
                [
                    "scenario",
                    "10M DB median",
                    "DB ratio 10M/100k",
                    "client ratio 10M/100k",
                    f"target (< {TARGET_MS:g} ms, ratio <= {TARGET_RATIO})",
                ],
                ratio_rows,
            )
        )
    lines += ["", "sibling_runs, DB ms (plan+exec) for the same sample of runs: as shipped vs the UNION rewrite", ""]
    lines.append(
        history.markdown_table(
            ["history", "runs sampled", "shipped median / p95", "UNION rewrite median / p95"],
            [
                [
                    size,
                    r["sibling_runs_rewrite_db_ms"]["samples"],
                    f"{r['sibling_runs_rewrite_db_ms']['shipped']['median']:.3f} / "
                    f"{r['sibling_runs_rewrite_db_ms']['shipped']['p95']:.3f}",
                    f"{r['sibling_runs_rewrite_db_ms']['union']['median']:.3f} / "
                    f"{r['sibling_runs_rewrite_db_ms']['union']['p95']:.3f}",
                ]
                for size, r in sizes.items()
                if "sibling_runs_rewrite_db_ms" in r
            ],
        )
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100k,1m,10m", help="comma-separated: 100k,1m,10m")
    parser.add_argument("--iterations", type=int, default=500, help="timed polls per scenario")
    parser.add_argument("--warmup", type=int, default=50, help="untimed polls per scenario first")
    parser.add_argument(
        "--sibling-rewrite",
        action="store_true",
        help="what-if: run the poll with sibling_runs replaced by the UNION rewrite (results/poll_cost_rewrite.*)",
    )
    parser.add_argument("--tag", default="", help="write results/<script>-<tag>.* instead of merging")
    args = parser.parse_args(argv)
    name = "poll_cost"
    if args.sibling_rewrite:
        global PLANS
        PLANS = history.RESULTS / "plans" / "poll_rewrite"
        siblings.sibling_runs = sibling_runs_union  # type: ignore[assignment]  # benchmark what-if only
        name = "poll_cost_rewrite"
    done = {size: measure(size, args.iterations, args.warmup) for size in history.parse_sizes(args.sizes)}
    print(history.save(name, done, render, args.tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
