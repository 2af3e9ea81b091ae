"""Fenced writes across replicas: the leader's lock backend is terminated (or PgBouncer
restarted) while its remediations are in flight through a slowed Airflow API; the other replica takes
over. Whatever the timing, no group ends with both runs stopped, no kept run is touched, and every
duplicate whose tasks never started is stopped in the end — all read from what Airflow recorded
(``dag_run``, ``task_instance``, ``dag_run_note``).

Random timing, seeded: the seed is printed (``-s``) and can be replayed with ``DUPGUARD_FENCING_SEED``.
One Airflow 3.1.2 API server for the module; each trial re-creates its database from the Airflow-made
fan-out scenario (three consumer DAGs, one duplicate pair each, nothing started).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import pytest

from detector.actions.remediation.guarded import GuardedRemediator, now_utc
from detector.app.scan import scan
from detector.app.wiring import api_reader, build_remediator
from detector.config import Config
from detector.core.model import Run
from detector.core.plan import Action, Mode, Outcome, note_for, plan
from detector.core.ports import Result
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metadb.schema import Family
from detector.metrics import Metrics
from detector.sources.api.reader import ApiRunStates
from tests import pgbouncer
from tests.airflow_server import AirflowServer, CountingProxy, ServerPool, _run_payload, _ti_run, db_state
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.integration.test_half_landed_stop import skip_every_task
from tests.pg import ground_truth

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

FANOUT = "race_asset_fanout"
LONG_AGO = timedelta(days=3650)
TIMEOUT = timedelta(seconds=2)  # DUPGUARD_AIRFLOW_TIMEOUT: also the longest the proxy holds a PATCH
LOCK_KEY = 7_355_608_201  # the default DUPGUARD_LOCK_KEY
SEED = int(os.environ.get("DUPGUARD_FENCING_SEED") or time.time_ns() % 2**32)
COMBOS = [(ledger, backend) for ledger in ("memory", "durable") for backend in ("api", "db")]
TRIALS = 5  # per combination: 20 in all; combination i uses seed SEED + i


@pytest.fixture(scope="module")
def af312(airflow_servers: ServerPool) -> AirflowServer:
    return airflow_servers.get("3.1.2", [FANOUT])


def _groups() -> list[tuple[str, str, str]]:
    """(dag_id, kept, duplicate) of each group, the kept one by Airflow's order (nothing started)."""
    out = []
    for g in ground_truth("3.1.2", FANOUT)["expected_groups"]:
        [dup] = [r for r in g["run_ids"] if r != g["first_run_id"]]
        out.append((g["dag_id"], g["first_run_id"], dup))
    return out


def _lock_holder(url: str) -> int | None:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND ((classid::bigint << 32) | objid::bigint) = %s",
                (LOCK_KEY,),
            )
            row = cur.fetchone()
            return None if row is None else int(row[0])
    finally:
        conn.close()


def _terminate_lock_backend(url: str) -> None:
    pid = _lock_holder(url)
    if pid is None:
        return
    conn = psycopg2.connect(url)
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
    finally:
        conn.close()


