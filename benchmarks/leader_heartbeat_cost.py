"""What the leader's session-lock heartbeat costs, before and after it learnt to spot a pooler: before, one
``pg_is_in_recovery()`` (``leader_lock.in_recovery``); after, one statement that also reads ``pg_locks``
for the lock still granted to its backend and whether it ran there (``leader_lock.session_lock_status``).
One heartbeat per ``DUPGUARD_LEADER_CHECK_INTERVAL`` (1 s by default) on the leader.

Measured on a direct connection to a PostgreSQL server on this host holding the session lock: this
process's CPU (``time.process_time``) and the server backend's (``/proc/<pid>/stat`` utime + stime,
so the server must run on this host), per call, over ``--calls`` calls, the variants interleaved,
``--repeats`` times. The test server: ``DUPGUARD_TEST_DATABASE_URL``.

    .venv/bin/python -m benchmarks.leader_heartbeat_cost [--calls 2000] [--repeats 3]

Results: benchmarks/results/leader_heartbeat_cost-<tag>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from benchmarks.provenance import provenance
from detector.metadb import leader_lock
from detector.metadb.engine import make_engine, parse_url

KEY = 7_355_608_201  # the default DUPGUARD_LOCK_KEY
TICKS = os.sysconf("SC_CLK_TCK")


def _backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15 of the line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tag", default=datetime.now(UTC).strftime("%Y%m%d"))
    args = parser.parse_args()
    engine = make_engine(parse_url(os.environ["DUPGUARD_TEST_DATABASE_URL"]), pool_size=1)
    samples: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT")
        pid, got = leader_lock.try_advisory_lock_unshared(conn, KEY, xact=False)
        assert got, "the lock is taken elsewhere"
        variants: dict[str, Callable[[], Any]] = {
            "before": lambda: leader_lock.in_recovery(conn),
            "after": lambda: leader_lock.session_lock_status(conn, KEY, pid),
        }
        assert leader_lock.session_lock_status(conn, KEY, pid) == (False, True, True)
        for _ in range(args.repeats):
            for name, call in variants.items():
                for _ in range(200):  # warm: SQLAlchemy's statement cache, the server's catalog cache
                    call()
                client, server, wall = time.process_time(), _backend_cpu(pid), time.perf_counter()
                for _ in range(args.calls):
                    call()
                n = args.calls
                samples[name].append(
                    {
                        "client_cpu_us": round((time.process_time() - client) / n * 1e6, 1),
                        "backend_cpu_us": round((_backend_cpu(pid) - server) / n * 1e6, 1),
                        "wall_us": round((time.perf_counter() - wall) / n * 1e6, 1),
                    }
                )
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": KEY})
    engine.dispose()
    medians = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}
    result = {
        "benchmark": "leader_heartbeat_cost",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "calls": args.calls,
        "repeats": args.repeats,
        "load_average": os.getloadavg(),
        "samples": samples,
        "medians_per_call": medians,
        "provenance": provenance(),
    }
    out = Path(__file__).parent / "results" / f"leader_heartbeat_cost-{args.tag}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(medians, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
