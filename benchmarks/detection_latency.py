"""Detection latency, idle cost and the start-up/failover window of `dupguard run`, on a real PostgreSQL.

``poll`` mode, for each poll interval: start `dupguard run` as its own process (as in a pod) on the real
Airflow 3.1.2 schema; measure it idle (CPU of one core from /proc, RSS, the CPU of its PostgreSQL
backends from /proc, and their execution time from pg_stat_statements); then commit duplicate pairs at
random moments and measure commit -> detection (the `duplicate_detected` log line's timestamp minus the
wall clock right after the duplicate's COMMIT returned: an upper bound, it includes planning and
logging). With ``--lead`` each pair is committed as Airflow commits it: the asset event with its
``asset_dag_run_queue`` row first, then after a lead time the two runs (deleting the row): ``0`` (the
worst case for the poll at rest: the rest interval bounds the latency), ``uniform:A:B`` (seconds), or
``file:PATH`` (leads sampled from measured ones: a JSON list of milliseconds, or an e2e results file's
``samples_ms.queue_lead``: an event's first consumer run after the event, real schedulers). Without
it, pairs are bare runs (no queue row), as before. ``--spacing`` seconds between pairs (default 0.2-1.0
s at random; the poll at rest needs more than its hold, ``poll_hold``, for every pair to start at rest).
An interval ``default`` leaves DUPGUARD_POLL_INTERVAL unset: each variant polls at its own default, or
at the one its ``--variants`` entry names (``after=.@5ms``).

``failover`` mode (at the first interval): replica A starts (process start -> its `leader_acquired`),
replica B starts and stands by; A is SIGKILLed, a duplicate pair is committed at once (nobody leads),
and B's `leader_acquired` and first judgement (`duplicate_detected` of that pair) are timed from the kill.

``notify`` mode: the alternative we did not ship, LISTEN/NOTIFY through a trigger on dag_run.

Each configuration is repeated ``--repeats`` times (default 5); the summary gives the median and the
spread (min to max) of every figure, with the machine's 1-minute load average before and during the runs
(sampled every second). Every run's raw figures (latencies included) go to
benchmarks/results/detection_latency-<tag>.json; the summary of the latest invocation to
benchmarks/results/detection_latency.json.

    .venv/bin/python -m benchmarks.detection_latency [--intervals 10ms,50ms] [--repeats 5] [--pairs 40]
        [--idle 20] [--modes poll,failover,notify] [--variants before=/path/to/old/checkout,after=.]
        [--lead 0|uniform:A:B|file:PATH] [--spacing A:B]

``--variants`` runs the daemon from several checkouts (``git worktree add --detach <dir> <commit>``),
interleaved run by run, so that a shared machine's changing load falls on every variant alike.

Uses its own PostgreSQL cluster (port 55470, or DUPGUARD_BENCH_PG_PORT; fsync off) with pg_stat_statements.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2

from benchmarks.provenance import provenance
from tests.pg import schema_sql
from tests.writer import AirflowWriter

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PORT = int(os.environ.get("DUPGUARD_BENCH_PG_PORT", "55470"))  # another port beside a second benchmark
CLK = os.sysconf("SC_CLK_TCK")


def start_cluster(data: Path) -> str:
    env = os.environ | {"DUPGUARD_TEST_PG_PORT": str(PORT), "DUPGUARD_TEST_PG_DATA": str(data)}
    url = subprocess.run([str(ROOT / "scripts/postgres.sh"), "start"], env=env, check=True, capture_output=True,
                         text=True).stdout.strip()  # fmt: skip
    conf = data / "postgresql.conf"
    if "pg_stat_statements" not in conf.read_text():
        with conf.open("a") as f:
            f.write("shared_preload_libraries = 'pg_stat_statements'\npg_stat_statements.track = all\n")
        subprocess.run([str(ROOT / "scripts/postgres.sh"), "restart"], env=env, check=True)
    return url


def stop_cluster(data: Path) -> None:
    env = os.environ | {"DUPGUARD_TEST_PG_PORT": str(PORT), "DUPGUARD_TEST_PG_DATA": str(data)}
    subprocess.run([str(ROOT / "scripts/postgres.sh"), "stop"], env=env, check=False)


def admin(url: str, sql: str, db: str = "postgres") -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(url.rsplit("/", 1)[0] + "/" + db)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(sql)
        rows = cur.fetchall() if cur.description else []
    conn.close()
    return rows


def fresh_db(url: str, name: str) -> str:
    admin(url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin(url, f"CREATE DATABASE {name}")
    admin(url, schema_sql("3.1.2"), db=name)
    admin(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements", db=name)
    return url.rsplit("/", 1)[0] + "/" + name


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def db_ms(url: str, db: str) -> tuple[float, int]:
    """Execution time (ms) and number of the statements run in ``db`` (pg_stat_statements)."""
    sql = (
        "SELECT coalesce(sum(total_exec_time), 0), coalesce(sum(calls), 0) FROM pg_stat_statements s "
        f"JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{db}'"
    )
    rows = admin(url, db=db, sql=sql)
    return float(rows[0][0]), int(rows[0][1])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class LoadSampler:
    """The machine's 1-minute load average, sampled once a second while a run lasts."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float | None]:
        if not self.samples:
            return {"load_during_mean": None, "load_during_max": None}
        return {
            "load_during_mean": round(statistics.fmean(self.samples), 2),
            "load_during_max": round(max(self.samples), 2),
        }


