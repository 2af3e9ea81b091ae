"""Writes Airflow 3.1-shaped rows (runs, events, task instances) into a real schema, as a scheduler would
commit them: one transaction per run with its consumed events and task instances. Used by daemon tests
and benchmarks to commit duplicates at chosen moments. Race semantics are Airflow's
(docs/explanation/airflow-internals.md, "The 3.0/3.1 race"): the duplicate has the same dag_id, run_after and consumed
events, another creating job, a later id.
"""

from __future__ import annotations

import random
import string
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg2


def _suffix(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=8))


@dataclass
class Committed:
    id: int
    run_id: str
    committed_at: datetime  # wall clock just after COMMIT returned


class AirflowWriter:
    def __init__(self, url: str, seed: int = 54491) -> None:
        self.conn = psycopg2.connect(url)
        self.rng = random.Random(seed)
        with self.conn, self.conn.cursor() as cur:
            cur.execute(
                'INSERT INTO asset (id, name, uri, "group", extra, created_at, updated_at) '
                "VALUES (1, 'test://asset', 'test://asset', 'asset', '{}', now(), now()) ON CONFLICT DO NOTHING"
            )
            cur.execute(
                "INSERT INTO job (id, job_type, state, hostname) VALUES (1, 'SchedulerJob', 'running', 'sched-a'), "
                "(2, 'SchedulerJob', 'running', 'sched-b') ON CONFLICT DO NOTHING"
            )

    def close(self) -> None:
        self.conn.close()

    def event(self, at: datetime | None = None) -> int:
        with self.conn, self.conn.cursor() as cur:
            cur.execute(
                "INSERT INTO asset_event (asset_id, extra, source_dag_id, timestamp) "
                "VALUES (1, '{}', 'producer', %s) RETURNING id",
                (at or datetime.now(UTC),),
            )
            return int(cur.fetchone()[0])

    def run(
        self,
        dag_id: str,
        run_after: datetime,
        events: list[int],
        *,
        job: int = 1,
        tasks: tuple[str, ...] = ("extract", "load"),
        run_type: str = "asset_triggered",
        ti_state: str | None = None,
    ) -> Committed:
        with self.conn:
            run_pk, run_id = self.begin_run(
                dag_id, run_after, events, job=job, tasks=tasks, run_type=run_type, ti_state=ti_state
            )
        return Committed(run_pk, run_id, datetime.now(UTC))

    def begin_run(
        self,
        dag_id: str,
        run_after: datetime,
        events: list[int],
        *,
        job: int = 1,
        tasks: tuple[str, ...] = ("extract", "load"),
        run_type: str = "asset_triggered",
        ti_state: str | None = None,
    ) -> tuple[int, str]:
        """Insert a run in this connection's open transaction without committing (``conn.commit()``
        makes it visible): its id is taken now, its commit comes whenever the caller says."""
        run_id = f"{run_type}__{run_after.isoformat()}_{_suffix(self.rng)}"
        with self.conn.cursor() as cur:
            cur.execute(
                "INSERT INTO dag_run (dag_id, run_id, run_type, run_after, state, queued_at, creating_job_id, "
                "triggered_by, conf, clear_number, span_status) "
                "VALUES (%s, %s, %s, %s, 'queued', now(), %s, 'ASSET', '{}', 0, 'not_started') RETURNING id",
                (dag_id, run_id, run_type, run_after, job),
            )
            run_pk = int(cur.fetchone()[0])
            for event_id in events:
                cur.execute("INSERT INTO dagrun_asset_event (dag_run_id, event_id) VALUES (%s, %s)", (run_pk, event_id))
            for task_id in tasks:
                cur.execute(
                    "INSERT INTO task_instance (id, task_id, dag_id, run_id, map_index, pool, pool_slots, state, "
                    "try_number, span_status) VALUES (%s, %s, %s, %s, -1, 'default_pool', 1, %s, 0, 'not_started')",
                    (str(uuid.uuid4()), task_id, dag_id, run_id, ti_state),
                )
        return run_pk, run_id

    def duplicate_pair(self, dag_id: str, gap: timedelta = timedelta(milliseconds=60)) -> tuple[Committed, Committed]:
        """The HA race: scheduler A's run, then B's stale copy committed ``gap`` later."""
        run_after = datetime.now(UTC)
        event = self.event(run_after - timedelta(milliseconds=5))
        first = self.run(dag_id, run_after, [event], job=1)
        if gap > timedelta(0):
            time.sleep(gap.total_seconds())
        second = self.run(dag_id, run_after, [event], job=2)
        return first, second

    def storm(self, groups: int, dag_prefix: str = "storm") -> list[tuple[str, str]]:
        """``groups`` duplicate pairs (dag ``<dag_prefix>_<i>``, one asset event each) in one COMMIT, as one
        asset event fanning out to many consumer DAGs on two schedulers. Returns (kept, duplicate) run_ids."""
        run_after = datetime.now(UTC)
        event = self.event(run_after - timedelta(milliseconds=5))
        pairs = []
        with self.conn:
            for i in range(groups):
                dag_id = f"{dag_prefix}_{i}"
                _, kept = self.begin_run(dag_id, run_after, [event], job=1)
                _, dup = self.begin_run(dag_id, run_after, [event], job=2)
                pairs.append((kept, dup))
        return pairs

    def queued_event(self, dag_id: str) -> tuple[int, datetime]:
        """An asset event with its ``asset_dag_run_queue`` row for ``dag_id``, committed together, as
        ``AssetManager.register_asset_change`` does (the row's ``created_at`` is the event's time; an
        existing row is kept, ``ON CONFLICT DO NOTHING``). The DAG gets its ``dag`` row first (the
        queue row's foreign key)."""
        at = datetime.now(UTC)
        with self.conn, self.conn.cursor() as cur:
            cur.execute(
                "INSERT INTO dag_bundle (name, active) VALUES ('dags-folder', true) ON CONFLICT DO NOTHING; "
                "INSERT INTO dag (dag_id, is_paused, is_stale, bundle_name, max_active_tasks, "
                "max_consecutive_failed_dag_runs, has_task_concurrency_limits) "
                "VALUES (%s, false, false, 'dags-folder', 16, 0, false) ON CONFLICT DO NOTHING",
                (dag_id,),
            )
            cur.execute(
                "INSERT INTO asset_event (asset_id, extra, source_dag_id, timestamp) "
                "VALUES (1, '{}', 'producer', %s) RETURNING id",
                (at,),
            )
            event = int(cur.fetchone()[0])
            cur.execute(
                "INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at) VALUES (1, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (dag_id, at),
            )
        return event, at

    def queued_pair(self, dag_id: str, lead: float, gap: timedelta = timedelta(0)) -> tuple[Committed, Committed]:
        """The HA race as Airflow commits it: the event with its queue row, ``lead`` seconds later
        the two schedulers' runs (``race``)."""
        event, at = self.queued_event(dag_id)
        if lead > 0:
            time.sleep(lead)
        return self.race(dag_id, event, at, gap)

    def race(self, dag_id: str, event: int, at: datetime, gap: timedelta = timedelta(0)) -> tuple[Committed, Committed]:
        """Scheduler A's run of a queued event, deleting the queue row in the run's transaction (as
        ``_create_dag_runs_asset_triggered`` does), then B's stale copy ``gap`` later (B read the row
        before A deleted it)."""
        runs = []
        for job in (1, 2):
            with self.conn:
                run_pk, run_id = self.begin_run(dag_id, at, [event], job=job)
                with self.conn.cursor() as cur:
                    cur.execute("DELETE FROM asset_dag_run_queue WHERE target_dag_id = %s", (dag_id,))
            runs.append(Committed(run_pk, run_id, datetime.now(UTC)))
            if job == 1 and gap > timedelta(0):
                time.sleep(gap.total_seconds())
        return runs[0], runs[1]

    def ordinary(self, dag_id: str) -> Committed:
        """A normal asset run: its own event and run_after."""
        at = datetime.now(UTC)
        return self.run(dag_id, at, [self.event(at)], job=self.rng.choice([1, 2]))