def _later(delay: float, action: Callable[[], None], errors: list[BaseException]) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - reported by the trial
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@dataclass
class Trial:
    """One failover while remediations are in flight; ``cut`` ends the leader's lock connection."""

    server: AirflowServer
    rng: random.Random
    cut: Callable[[], None]
    started: set[str] = field(default_factory=set)  # duplicates whose task a worker started (ti_run said 200)
    errors: list[BaseException] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    fired: threading.Event = field(default_factory=threading.Event)
    max_hold: float = 0.0

    def fire(self) -> None:
        """At the first write: cut the leader's lock connection, and start some duplicates' tasks (as
        a worker would), each at its own random moment."""
        if self.fired.is_set():
            return
        self.fired.set()
        self.threads.append(_later(self.rng.uniform(0.0, 0.4), self.cut, self.errors))
        for dag_id, _, dup in _groups():
            if self.rng.random() < 0.5:
                self.threads.append(
                    _later(self.rng.uniform(0.0, 0.5), lambda d=dag_id, r=dup: self.start(d, r), self.errors)
                )

    def start(self, dag_id: str, run_id: str) -> None:
        """The duplicate's first task starts as with a worker (tests.airflow_server.start_task), unless
        dupguard stopped the run first: the scheduler's steps only on a run and task still waiting, then
        Airflow's own ``ti_run``, which refuses (409) a task already skipped."""
        conn = psycopg2.connect(self.server.db_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute(
                    "UPDATE dag_run SET state = 'running', start_date = coalesce(start_date, now()) "
                    "WHERE dag_id = %s AND run_id = %s AND state IN ('queued', 'running') RETURNING id",
                    (dag_id, run_id),
                )
                if cur.fetchone() is None:
                    return
                cur.execute(
                    "UPDATE task_instance SET state = 'queued', queued_dttm = now() WHERE dag_id = %s "
                    "AND run_id = %s AND task_id = 'extract' AND map_index = -1 "
                    "AND (state IS NULL OR state = 'scheduled') RETURNING id",
                    (dag_id, run_id),
                )
                row = cur.fetchone()
        finally:
            conn.close()
        if row is None:
            return
        status, data = _ti_run(self.server, str(row[0]), _run_payload(4242))
        if status == 200:
            self.started.add(run_id)
        elif status != 409:
            raise AssertionError(f"ti_run answered HTTP {status}: {data[:300]!r}")


class _FiresAtFirstWrite:
    """The db backend has no HTTP to slow: the first remediation's transaction fires the trial from
    inside (after its re-judgement under the row locks, before its write) and then holds for a random
    while, so the lock connection is cut while the write is in flight."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial

    def clock(self) -> datetime:
        if not self.trial.fired.is_set():
            self.trial.fire()
            hold = self.trial.rng.uniform(0.1, 1.0)
            self.trial.max_hold = max(self.trial.max_hold, hold)
            time.sleep(hold)
        return now_utc()


def _stopped(row: Any) -> bool:
    return bool(row.state == "failed" or (row.note or "").startswith("dupguard stopped"))


def _check(url: str, trial: Trial, label: str) -> None:
    after = db_state(url)
    for dag_id, kept, dup in _groups():
        k, d = after[kept], after[dup]
        where = f"{label}: {dag_id} (kept {kept}, duplicate {dup}; started by the test: {sorted(trial.started)})"
        assert not (_stopped(k) and _stopped(d)), f"{where}: both runs stopped\n{k}\n{d}"
        for row in (k, d):
            if row.note and row.note.startswith("dupguard stopped"):
                named = kept if kept in row.note else dup
                assert not _stopped(after[named]), f"{where}: the kept run {named} was stopped too"
        if dup not in trial.started:
            assert _stopped(d), f"{where}: the duplicate never started and was not stopped\n{d}"
            assert k.state == "queued" and k.note is None, f"{where}: the kept run was touched\n{k}"


def _settled(url: str, trial: Trial) -> bool:
    after = db_state(url)
    return all(_stopped(after[d]) or d in trial.started for _, _, d in _groups())


def _run_trial(
    server: AirflowServer, rng: random.Random, ledger: str, backend: str, daemons: list[Running], label: str
) -> None:
    url = server.reset(FANOUT)
    with CountingProxy(server.port) as proxy:
        trial = Trial(server, rng, cut=lambda: _terminate_lock_backend(url))
        settings = _settings(proxy, backend)
        if backend == "api":
            _hold_writes(proxy, trial)
        else:
            settings["backend_options"] = {"clock": _FiresAtFirstWrite(trial).clock}
        _replicas(url, ledger, settings, daemons)
        _judge(url, trial, label, proxy, daemons)


def _hold_writes(proxy: CountingProxy, trial: Trial) -> None:
    """Every write held by the proxy for a random while (never longer than one call timeout); the
    first one fires the trial."""
    holds = [trial.rng.uniform(0.3, TIMEOUT.total_seconds() * 0.9) for _ in range(30)]
    trial.max_hold = max(holds)
    proxy.inject = [("/api/v2/dags/", 0, h) for h in holds]
    proxy.hooks.append(("PATCH /api/v2/dags/", trial.fire))


def _judge(url: str, trial: Trial, label: str, proxy: CountingProxy, daemons: list[Running]) -> None:
    """Once the trial fired and every unstarted duplicate is stopped: both replicas stopped, then every
    write either of them sent has landed (the proxy holds none; a transaction still open ends within
    the longest hold), and only then what Airflow recorded. Checked any earlier, a write still held
    would land unseen, in the next trial's database (same run ids), and blame that trial."""
    wait_for(trial.fired.is_set, timeout=60, what=f"{label}: the first write")
    for thread in list(trial.threads):
        thread.join(20)
    assert not trial.errors, f"{label}: {trial.errors!r}"
    wait_for(lambda: _settled(url, trial), timeout=60, what=f"{label}: every unstarted duplicate stopped")
    for d in list(daemons):
        d.stop()
        daemons.remove(d)
    proxy.quiesce(timeout=30)
    time.sleep(trial.max_hold + 0.5)
    _check(url, trial, label)


def _settings(proxy: CountingProxy, backend: str) -> dict[str, Any]:
    return {
        "remediation": "fail",
        "remediation_backend": backend,
        "airflow_api_url": proxy.url,
        "airflow_username": "admin",
        "airflow_password": "admin",
        "airflow_timeout": TIMEOUT,
        "db_timeout": TIMEOUT,  # the db backend's takeover wait: lease + this
        "startup_lookback": LONG_AGO,
        "dispatch_options": {"retry_backoff": 0.2, "max_retry_backoff": 1.0},
    }


def _replicas(url: str, ledger: str, settings: dict[str, Any], daemons: list[Running]) -> None:
    """Two replicas: the first takes the lock, the second stands by."""
    durable = ledger == "durable"
    first = start_daemon(url, real_remediation=True, durable=durable, **settings)
    daemons.append(first)
    wait_for(first.is_leader, timeout=30, what="the first replica leads")
    daemons.append(start_daemon(url, real_remediation=True, durable=durable, **settings))


@pytest.mark.parametrize(("ledger", "backend"), COMBOS, ids=[f"{ledger}-{backend}" for ledger, backend in COMBOS])
def test_a_lost_lock_connection_never_lets_two_replicas_stop_both_runs(
    ledger: str, backend: str, af312: AirflowServer, daemons: list[Running]
) -> None:
    """``TRIALS`` trials per ledger and backend (20 in all), each with its own random timing."""
    seed = SEED + COMBOS.index((ledger, backend))
    print(f"fencing trials, {ledger} ledger, {backend}: seed {seed} (replay with DUPGUARD_FENCING_SEED={SEED})")
    rng = random.Random(seed)
    for n in range(TRIALS):
        _run_trial(af312, rng, ledger, backend, daemons, f"seed {seed}, trial {n} ({ledger} ledger, {backend})")


def test_a_pgbouncer_restart_during_the_remediation_never_stops_both_runs(
    af312: AirflowServer, daemons: list[Running]
) -> None:
    """The lock connection goes through a real PgBouncer (transaction pooling: the transaction lock),
    restarted while the leader's writes are held by the proxy; both replicas lose their lock
    connections and whichever reconnects first leads. Memory ledger, api backend: the worst case."""
    rng = random.Random(SEED + len(COMBOS))
    url = af312.reset(FANOUT)
    with pgbouncer.pgbouncer(url, "transaction") as bounced, CountingProxy(af312.port) as proxy:
        trial = Trial(af312, rng, cut=lambda: pgbouncer.restart(bounced))
        _hold_writes(proxy, trial)
        settings = _settings(proxy, "api") | {"lock_database_url": bounced}
        _replicas(url, "memory", settings, daemons)
        _judge(url, trial, f"seed {SEED + len(COMBOS)}, PgBouncer restart", proxy, daemons)


@pytest.mark.parametrize("reread", ["database", "api"])
def test_the_api_backend_leaves_a_duplicate_alone_once_a_late_write_stopped_its_kept_run(
    af312: AirflowServer, reread: str
) -> None:
    """The trials' failure of 2026-12-01, made deterministic: a deposed leader's PATCH (its own
    judgement: keep the other run) lands after the new leader judged the group; the new leader's stop
    of its duplicate — that very kept run's partner — must be refused, whether the guard re-reads the
    database or, as with ``--source api``, Airflow's REST API. Truth from what Airflow recorded."""
    url = af312.reset(FANOUT)
    engine = make_engine(parse_url(url))
    try:
        db = open_airflow_db(engine)
        now = datetime.now(UTC)
        finding = next(f for f in scan(db, now=now).findings if f.duplicates)
        kept, [dup] = finding.kept, finding.duplicates
        settings = _api_settings(af312, url)
        states = ApiRunStates(api_reader(settings)) if reread == "api" else None
        if states is None:
            remediator = build_remediator(settings, engine, db.tables, Metrics())
        else:
            remediator = build_remediator(settings, None, None, Metrics(), family=Family.AIRFLOW_3_1, states=states)
        assert isinstance(remediator, GuardedRemediator)

        def stop(target: Run, keep: Run) -> Action:
            note = note_for(finding, target, now)
            return Action(finding.key, finding.dag_id, target, keep.run_id, Outcome.REMEDIATE, Mode.FAIL, note)

        late = remediator.execute(stop(kept, dup))  # the deposed leader's write, through Airflow's API
        assert late.result is Result.DONE, late.detail
        before = db_state(url)

        result = remediator.execute(stop(dup, kept))

        assert result.result is Result.SKIPPED and "was stopped as a duplicate" in result.detail, result.detail
        assert db_state(url) == before
        assert before[dup.run_id].state == "queued" and before[dup.run_id].note is None
    finally:
        engine.dispose()


def test_the_api_backend_finishes_a_stop_whose_skips_landed_alone(af312: AirflowServer) -> None:
    """Seen in the trials: a PATCH whose request failed after set-failed's own sessions committed the
    skips (3.1.2) left the duplicate queued without its note, and the retry took it for ``already``.
    Now the retry's PATCH fails it and writes the note (tests/integration/test_half_landed_stop.py)."""
    url = af312.reset(FANOUT)
    engine = make_engine(parse_url(url))
    try:
        db = open_airflow_db(engine)
        now = datetime.now(UTC)
        action = next(a for a in plan(scan(db, now=now).findings, Mode.FAIL, now=now) if a.outcome is Outcome.REMEDIATE)
        settings = _api_settings(af312, url)
        remediator = build_remediator(settings, engine, db.tables, Metrics())
        skip_every_task(url, action.dag_id, action.run.run_id)

        result = remediator.execute(action)

        assert result.result is Result.DONE, result.detail
        after = db_state(url)[action.run.run_id]
        assert after.state == "failed" and after.note == action.note
        assert db_state(url)[action.kept_run_id].state == "queued"
    finally:
        engine.dispose()


def _api_settings(server: AirflowServer, url: str) -> Config:
    """fail mode through the server's API, straight (no proxy)."""
    return Config.of(
        database_url=url,
        remediation="fail",
        remediation_backend="api",
        airflow_api_url=server.url,
        airflow_username="admin",
        airflow_password="admin",
    )