def backend_cpu_seconds(url: str, db: str) -> float:
    """CPU of the PostgreSQL backends serving dupguard (same machine: read from /proc)."""
    rows = admin(
        url, db=db, sql=f"SELECT pid FROM pg_stat_activity WHERE datname = '{db}' AND application_name = 'dupguard'"
    )
    total = 0.0
    for (pid,) in rows:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += cpu_seconds(int(pid))
    return total


CODE = {"this": ROOT}  # variant name -> checkout whose detector/ the daemon runs (--variants)
POLL: dict[str, str] = {}  # variant -> its own interval (``name=path@5ms``) where --intervals says default


def daemon_env(db_url: str, interval: str, variant: str = "this") -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "PYTHONPATH": str(CODE[variant]),
        "DUPGUARD_DATABASE_URL": db_url, "DUPGUARD_LOG_FORMAT": "json",
        "DUPGUARD_HTTP_PORT": "0", "DUPGUARD_REMEDIATION": "dry-run",
    } | _interval_env(POLL.get(variant, "default") if interval == "default" else interval)  # fmt: skip


def _interval_env(interval: str) -> dict[str, str]:
    return {} if interval == "default" else {"DUPGUARD_POLL_INTERVAL": interval}


class Leads:
    """Lead times (seconds) from an asset event's queue row to its runs (``--lead``); None: bare pairs."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.samples: list[float] | None = None
        self.bounds: tuple[float, float] | None = None
        if spec.startswith("file:"):
            data = json.loads(Path(spec[5:]).read_text())
            if isinstance(data, dict):  # an e2e results file: every run's queue leads
                data = [x for r in data["runs"] for x in r.get("samples_ms", {}).get("queue_lead", [])]
            self.samples = [x / 1000 for x in data if x >= 0]
            assert self.samples, f"no leads in {spec}"
        elif spec.startswith("uniform:"):
            low, high = spec.split(":")[1:]
            self.bounds = (float(low), float(high))
        elif spec not in ("", "0"):
            raise SystemExit(f"--lead {spec!r}: 0, uniform:A:B or file:PATH")

    @property
    def queued(self) -> bool:
        return self.spec != ""

    def draw(self, rng: random.Random) -> float:
        if self.samples is not None:
            return rng.choice(self.samples)
        if self.bounds is not None:
            return rng.uniform(*self.bounds)
        return 0.0


LEADS = Leads("")
SPACING = (0.2, 1.0)


def wait_watching(proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    """Until the daemon logs ``watching``: on a loaded host its start-up can take several seconds, and
    pairs written before it watches are judged by the start-up look-back, not timed as detections."""
    deadline = time.monotonic() + timeout
    while not any(e.get("event") == "watching" for e in log_events(log)):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError(f"dupguard did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.2)
    time.sleep(0.5)  # its first polls


def log_events(log: Path) -> list[dict[str, Any]]:
    events = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            event["_ts"] = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
            events.append(event)
    return events


def measure_polling(
    url: str, interval: str, pairs: int, idle: float, workdir: Path, run: int, variant: str = "this"
) -> dict[str, Any]:
    name = "lat_" + interval.replace("ms", "").replace("s", "s_")
    db_url = fresh_db(url, name)
    subprocess.run([sys.executable, "-m", "detector", "init-db", "--database-url", db_url], check=True,
                   capture_output=True)  # fmt: skip
    log = workdir / f"{name}-{run}-{variant}.log"
    load_before = os.getloadavg()[0]
    with log.open("wb") as out, LoadSampler() as load:
        proc = subprocess.Popen([sys.executable, "-m", "detector", "run"], env=daemon_env(db_url, interval, variant),
                                stdout=out, stderr=out, cwd=CODE[variant])  # fmt: skip
        try:
            wait_watching(proc, log)
            admin(url, "SELECT pg_stat_statements_reset()", db=name)
            cpu0, t0, db0 = cpu_seconds(proc.pid), time.monotonic(), db_ms(url, name)
            be0 = backend_cpu_seconds(url, name)
            time.sleep(idle)
            elapsed = time.monotonic() - t0
            idle_cpu_s = cpu_seconds(proc.pid) - cpu0
            db1 = db_ms(url, name)
            idle_db = 100 * (db1[0] - db0[0]) / 1000 / elapsed
            # A 10 ms loop polls less often on a loaded machine (each pass waits for a CPU too), so the
            # CPU per statement is the figure that compares runs at different loads.
            statements = db1[1] - db0[1]
            idle_backend = 100 * (backend_cpu_seconds(url, name) - be0) / elapsed
            idle_cpu = 100 * idle_cpu_s / elapsed
            idle_rss = rss_mb(proc.pid)
            load_idle = statistics.fmean(load.samples) if load.samples else None

            writer, rng, commits = AirflowWriter(db_url, seed=1 + run), random.Random(2 + run), {}
            leads: list[float] = []
            for i in range(pairs):
                for _ in range(rng.randint(0, 3)):
                    writer.ordinary(f"dag_{rng.randint(1, 40)}")
                time.sleep(rng.uniform(*SPACING))
                if LEADS.queued:
                    leads.append(LEADS.draw(rng))
                    _first, dup = writer.queued_pair(f"consumer_{i}", leads[-1])
                else:
                    _first, dup = writer.duplicate_pair(f"consumer_{i}", gap=timedelta(milliseconds=0))
                commits[dup.run_id] = dup.committed_at.timestamp()
            time.sleep(2)
            writer.close()
            peak_rss = rss_mb(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
                stopped = True
            except subprocess.TimeoutExpired:  # recorded as a result of its own, not a crash of the benchmark
                proc.kill()
                proc.wait()
                stopped = False
    latencies = [
        1000 * (e["_ts"] - commits[r])
        for e in log_events(log)
        if e.get("event") == "duplicate_detected"
        for r in e["duplicate_runs"]
        if r in commits
    ]
    return {
        "mode": "poll",
        "variant": variant,
        "interval": POLL.get(variant, interval) if interval == "default" else interval,
        "run": run,
        "pairs": pairs,
        "idle_seconds": idle,
        "lead": LEADS.spec or None,
        "spacing_s": list(SPACING),
        "leads_s": [round(x, 3) for x in leads],
        "detected": len(latencies),
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(pct(latencies, 0.99), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "stopped_within_15s_of_sigterm": stopped,
        "idle_cpu_pct_of_core": round(idle_cpu, 2),
        "idle_db_exec_pct_of_core": round(idle_db, 3),
        "idle_statements_per_s": round(statements / elapsed, 1),
        "idle_cpu_us_per_statement": round(1e6 * idle_cpu_s / statements, 1) if statements else None,
        "idle_db_backend_cpu_pct_of_core": round(idle_backend, 2),
        "rss_mb_idle": round(idle_rss, 1),
        "rss_mb_after_load": round(peak_rss, 1),
        "load_before": round(load_before, 2),
        "load_during_idle_mean": round(load_idle, 2) if load_idle is not None else None,
        **load.summary(),
        "latencies_ms": [round(x, 2) for x in latencies],
    }


def spawn(db_url: str, interval: str, out: Any, variant: str = "this") -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "detector", "run"], env=daemon_env(db_url, interval, variant),
                            stdout=out, stderr=out, cwd=CODE[variant])  # fmt: skip


def wait_event(log: Path, pred: Any, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in log_events(log):
            if pred(e):
                return e
        time.sleep(0.05)
    return None


def measure_failover(url: str, workdir: Path, run: int, interval: str, variant: str = "this") -> dict[str, Any]:
    """Two `dupguard run` replicas on one database. Start-up: process start -> `leader_acquired`.
    Failover: SIGKILL the leader, commit a duplicate pair at once (nobody leads), then -> the other
    replica's `leader_acquired` and its `duplicate_detected` for that pair (its first judgement)."""
    name = "failover"
    db_url = fresh_db(url, name)
    subprocess.run([sys.executable, "-m", "detector", "init-db", "--database-url", db_url], check=True,
                   capture_output=True)  # fmt: skip
    logs = [workdir / f"failover-{run}-{variant}-a.log", workdir / f"failover-{run}-{variant}-b.log"]
    procs: list[subprocess.Popen[bytes]] = []
    load_before = os.getloadavg()[0]
    with LoadSampler() as load:
        try:
            started = time.time()
            with logs[0].open("wb") as out:
                procs.append(spawn(db_url, interval, out, variant))
            first = wait_event(logs[0], lambda e: e.get("event") == "leader_acquired", 30)
            assert first is not None, "replica A never led"
            with logs[1].open("wb") as out:
                procs.append(spawn(db_url, interval, out, variant))
            time.sleep(4)  # B is up and standing by
            assert wait_event(logs[1], lambda e: e.get("event") == "leader_acquired", 0.1) is None, "two leaders"
            procs[0].kill()
            killed = time.time()
            procs[0].wait(5)
            writer = AirflowWriter(db_url, seed=run)
            _first, dup = writer.duplicate_pair("consumer_failover", gap=timedelta(0))
            committed = dup.committed_at.timestamp()
            writer.close()
            acquired = wait_event(logs[1], lambda e: e.get("event") == "leader_acquired", 30)
            judged = wait_event(
                logs[1],
                lambda e: e.get("event") == "duplicate_detected" and dup.run_id in e.get("duplicate_runs", []),
                30,
            )
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait(15)
    return {
        "mode": "failover",
        "variant": variant,
        "interval": interval,
        "run": run,
        "start_to_leader_ms": round(1000 * (first["_ts"] - started), 1),
        "kill_to_commit_ms": round(1000 * (committed - killed), 1),
        "kill_to_leader_ms": round(1000 * (acquired["_ts"] - killed), 1) if acquired else None,
        "kill_to_first_judgement_ms": round(1000 * (judged["_ts"] - killed), 1) if judged else None,
        "commit_to_judgement_ms": round(1000 * (judged["_ts"] - committed), 1) if judged else None,
        "load_before": round(load_before, 2),
        **load.summary(),
    }


