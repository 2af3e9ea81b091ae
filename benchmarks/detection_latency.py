"""Detection latency and idle cost of `dupguard run`, measured against a real PostgreSQL.

For each poll interval: start `dupguard run` as its own process (as in a pod) on the real Airflow 3.1.2
schema; measure it idle (CPU of one core, RSS, database execution time per second from
pg_stat_statements); then commit duplicate pairs at random moments and measure commit -> detection
(the `duplicate_detected` log line's timestamp minus the wall clock right after the duplicate's
COMMIT returned: an upper bound, it includes planning and logging). It also measures the
alternative we did not ship, LISTEN/NOTIFY through a trigger on dag_run, side by side.

    .venv/bin/python -m benchmarks.detection_latency [--intervals 10ms,20ms,50ms,100ms] [--pairs 40] [--idle 20]

Uses its own PostgreSQL cluster (port 55470, fsync off) with pg_stat_statements; prints a table and
writes benchmarks/results/detection_latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg2

from tests.pg import schema_sql
from tests.writer import AirflowWriter

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PORT = 55470
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


def db_ms(url: str, db: str) -> float:
    sql = (
        "SELECT coalesce(sum(total_exec_time), 0) FROM pg_stat_statements s "
        f"JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = '{db}'"
    )
    rows = admin(url, db=db, sql=sql)
    return float(rows[0][0])


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_polling(url: str, interval: str, pairs: int, idle: float, workdir: Path) -> dict[str, Any]:
    name = "lat_" + interval.replace("ms", "")
    db_url = fresh_db(url, name)
    subprocess.run([sys.executable, "-m", "detector", "init-db", "--database-url", db_url], check=True,
                   capture_output=True)  # fmt: skip
    log = workdir / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "DUPGUARD_DATABASE_URL": db_url, "DUPGUARD_POLL_INTERVAL": interval, "DUPGUARD_LOG_FORMAT": "json",
        "DUPGUARD_HTTP_PORT": "0", "DUPGUARD_REMEDIATION": "dry-run",
    }  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "detector", "run"], env=env, stdout=out, stderr=out)
    try:
        time.sleep(3)  # start-up, leadership, first polls
        admin(url, "SELECT pg_stat_statements_reset()", db=name)
        cpu0, t0, db0 = cpu_seconds(proc.pid), time.monotonic(), db_ms(url, name)
        time.sleep(idle)
        elapsed = time.monotonic() - t0
        idle_cpu = 100 * (cpu_seconds(proc.pid) - cpu0) / elapsed
        idle_db = 100 * (db_ms(url, name) - db0) / 1000 / elapsed
        idle_rss = rss_mb(proc.pid)

        writer, rng, commits = AirflowWriter(db_url, seed=1), random.Random(2), {}
        for i in range(pairs):
            time.sleep(rng.uniform(0.2, 1.0))
            for _ in range(rng.randint(0, 3)):
                writer.ordinary(f"dag_{rng.randint(1, 40)}")
            _first, dup = writer.duplicate_pair(f"consumer_{i}", gap=__import__("datetime").timedelta(milliseconds=0))
            commits[dup.run_id] = dup.committed_at.timestamp()
        time.sleep(2)
        writer.close()
        peak_rss = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(15)
    latencies = []
    for line in log.read_text().splitlines():
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        if event.get("event") == "duplicate_detected":
            for run_id in event["duplicate_runs"]:
                if run_id in commits:
                    ts = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                    latencies.append(1000 * (ts - commits[run_id]))
    return {
        "mechanism": f"poll every {interval}",
        "pairs": pairs,
        "detected": len(latencies),
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(pct(latencies, 0.99), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "idle_cpu_pct_of_core": round(idle_cpu, 2),
        "idle_db_pct_of_core": round(idle_db, 3),
        "rss_mb_idle": round(idle_rss, 1),
        "rss_mb_after_load": round(peak_rss, 1),
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
        _first, dup = writer.duplicate_pair(f"consumer_{i}", gap=__import__("datetime").timedelta(0))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", default="10ms,20ms,50ms,100ms")
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle measurement")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="dupguard-bench-"))
    workdir.chmod(0o711)
    data = workdir / "pg"
    url = start_cluster(data)
    try:
        rows = [measure_polling(url, i, args.pairs, args.idle, workdir) for i in args.intervals.split(",")]
        rows.append(measure_listen_notify(url, args.pairs))
    finally:
        stop_cluster(data)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "detection_latency.json").write_text(json.dumps(rows, indent=2) + "\n")
    header = ["mechanism", "detected", "p50_ms", "p99_ms", "max_ms", "idle_cpu_pct_of_core", "idle_db_pct_of_core",
              "rss_mb_idle", "rss_mb_after_load"]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for r in rows:
        print(
            "| " + " | ".join(str(r[h]) if h != "detected" else f"{r['detected']}/{r['pairs']}" for h in header) + " |"
        )


if __name__ == "__main__":
    main()
