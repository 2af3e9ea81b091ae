"""A real HA Airflow 3.1.2 with dupguard in front of it: start, run, drain, stop.

One ``Cluster`` is one run: a fresh PostgreSQL database (``e2e_<hex>`` on the test server),
``airflow db migrate``, the API server, one DAG processor and **two schedulers**
(``--skip-serve-logs``, LocalExecutor) from ``.airflow-venvs/<version>``, and ``dupguard run`` as a
separate process, as in a scheduler pod (JSON logs to a file, durable ledger made by
``dupguard init-db``, remediation through the API server or the ``db`` backend). No triggerer: the
DAGs have no deferrable tasks and no AssetWatcher.

Every process runs in its own session (``start_new_session``); teardown signals every process of
those sessions (found through ``/proc``, so LocalExecutor workers and task processes that changed
their process group are included), first SIGTERM, then SIGKILL. Logs stay in the run directory,
whose path is in every error message. All traffic is on 127.0.0.1; ports are chosen free.

DAGs (``tests/e2e/dags/``): the user's producer (sleep shortened) and consumer, ``consumer_fanout_<i>``
and ``consumer_serial`` (``max_active_runs=1``). With ``RunSpec(dags="partitioned")`` (Airflow 3.2+)
the DAG set is ``tests/e2e/dags_partitioned/`` instead: ``producer_partitioned`` (``schedule=None``,
triggered by the harness through the REST API every ``producer_sleep + 1`` s with a new
``partition_key``) and ``consumer_partitioned`` (``PartitionedAssetTimetable``, identity mapper).
With ``RunSpec(bursts=N)`` the DAGs of ``tests/e2e/dags_bursts/`` run beside them: ``producer_bursts``
(N events of its own asset after each ``burst_gap``) and its consumers ``consumer_burst`` and
``consumer_burst_serial`` (``max_active_runs=1``): asset events that trigger nothing (stranded_events).
With ``RunSpec(sqs_messages=N)``, moto's SQS server (``tests/e2e/sqs.py``), the triggerers, and
``tests/e2e/dags_sqs/``: the AWS provider's ``SqsSensorTrigger`` watching an asset, ``consumer_sqs`` on it,
N messages put on the queue by the harness (trigger_event, ``tests/e2e/family_sqs.py``).
Fault injection and the worker pickup delay are in ``tests/e2e/site/sitecustomize.py`` (schedulers'
``PYTHONPATH`` only). The guard (docs/how-to/guard.md), when on, is ``dupguard guard print-local-settings``
written to ``$AIRFLOW_HOME/config/airflow_local_settings.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url

from tests.airflow_server import JWT_SECRET, AirflowServer, _wait_ready, free_port, venv_for
from tests.e2e.sqs import Sqs, aws_env, moto_argv
from tests.pg import ROOT, admin_url, database_url, execute_admin

HERE = Path(__file__).resolve().parent
DAGS = HERE / "dags"
DAGS_PARTITIONED = HERE / "dags_partitioned"
DAGS_WATCHER = HERE / "dags_watcher"
DAGS_BURSTS = HERE / "dags_bursts"
DAGS_SQS = HERE / "dags_sqs"
PRODUCER_BURSTS = "producer_bursts"
SITE = HERE / "site"
DUPGUARD = str(Path(sys.executable).parent / "dupguard")
PRODUCER = "producer_asset_trigger"
PRODUCER_PARTITIONED = "producer_partitioned"
# Simple auth manager users (user:role). dupguard acts as its own user with role "user", the least
# role that may edit DAG runs (docs/explanation/remediation.md); admin is for people looking at the UI.
USERS = {"admin": "admin", "dupguard": "user"}


class HarnessError(RuntimeError):
    """Something in the cluster failed; the message names the run directory with every log."""


@dataclass(frozen=True)
class RunSpec:
    """One cell of the matrix. ``fault_max_ms`` 0 means no fault injection."""

    name: str = "e2e"
    airflow_version: str = "3.1.2"
    backend: str = "api"  # api | db
    source: str = "database"  # database | api (dupguard's --source)
    mode: str = "fail"  # fail | skip | dry-run | off
    pickup_delay: float = 0.0  # seconds before a consumer task's ti_run (LocalExecutor worker)
    guard: bool = False  # in-scheduler guard via airflow_local_settings.py
    fault_max_ms: float = 0.0  # random 0..N ms between the unlocked ADRQ read and the DagModel lock
    duration: float = 180.0  # seconds of producer activity (after the first asset event)
    fanout: int = 1  # consumer_fanout_<i> DAGs besides the user's consumer and consumer_serial
    producer_sleep: float = 2.0  # the user's producer slept 30 s
    parallelism: int = 4  # per scheduler (LocalExecutor worker processes)
    drain_timeout: float = 240.0
    dags: str = "asset"  # asset (tests/e2e/dags) | partitioned (tests/e2e/dags_partitioned, Airflow 3.2+)
    executor: str = "local"  # local | celery (Redis broker, PostgreSQL result backend, ``celery_workers`` workers)
    celery_workers: int = 2
    worker_concurrency: int = 4  # per Celery worker
    watcher: bool = False  # triggerer + AssetWatcher (tests/e2e/dags_watcher): consumer_watched, consumer_two_assets
    watch_interval: float = 4.0  # seconds between two files for the watcher's FileDeleteTrigger
    serial_task_seconds: float = 0.0  # consumer_serial's task sleeps this long (events pile up behind it)
    triggerers: int = 1  # with ``watcher``: 2 gives HA triggerers (each may run the same trigger)
    replicas: int = 1  # dupguard replicas (each as in a scheduler pod)
    leader_kills: int = 0  # SIGKILLs of the leading replica at random moments of the workload (restarted 1 s later)
    api_outage: float = 0.0  # seconds the API server is stopped, once, at a random moment of the workload
    seed: int = 0  # the random moments of kills and outage (0: a fresh seed, recorded in the report)
    # Events per burst of tests/e2e/dags_bursts (0: no burst DAGs), the wait before each burst, the
    # serial consumer's task duration, and dupguard's stranded_events interval (0: its default).
    bursts: int = 0
    burst_gap: float = 20.0
    burst_serial_seconds: float = 6.0
    stranded_poll_interval: float = 0.0
    poll_interval: str = ""  # dupguard's --poll-interval, e.g. "20ms" (empty: its default)
    # The SQS AssetWatcher (tests/e2e/dags_sqs, needs ``triggerers``): messages the harness puts on moto's
    # queue, evenly over ``duration`` (0: none); the visibility timeout of every receive (None: the
    # queue's 30 s); consumer_sqs's task duration.
    sqs_messages: int = 0
    sqs_visibility_timeout: int | None = 0
    sqs_task_seconds: float = 8.0

    @property
    def partitioned(self) -> bool:
        return self.dags == "partitioned"

    @property
    def producer(self) -> str:
        return PRODUCER_PARTITIONED if self.partitioned else PRODUCER

    @property
    def dags_dir(self) -> Path:
        return DAGS_PARTITIONED if self.partitioned else DAGS

    def consumers(self) -> list[str]:
        if self.partitioned:
            return ["consumer_partitioned"]
        return [
            "consumer_asset_listener",
            *(f"consumer_fanout_{i + 1}" for i in range(self.fanout)),
            "consumer_serial",
            *(["consumer_watched", "consumer_two_assets"] if self.watcher else []),
            *(["consumer_burst", "consumer_burst_serial"] if self.bursts else []),
            *(["consumer_sqs"] if self.sqs_messages else []),
        ]

    def producers(self) -> list[str]:
        return [self.producer, *([PRODUCER_BURSTS] if self.bursts else [])]

    def dag_ids(self) -> list[str]:
        return [*self.producers(), *self.consumers()]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class Timings:
    marks: dict[str, float] = field(default_factory=dict)
    _t0: float = field(default_factory=time.monotonic)

    def mark(self, name: str) -> None:
        self.marks[name] = round(time.monotonic() - self._t0, 1)


def session_members(sid: int) -> list[int]:
    """PIDs whose session id is ``sid`` (Linux /proc): the whole tree of a process we started."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may contain spaces and parentheses
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:
            out.append(int(entry.name))
    return out