def measure_listen_notify(url: str, pairs: int) -> dict[str, Any]:
    """The alternative: a trigger on dag_run NOTIFYs a listener on a direct connection. Not shipped: it
    installs code into Airflow's schema on the scheduler's insert path; measured here for comparison."""
    db_url = fresh_db(url, "lat_notify")
    admin(url, "CREATE FUNCTION bench_notify() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
               "PERFORM pg_notify('dupguard_bench', NEW.id::text); RETURN NEW; END $$; "
               "CREATE TRIGGER bench_notify AFTER INSERT ON dag_run FOR EACH ROW EXECUTE FUNCTION bench_notify()",
          db="lat_notify")  # fmt: skip
    listener = psycopg2.connect(db_url)
    listener.autocommit = True
    listener.cursor().execute("LISTEN dupguard_bench")
    writer, rng, latencies = AirflowWriter(db_url, seed=1), random.Random(2), []
    for i in range(pairs):
        time.sleep(rng.uniform(0.05, 0.2))
        _first, dup = writer.duplicate_pair(f"consumer_{i}", gap=timedelta(0))
        while True:
            if select.select([listener], [], [], 5) == ([], [], []):
                break
            listener.poll()
            ids = {int(n.payload) for n in listener.notifies}
            listener.notifies.clear()
            if dup.id in ids:
                latencies.append(1000 * (time.time() - dup.committed_at.timestamp()))
                break
    writer.close()
    listener.close()
    return {
        "mechanism": "LISTEN/NOTIFY (trigger; notify receipt only, no judging)",
        "pairs": pairs,
        "detected": len(latencies),
        "p50_ms": round(statistics.median(latencies), 2),
        "p99_ms": round(pct(latencies, 0.99), 2),
        "max_ms": round(max(latencies), 2),
        "idle_cpu_pct_of_core": 0.0,
        "idle_db_pct_of_core": 0.0,
        "rss_mb_idle": None,
        "rss_mb_after_load": None,
    }


SUMMARY_KEYS = {
    "poll": ["p50_ms", "p99_ms", "max_ms", "idle_cpu_pct_of_core", "idle_statements_per_s", "idle_cpu_us_per_statement",
             "idle_db_exec_pct_of_core",
             "idle_db_backend_cpu_pct_of_core", "rss_mb_idle", "rss_mb_after_load", "load_before",
             "load_during_mean"],
    "failover": ["start_to_leader_ms", "kill_to_leader_ms", "kill_to_first_judgement_ms", "commit_to_judgement_ms",
                 "load_before", "load_during_mean"],
}  # fmt: skip


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread (min, max) of every figure over the repeats of one configuration."""
    out: dict[str, Any] = {
        "mode": runs[0]["mode"],
        "variant": runs[0].get("variant", "this"),
        "interval": runs[0]["interval"],
        "repeats": len(runs),
    }
    if runs[0]["mode"] == "poll":
        out["detected"] = f"{sum(r['detected'] for r in runs)}/{sum(r['pairs'] for r in runs)}"
        # With a few dozen pairs a run's p99 is its maximum: the pooled tail over all repeats is steadier.
        pooled = [x for r in runs for x in r["latencies_ms"]]
        if pooled:
            out["pooled_p50_ms"] = round(statistics.median(pooled), 1)
            out["pooled_p99_ms"] = round(pct(pooled, 0.99), 1)
    for key in SUMMARY_KEYS[runs[0]["mode"]]:
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = {"median": round(statistics.median(values), 2), "min": min(values), "max": max(values)}
    return out


def fmt(cell: Any) -> str:
    if isinstance(cell, dict):
        return f"{cell['median']:g} ({cell['min']:g} to {cell['max']:g})"
    return str(cell)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", default="10ms,50ms")
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle measurement")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each configuration (median and spread)")
    parser.add_argument("--modes", default="poll,failover", help="poll, failover, notify (comma-separated)")
    parser.add_argument("--variants", default="", help="A/B: name=checkout,... run interleaved (default: this one)")
    parser.add_argument("--tag", default=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), help="name of the raw file")
    parser.add_argument("--lead", default="", help="pairs after their queue row: 0, uniform:A:B, file:PATH")
    parser.add_argument("--spacing", default="0.2:1.0", help="seconds between pairs, A:B (uniform)")
    args = parser.parse_args()
    global LEADS, SPACING
    LEADS = Leads(args.lead)
    low, _, high = args.spacing.partition(":")
    SPACING = (float(low), float(high or low))
    for item in filter(None, args.variants.split(",")):
        name, _, path = item.partition("=")
        path, _, own = path.partition("@")
        CODE[name] = Path(path).resolve()
        if own:
            POLL[name] = own
    if args.variants:
        del CODE["this"]
    modes = set(args.modes.split(","))
    workdir = Path(tempfile.mkdtemp(prefix="dupguard-bench-"))
    workdir.chmod(0o711)
    data = workdir / "pg"
    url = start_cluster(data)
    runs: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw_path = RESULTS / f"detection_latency-{args.tag}.json"
    meta = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "args": vars(args)}
    meta["provenance"] = provenance()
    try:
        for interval in args.intervals.split(","):
            for mode in ("poll", "failover"):
                if mode not in modes or (mode == "failover" and interval != args.intervals.split(",")[0]):
                    continue  # failover: at the first (default) interval only
                batches: dict[str, list[dict[str, Any]]] = {v: [] for v in CODE}
                for n in range(args.repeats):
                    for variant, batch in batches.items():  # interleaved: the machine's load hits every variant alike
                        batch.append(
                            measure_polling(url, interval, args.pairs, args.idle, workdir, n, variant)
                            if mode == "poll"
                            else measure_failover(url, workdir, n, interval, variant)
                        )
                        print(json.dumps({k: v for k, v in batch[-1].items() if k != "latencies_ms"}), flush=True)
                        runs.append(batch[-1])
                        raw_path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
                summaries.extend(summarise(batch) for batch in batches.values())
        if "notify" in modes:
            runs.append(measure_listen_notify(url, args.pairs))
    finally:
        stop_cluster(data)
    raw_path.write_text(json.dumps({"meta": meta, "runs": runs, "summary": summaries}, indent=1) + "\n")
    (RESULTS / "detection_latency.json").write_text(json.dumps({"meta": meta, "summary": summaries}, indent=2) + "\n")
    for mode in ("poll", "failover"):
        rows = [s for s in summaries if s["mode"] == mode]
        if not rows:
            continue
        extra = ["detected", "pooled_p50_ms", "pooled_p99_ms"] if mode == "poll" else []
        header = ["variant", "interval", "repeats", *extra, *SUMMARY_KEYS[mode]]
        print(f"\n{mode}: median (min to max) over repeats")
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for r in rows:
            print("| " + " | ".join(fmt(r.get(h, "—")) for h in header) + " |")
    print(f"\nraw: {raw_path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