def kill_session(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM every process of ``proc``'s session, wait up to ``grace`` s, then SIGKILL the rest."""
    sid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        members = session_members(sid)
        if proc.poll() is None and sid not in members:
            members.append(sid)
        if not members:
            break
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()  # reap the leader so it leaves /proc
            if not session_members(sid):
                break
            time.sleep(0.2)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1)


class Cluster:
    """Start with ``start()``; always call ``stop()`` (``with Cluster(...) as c`` does)."""

    def __init__(self, spec: RunSpec, run_dir: Path, *, keep_db: bool = False) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.keep_db = keep_db
        self.home = run_dir / "airflow-home"
        self.venv = venv_for(spec.airflow_version)
        self.db_name = f"e2e_{uuid.uuid4().hex[:10]}"
        self.db_url = database_url(self.db_name)
        self.procs: dict[str, Proc] = {}
        self.replica_ports: dict[str, int] = {}
        self.api_port = 0
        self.dupguard_http_port = 0
        self.timings = Timings()
        self._engine: Engine | None = None
        self._db_created = False
        self.dupguard_logs: list[Path] = []  # every incarnation of every replica, in start order
        self.drained = False
        self.drain_stuck: dict[str, Any] = {}
        self._token = ""
        self._next_trigger = 0.0
        self.partitions_triggered = 0
        self.redis_port = 0
        self.watch_file = run_dir / "watch" / "event"
        self.watch_files_written = 0
        self._next_watch = 0.0
        self.sqs: Sqs | None = None
        self.sqs_sent: list[dict[str, Any]] = []  # {"message_id", "sent_at"} per message put on the queue
        self._sqs_start = 0.0
        self.seed = spec.seed or random.SystemRandom().randrange(1, 2**31)
        self.rng = random.Random(self.seed)
        # What the harness did to the cluster and when (UTC): leader kills, API outage. The judge
        # (tests/e2e/truth.py) reads the outage window from here.
        self.faults: list[dict[str, Any]] = []
        self._down: set[str] = set()  # processes stopped on purpose (not a failure in check_alive)
        self._restarts: dict[str, int] = {}

    @property
    def dupguard_log(self) -> Path:
        """The first replica's first log (``dupguard.log`` with one replica)."""
        return self.dupguard_logs[0] if self.dupguard_logs else self.run_dir / "dupguard.log"

    def triggerer_names(self) -> list[str]:
        """``triggerer`` alone, or ``triggerer-1`` .. ``triggerer-N`` (their logs: ``<name>.log``)."""
        n = self.spec.triggerers
        return ["triggerer"] if n == 1 else [f"triggerer-{i}" for i in range(1, n + 1)]

    def replica_names(self) -> list[str]:
        return ["dupguard"] if self.spec.replicas == 1 else [f"dupguard-{i + 1}" for i in range(self.spec.replicas)]

    # --- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.stop(strict=exc_type is None)

    def fail(self, what: str, proc: Proc | None = None) -> HarnessError:
        detail = f"\n--- last lines of {proc.log} ---\n{proc.tail()}" if proc else ""
        return HarnessError(f"{what} (every log is in {self.run_dir}){detail}")

    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "spec.json").write_text(json.dumps(asdict(self.spec), indent=2))
        admin_url()  # starts the test PostgreSQL if the test script did not
        execute_admin(f'CREATE DATABASE "{self.db_name}"')
        self._db_created = True
        self._engine = create_engine(self._sa_url(), pool_size=2, max_overflow=2, pool_pre_ping=True)
        if self.spec.executor == "celery":
            self._start_redis()
        self._write_home()
        if self.spec.sqs_messages:
            self._start_sqs()
        self._run_airflow("db-migrate", ["db", "migrate"], timeout=300)
        self.timings.mark("migrated")
        self.api_port = free_port()
        self._spawn_api()
        self._spawn("dag-processor", [self._airflow, "dag-processor"])
        self._wait_api()
        self.timings.mark("api_ready")
        self._wait_dags()
        self.timings.mark("dags_parsed")
        for name in self.replica_names():
            self._start_dupguard(name)
        self.timings.mark("dupguard_watching")
        if self.spec.watcher or self.spec.sqs_messages:
            for name in self.triggerer_names():
                self._spawn(name, [self._airflow, "triggerer", "--skip-serve-logs"])
        if self.spec.executor == "celery":
            self._start_celery_workers()
            self.timings.mark("celery_workers_ready")
        for i in (1, 2):
            self._spawn(f"scheduler-{i}", [self._airflow, "scheduler", "--skip-serve-logs"], scheduler=True)
        self._wait_schedulers()
        self.timings.mark("schedulers_running")

    def stop(self, *, strict: bool = True) -> None:
        """Stop everything (schedulers first, so no run is created unseen), keep logs, drop the DB.

        ``strict``: raise if a process survived SIGKILL (off while another error is on its way out,
        so that error is the one reported)."""
        order = [
            "scheduler-1",
            "scheduler-2",
            *self.triggerer_names(),
            "dag-processor",
            *self.replica_names(),
            "api-server",
        ]
        for name in order + [n for n in self.procs if n not in order]:
            proc = self.procs.get(name)
            if proc is not None:
                kill_session(proc.popen)
        leftovers = {n: session_members(p.popen.pid) for n, p in self.procs.items()}
        leftovers = {n: pids for n, pids in leftovers.items() if pids}
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
        if self._db_created and not self.keep_db:
            with contextlib.suppress(Exception):
                execute_admin(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
            self._db_created = False
        if leftovers and strict:
            raise HarnessError(f"processes left after teardown: {leftovers} (logs in {self.run_dir})")

    # --- the run ---------------------------------------------------------------------------------
    def run_workload(self) -> None:
        """Wait for the first asset event, let the producer run ``duration`` s, then drain."""
        deadline = time.monotonic() + 240
        while self.scalar("SELECT count(*) FROM asset_event") == 0:
            self.check_alive()
            self._trigger_partition()
            self._write_watch_file()
            self._send_sqs()
            if time.monotonic() > deadline:
                raise self.fail("no asset event within 240 s of the schedulers starting", self.procs["scheduler-1"])
            time.sleep(0.5 if self.spec.partitioned else 1)
        self.timings.mark("first_event")
        start = time.monotonic()
        end = start + self.spec.duration
        self._sqs_start = start
        plan = self._fault_plan(start)
        while time.monotonic() < end:
            self.check_alive()
            self._trigger_partition()
            self._write_watch_file()
            self._send_sqs()
            while plan and plan[0][0] <= time.monotonic():
                _, action = plan.pop(0)
                action()
            time.sleep(0.5)
        for _, action in plan:  # a fault planned past the end (rounding) still happens
            action()
        self.execute("UPDATE dag SET is_paused = true WHERE dag_id = ANY(:d)", d=self.spec.producers())
        self.timings.mark("producer_paused")
        self.drained = self._drain()
        self.timings.mark("drained")
        time.sleep(3)  # dupguard polls every 20 ms; give its last outcome lines time to land

    def _trigger_partition(self) -> None:
        """Partitioned DAG set only: trigger one producer run with a new partition_key when due."""
        if not self.spec.partitioned or time.monotonic() < self._next_trigger:
            return
        self._next_trigger = time.monotonic() + self.spec.producer_sleep + 1.0
        base = f"http://127.0.0.1:{self.api_port}"
        if not self._token:
            password = json.loads((self.home / "passwords.json").read_text())["admin"]
            self._token = _post_json(f"{base}/auth/token", {"username": "admin", "password": password})["access_token"]
        key = f"p{self.partitions_triggered:05d}"
        _post_json(
            f"{base}/api/v2/dags/{self.spec.producer}/dagRuns",
            {"logical_date": None, "partition_key": key},
            token=self._token,
        )
        self.partitions_triggered += 1

    def _write_watch_file(self) -> None:
        """Watcher cells: put the file the FileDeleteTrigger waits for, every ``watch_interval`` s
        (the trigger deletes it when it fires; an undeleted file is not written twice)."""
        if not self.spec.watcher or time.monotonic() < self._next_watch:
            return
        self._next_watch = time.monotonic() + self.spec.watch_interval
        if self.watch_file.exists():
            return
        tmp = self.watch_file.with_suffix(".tmp")
        tmp.write_text(str(self.watch_files_written))
        tmp.rename(self.watch_file)  # the trigger never sees a half-written file
        self.watch_files_written += 1

    def _start_sqs(self) -> None:
        """moto's server on a free port and the watcher's queue, before any Airflow process: the DAG
        file reads the queue's URL when it is parsed."""
        port = free_port()
        self._spawn("moto", moto_argv(self.venv, port), env={"PATH": os.environ.get("PATH", "")})
        self.sqs = Sqs(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        while not self.sqs.ready():
            self.check_alive()
            if time.monotonic() > deadline:
                raise self.fail("moto's server did not answer within 60 s", self.procs["moto"])
            time.sleep(0.3)
        self.sqs.create_queue()

    def _send_sqs(self) -> None:
        """SQS cells: the first message at once (the run starts at the first asset event), message i
        at ``i * duration / sqs_messages`` s into the workload."""
        n = len(self.sqs_sent)
        if self.sqs is None or n >= self.spec.sqs_messages:
            return
        if n and (
            not self._sqs_start or time.monotonic() < self._sqs_start + n * self.spec.duration / self.spec.sqs_messages
        ):
            return
        body = json.dumps({"seq": n, "sent_by": "dupguard-e2e"})
        self.sqs_sent.append({"message_id": self.sqs.send(body), "sent_at": datetime.now(UTC).isoformat()})

    # --- faults ----------------------------------------------------------------------------------
    def _fault_plan(self, start: float) -> list[tuple[float, Any]]:
        """Random moments (seeded, ``self.seed``) in the workload for the leader kills and the API
        outage, as (monotonic time, action), sorted. Kills fall in 5-95 % of the duration, at least
        5 s apart; the outage starts in 20-50 % so it ends well before the producer stops."""
        d = self.spec.duration
        plan: list[tuple[float, Any]] = []
        if self.spec.api_outage:
            plan.append((start + d * self.rng.uniform(0.2, 0.5), self._api_outage))
        moments: list[float] = []
        while len(moments) < self.spec.leader_kills:
            t = d * self.rng.uniform(0.05, 0.95)
            if all(abs(t - m) >= min(5.0, d / (2 * self.spec.leader_kills)) for m in moments):
                moments.append(t)
        plan += [(start + t, self._kill_leader) for t in moments]
        return sorted(plan, key=lambda item: item[0])

    def _fault(self, what: str, **fields: Any) -> None:
        self.faults.append({"what": what, "at": datetime.now(UTC).isoformat(), **fields})

    def leader(self) -> str | None:
        """The replica whose /metrics says ``dupguard_leader 1`` (None if none does right now)."""
        for name in self.replica_names():
            if name in self._down or name not in self.procs:
                continue
            port = self.replica_ports[name]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    body = response.read().decode()
            except OSError:
                continue
            if re.search(r"^dupguard_leader 1(\.0)?$", body, re.MULTILINE):
                return name
        return None

    def _kill_leader(self) -> None:
        """SIGKILL the leading replica (its whole session, as a container runtime does), restart it
        1 s later with a new log file (a killed writer can leave half a line)."""
        name = None
        deadline = time.monotonic() + 5
        while name is None and time.monotonic() < deadline:
            name = self.leader()
            if name is None:
                time.sleep(0.2)
        if name is None:
            self._fault("leader_kill_skipped", why="no replica reported dupguard_leader 1 within 5 s")
            return
        proc = self.procs[name]
        for pid in session_members(proc.popen.pid) or [proc.popen.pid]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._fault("leader_killed", replica=name)
        self._down.add(name)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=5)
        time.sleep(1.0)
        self._start_dupguard(name, wait=False)
        self._down.discard(name)
        self._fault("replica_restarted", replica=name)

    def _api_outage(self) -> None:
        """Stop the API server (its whole session), keep it down ``api_outage`` s, start it again on
        the same port and wait until it answers. Blocks the workload loop meanwhile (the producer and
        the watcher file keep going: the scheduler and the triggerer do not need the API server)."""
        self._down.add("api-server")
        kill_session(self.procs["api-server"].popen, grace=5.0)
        self._fault("api_down")
        until = time.monotonic() + self.spec.api_outage
        while time.monotonic() < until:
            self._write_watch_file()
            self._send_sqs()
            time.sleep(0.5)
        self._spawn_api()
        self._fault("api_started")
        self._wait_api()
        self._down.discard("api-server")
        self._fault("api_ready")

    def check_alive(self) -> None:
        for proc in self.procs.values():
            if proc.name in self._down:
                continue
            if not proc.alive():
                raise self.fail(f"{proc.name} exited with code {proc.popen.returncode}", proc)

    def _drain(self) -> bool:
        """True once nothing is left to do: the producer's last task finished, no queued or running
        consumer run, no queued asset, for 5 s in a row. (A paused DAG's running run is never
        examined again, so the producer's own run may stay 'running'; only its tasks count.)"""
        consumers = self.spec.consumers()
        deadline = time.monotonic() + self.spec.drain_timeout
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            self.check_alive()
            busy = self.scalar(
                "SELECT (SELECT count(*) FROM dag_run WHERE dag_id = ANY(:c) AND state IN ('queued', 'running'))"
                " + (SELECT count(*) FROM asset_dag_run_queue)"
                + (
                    " + (SELECT count(*) FROM asset_partition_dag_run WHERE created_dag_run_id IS NULL)"
                    if self.spec.partitioned
                    else ""
                )
                # The producer's tasks that can still emit an event: not 'scheduled' ones, which the
                # scheduler never queues once the DAG is paused (`~DM.is_paused` in the query of
                # executable tasks, scheduler_job_runner.py L400 in 3.1.2), so the drain would wait for ever.
                + " + (SELECT count(*) FROM task_instance WHERE dag_id = ANY(:p)"
                "    AND state IN ('queued', 'running', 'up_for_retry', 'restarting'))",
                c=consumers,
                p=self.spec.producers(),
            )
            if self.spec.watcher and self.watch_file.exists():
                busy += 1  # the trigger has not fired for the last file yet
            if self.sqs is not None:
                busy += self.sqs.left()  # messages no trigger has received and deleted yet
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= 5:
                return True
            time.sleep(1)
        self.drain_stuck = self._stuck()
        return False

    def _stuck(self) -> dict[str, Any]:
        """What kept the drain busy (for the report when it timed out): unfinished consumer runs with
        their task states, queue rows, the producer's unfinished tasks, the watcher file."""
        assert self._engine is not None
        with self._engine.connect() as conn:
            runs = conn.execute(
                text(
                    "SELECT dr.dag_id, dr.run_id, dr.state, array_agg(ti.state) AS tis FROM dag_run dr"
                    " LEFT JOIN task_instance ti ON ti.dag_id = dr.dag_id AND ti.run_id = dr.run_id"
                    " WHERE dr.dag_id = ANY(:c) AND dr.state IN ('queued', 'running')"
                    " GROUP BY dr.dag_id, dr.run_id, dr.state"
                ),
                {"c": self.spec.consumers()},
            ).all()
            queue = conn.execute(text("SELECT target_dag_id, asset_id FROM asset_dag_run_queue")).all()
            producer = conn.execute(
                text(
                    "SELECT run_id, state FROM task_instance"
                    " WHERE dag_id = ANY(:p) AND state NOT IN ('success', 'failed')"
                ),
                {"p": self.spec.producers()},
            ).all()
        return {
            "runs": [[r.dag_id, r.run_id, r.state, [str(t) for t in r.tis]] for r in runs],
            "asset_dag_run_queue": [list(q) for q in queue],
            "producer_tasks": [list(t) for t in producer],
            "watch_file": self.watch_file.exists(),
        }

    # --- database helpers ------------------------------------------------------------------------
    def _sa_url(self) -> str:
        return make_url(self.db_url).set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)

    def scalar(self, statement: str, **params: Any) -> Any:
        assert self._engine is not None
        with self._engine.connect() as conn:
            return conn.execute(text(statement), params).scalar()

    def execute(self, statement: str, **params: Any) -> None:
        assert self._engine is not None
        with self._engine.begin() as conn:
            conn.execute(text(statement), params)

    # --- Airflow ---------------------------------------------------------------------------------
    @property
    def _airflow(self) -> str:
        return str(self.venv / "bin" / "airflow")

    def _spawn_api(self) -> None:
        self._spawn("api-server", [self._airflow, "api-server", "--host", "127.0.0.1", "--port", str(self.api_port)])

    def _write_home(self) -> None:
        (self.home / "dags").mkdir(parents=True, exist_ok=True)
        (self.home / "config").mkdir(exist_ok=True)
        dirs = [
            self.spec.dags_dir,
            *([DAGS_WATCHER] if self.spec.watcher else []),
            *([DAGS_BURSTS] if self.spec.bursts else []),
            *([DAGS_SQS] if self.spec.sqs_messages else []),
        ]
        for dag in (d for dags in dirs for d in dags.glob("*.py")):
            shutil.copy(dag, self.home / "dags" / dag.name)
        self.watch_file.parent.mkdir(parents=True, exist_ok=True)
        (self.home / "passwords.json").write_text(json.dumps({u: f"{u}-e2e-pw" for u in USERS}))
        if self.spec.guard:
            snippet = subprocess.run(
                [DUPGUARD, "guard", "print-local-settings"], check=True, capture_output=True, text=True, timeout=60
            ).stdout
            (self.home / "config" / "airflow_local_settings.py").write_text(snippet)

    def airflow_env(self, *, scheduler: bool = False) -> dict[str, str]:
        spec = self.spec
        base = f"http://127.0.0.1:{self.api_port or 8080}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "DUPGUARD_", "PYTHON"))}
        env |= {
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self._sa_url(),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_PRE_PING": "True",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor" if spec.executor == "celery" else "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(spec.parallelism),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS": "False",
            "AIRFLOW__SCHEDULER__USE_ROW_LEVEL_LOCKING": "True",
            "AIRFLOW__DAG_PROCESSOR__PARSING_PROCESSES": "1",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",  # the DAG files never change
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "600",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.home / "passwords.json"),
            # docs/explanation/airflow-internals.md, "Authentication": HTTP 500 without it
            "AIRFLOW__API_AUTH__JWT_ISSUER": "airflow",
            "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET,
            "AIRFLOW__API__SECRET_KEY": JWT_SECRET,
            "AIRFLOW__API__BASE_URL": base,
            "AIRFLOW__API__WORKERS": "1",
            # docs/explanation/airflow-internals.md, "Running a real Airflow for tests"
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            # A worker whose ti_run reached the API server but timed out (API outage cells) leaves the
            # task running with no heartbeat; Airflow fails it after this many seconds (default 300,
            # longer than the drain would wait). Only such orphans are affected.
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
            "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
            "VIRTUAL_ENV": str(self.venv),
            "DUPGUARD_E2E_PRODUCER_SLEEP": str(spec.producer_sleep),
            "DUPGUARD_E2E_FANOUT": str(spec.fanout),
            "DUPGUARD_E2E_SERIAL_SECONDS": str(spec.serial_task_seconds),
            "DUPGUARD_E2E_WATCH_FILE": str(self.watch_file),
            "DUPGUARD_E2E_BURST": str(spec.bursts),
            "DUPGUARD_E2E_BURST_GAP": str(spec.burst_gap),
            "DUPGUARD_E2E_BURST_SERIAL_SECONDS": str(spec.burst_serial_seconds),
        }
        if self.sqs is not None:
            visibility = spec.sqs_visibility_timeout
            env |= aws_env(self.sqs.endpoint) | {
                "DUPGUARD_E2E_SQS_QUEUE_URL": self.sqs.queue_url,
                "DUPGUARD_E2E_SQS_VISIBILITY": "" if visibility is None else str(visibility),
                "DUPGUARD_E2E_SQS_TASK_SECONDS": str(spec.sqs_task_seconds),
            }
        if spec.executor == "celery":
            env |= {
                "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:{self.redis_port}/0",
                "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self._sa_url()}",
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(spec.worker_concurrency),
                # docs/explanation/airflow-internals.md, "Running a real Airflow for tests": without a socket timeout
                # the prefork children hang for ever at start-up
                # in kombu's after-fork cleanup (a BRPOP reply on the socket shared with the parent).
                "AIRFLOW__CELERY_BROKER_TRANSPORT_OPTIONS__SOCKET_TIMEOUT": "5",
            }
        if scheduler:
            # Only the schedulers (and their forked LocalExecutor workers) see the harness hooks.
            paths = [str(SITE)]
            if spec.guard:
                paths.append(str(self.home / "config"))
            env["PYTHONPATH"] = ":".join(paths)
            if spec.fault_max_ms:
                env["DUPGUARD_E2E_FAULT_MAX_MS"] = str(spec.fault_max_ms)
            if spec.pickup_delay:
                env["DUPGUARD_E2E_PICKUP_DELAY"] = str(spec.pickup_delay)
        return env

    def _run_airflow(self, name: str, args: list[str], timeout: float) -> None:
        log = self.run_dir / f"{name}.log"
        with log.open("wb") as out:
            try:
                rc = subprocess.run(
                    [self._airflow, *args],
                    env=self.airflow_env(),
                    cwd=self.home,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=timeout,
                    start_new_session=True,
                ).returncode
            except subprocess.TimeoutExpired:
                raise self.fail(f"airflow {' '.join(args)} took more than {timeout:.0f} s") from None
        if rc != 0:
            raise HarnessError(f"airflow {' '.join(args)} exited with {rc}; log {log}:\n{log.read_text()[-3000:]}")

    def _spawn(
        self,
        name: str,
        argv: list[str],
        *,
        scheduler: bool = False,
        env: dict[str, str] | None = None,
        log_name: str = "",
    ) -> Proc:
        log = self.run_dir / f"{log_name or name}.log"
        with log.open("ab") as out:  # the child keeps its own descriptor
            popen = subprocess.Popen(
                argv,
                env=env if env is not None else self.airflow_env(scheduler=scheduler),
                cwd=self.home if env is None else self.run_dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log)
        self.procs[name] = proc
        return proc

    def _start_redis(self) -> None:
        """The Celery broker: Debian's redis-server (scripts/redis.sh installs it when missing) as a
        child of the harness on a free port, no persistence, stopped with the rest."""
        binary = subprocess.run(
            [str(ROOT / "scripts" / "redis.sh")], check=True, capture_output=True, text=True, timeout=600
        ).stdout.strip()
        self.redis_port = free_port()
        argv = [binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self._spawn("redis", [*argv, "--dir", str(self.run_dir)], env={"PATH": os.environ.get("PATH", "")})
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.check_alive()
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.redis_port), 1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.2)
        raise self.fail("redis-server did not answer PING within 30 s", self.procs["redis"])

    def _start_celery_workers(self, timeout: float = 180.0) -> None:
        """``airflow celery worker`` x ``celery_workers``, each with its own hostname and no log
        server (docs/explanation/airflow-internals.md, "Running a real Airflow for tests"); ready once each logs
        Celery's ``ready.`` line."""
        names = [f"celery-worker-{i + 1}" for i in range(self.spec.celery_workers)]
        for i, name in enumerate(names):
            argv = [self._airflow, "celery", "worker", "--skip-serve-logs"]
            argv += ["--concurrency", str(self.spec.worker_concurrency), "--celery-hostname", f"w{i + 1}@%h"]
            self._spawn(name, argv)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if all(" ready." in self.procs[n].log.read_text(errors="replace") for n in names):
                return
            time.sleep(1)
        raise self.fail(f"Celery workers not ready within {timeout:.0f} s", self.procs[names[-1]])

    def _wait_api(self) -> None:
        proc = self.procs["api-server"]
        server = AirflowServer(
            version=self.spec.airflow_version,
            url=f"http://127.0.0.1:{self.api_port}",
            port=self.api_port,
            live_db=self.db_name,
            sources={},
            log_path=proc.log,
            process=proc.popen,
        )
        try:
            _wait_ready(server, 240.0)
        except RuntimeError as exc:
            raise self.fail(f"API server: {exc}") from None

    def _wait_dags(self, timeout: float = 300.0) -> None:
        want = set(self.spec.dag_ids())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            assert self._engine is not None
            with self._engine.connect() as conn:
                have = {r[0] for r in conn.execute(text("SELECT dag_id FROM serialized_dag"))}
            if want <= have:
                return
            time.sleep(1)
        missing = sorted(want - have)
        raise self.fail(f"DAGs not parsed within {timeout:.0f} s: missing {missing}", self.procs["dag-processor"])

    def _wait_schedulers(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            n = self.scalar(
                "SELECT count(*) FROM job WHERE job_type = 'SchedulerJob' AND state = 'running'"
                " AND latest_heartbeat > now() - interval '30 seconds'"
            )
            if n >= 2:
                return
            time.sleep(1)
        raise self.fail(f"two schedulers not heartbeating within {timeout:.0f} s", self.procs["scheduler-2"])

    # --- dupguard --------------------------------------------------------------------------------
    def dupguard_env(self, port: int = 0) -> dict[str, str]:
        password_file = self.run_dir / "dupguard-airflow-password"
        password_file.write_text(json.loads((self.home / "passwords.json").read_text())["dupguard"])
        self.dupguard_http_port = port or free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DUPGUARD_", "AIRFLOW"))}
        if self.spec.source == "api":
            # The api source reads only the REST API: no database URL at all; its cursor
            # and decisions go to a state file, as on the chart's volume.
            env["DUPGUARD_STATE_FILE"] = str(self.run_dir / "dupguard-state.json")
        else:
            env["DUPGUARD_DATABASE_URL"] = self.db_url
        if self.spec.poll_interval:  # the catch rate at another poll (the idle CPU's lever)
            env["DUPGUARD_POLL_INTERVAL"] = self.spec.poll_interval
        if self.spec.stranded_poll_interval:  # a stranded set lasts about one burst gap: look within it
            env["DUPGUARD_STRANDED_POLL_INTERVAL"] = f"{self.spec.stranded_poll_interval}s"
        return env | {
            "DUPGUARD_LOG_FORMAT": "json",
            "DUPGUARD_REMEDIATION": self.spec.mode,
            "DUPGUARD_REMEDIATION_BACKEND": self.spec.backend,
            "DUPGUARD_AIRFLOW_API_URL": f"http://127.0.0.1:{self.api_port}",
            "DUPGUARD_AIRFLOW_USERNAME": "dupguard",
            "DUPGUARD_AIRFLOW_PASSWORD_FILE": str(password_file),
            "DUPGUARD_AIRFLOW_UI_URL": f"http://127.0.0.1:{self.api_port}",
            "DUPGUARD_HTTP_PORT": str(self.dupguard_http_port),
            "DUPGUARD_CLUSTER_NAME": f"e2e-{self.spec.name}",
            "DUPGUARD_SUMMARY_INTERVAL": "30s",
        }

    def _start_dupguard(self, name: str = "dupguard", *, wait: bool = True) -> None:
        """One replica (``dupguard run``, as in a scheduler pod). The first start of the first replica
        runs ``dupguard init-db``; a restart keeps the replica's HTTP port and writes a new log
        (``<name>.restart<n>.log``). ``wait``: until it logs ``watching`` (the leader) or
        ``standing_by``/``not_leader`` is not waited for: only the first replica is awaited."""
        env = self.dupguard_env(self.replica_ports.get(name, 0))
        self.replica_ports[name] = self.dupguard_http_port
        if not self.dupguard_logs and self.spec.source == "database":
            init = subprocess.run(
                [DUPGUARD, "init-db"], env=env, capture_output=True, text=True, timeout=120, cwd=self.run_dir
            )
            (self.run_dir / "dupguard-init-db.log").write_text(init.stdout + init.stderr)
            if init.returncode != 0:
                raise self.fail(f"dupguard init-db exited with {init.returncode}: {init.stderr.strip()[-2000:]}")
        n = self._restarts.get(name, -1) + 1
        self._restarts[name] = n
        log_name = name if n == 0 else f"{name}.restart{n}"
        # --source on the command line, not in the environment: a dupguard without the api source
        # must refuse the cell (exit 2), not run the database source under its name.
        source = ["--source", self.spec.source] if self.spec.source != "database" else []
        proc = self._spawn(name, [DUPGUARD, "run", *source], env=env, log_name=log_name)
        self.dupguard_logs.append(proc.log)
        if not wait:
            return
        first = len(self.dupguard_logs) == 1
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            self.check_alive()
            if first and any(e.get("event") == "watching" for e in read_json_log(proc.log)):
                return
            if not first and _http_status(f"http://127.0.0.1:{self.replica_ports[name]}/readyz") == 200:
                return  # standing by behind the live leader
            time.sleep(0.5)
        what = "log 'watching'" if first else "answer /readyz 200"
        raise self.fail(f"{name} did not {what} within 120 s", proc)


def _post_json(url: str, body: dict[str, Any], *, token: str = "") -> dict[str, Any]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (http://127.0.0.1 only)
            result: dict[str, Any] = json.loads(response.read())
            return result
    except urllib.error.HTTPError as exc:
        raise HarnessError(f"POST {url} -> {exc.code}: {exc.read()[:500]!r}") from None


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 (http://127.0.0.1 only)
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def read_json_log(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a log file (other lines, e.g. a traceback, are skipped)."""
    out: list[dict[str, Any]] = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def run(spec: RunSpec, run_dir: Path, *, keep_db: bool = False) -> dict[str, Any]:
    """Start a cluster, run the workload, stop it, and return the report (see ``tests.e2e.truth``)."""
    from tests.e2e.truth import analyse

    started = time.monotonic()
    cluster = Cluster(spec, run_dir, keep_db=True)
    try:
        cluster.start()
        cluster.run_workload()
        for name, proc in cluster.procs.items():
            if name not in ("api-server", "redis"):
                kill_session(proc.popen)
        report = analyse(cluster.db_url, cluster.dupguard_logs, spec, faults=cluster.faults)
        if spec.triggerers > 1:  # the rest of the HA family, while the database is still there
            from tests.e2e.family import family_report

            files = cluster.watch_files_written
            report["family"] = family_report(
                cluster.db_url, run_dir, cluster.triggerer_names(), cluster.dupguard_logs, files
            )
            if spec.sqs_messages:
                from tests.e2e.family_sqs import sqs_report

                report["family"]["sqs"] = sqs_report(
                    cluster.db_url, run_dir, cluster.triggerer_names(), cluster.dupguard_logs, cluster.sqs_sent
                )
    except BaseException:
        print(f"e2e run {spec.name} failed; logs in {run_dir}", file=sys.stderr)
        cluster.keep_db = keep_db
        cluster.stop(strict=False)
        raise
    cluster.keep_db = keep_db
    cluster.stop()
    report["drained"] = cluster.drained
    if not cluster.drained:
        report["drain_stuck"] = cluster.drain_stuck
    report["seed"] = cluster.seed
    report["faults"] = cluster.faults
    if spec.watcher:
        report["watch_files_written"] = cluster.watch_files_written
    if spec.partitioned:
        report["partitions_triggered"] = cluster.partitions_triggered
    report["timings_s"] = cluster.timings.marks | {"total": round(time.monotonic() - started, 1)}
    report["run_dir"] = str(run_dir)
    (run_dir / "report.json").write_text(json.dumps(report, indent=2, default=str))
    return report


__all__ = ["ROOT", "Cluster", "HarnessError", "RunSpec", "read_json_log", "run"]
