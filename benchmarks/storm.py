"""A storm: many duplicate groups committed in one transaction, on real PostgreSQL (the Airflow 3.1.2
schema), against real daemons (``tests.daemon_harness``: the real source, ledger, leader lock and ``db``
remediation in ``fail`` mode; a recording alerter).

    .venv/bin/python -m benchmarks.storm --groups 1000 [--replicas 2] [--name storm-1000]

Measured from the storm's COMMIT (``written_s``: how long the transaction took before it, not counted):
when the last group was detected (its DETECTED event), when every
duplicate was stopped (its row ``failed`` in ``dag_run``) or had a final result saying why not, the
results reported "not attempted", the samples in which the leader's lease had lapsed, and the
process's peak RSS (the daemons, the writer and this script: one process). With ``--replicas 2`` the
leader is stopped once every group was detected and a tenth of the duplicates were stopped: the
standby takes over, picks up the pending stops and finishes the storm.

Writes benchmarks/results/<name>.json with its provenance (commit, clean tree, command, load).
"""

from __future__ import annotations

import argparse
import json
import resource
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.provenance import provenance
from tests.daemon_harness import Running, failed_runs, start_daemon
from tests.pg import Templates
from tests.writer import AirflowWriter

RESULTS = Path(__file__).resolve().parent / "results"
SETTINGS: dict[str, Any] = {
    "remediation": "fail",
    "remediation_backend": "db",
    "leader_check_interval": timedelta(seconds=1),  # production's default
}


def run(groups: int, replicas: int, limit: float, remediation: str = "fail") -> dict[str, Any]:
    templates = Templates(made={})
    url = templates.clone("3.1.2")
    writer = AirflowWriter(url)
    daemons: list[Running] = []
    lapsed = {"samples": 0, "lapsed": 0}
    done = threading.Event()
    try:
        for _ in range(replicas):
            daemons.append(start_daemon(url, real_remediation=True, **(SETTINGS | {"remediation": remediation})))
        deadline = time.monotonic() + 30
        while not any(d.is_leader() and d.daemon.parts.leadership.waiting() is None for d in daemons):
            if time.monotonic() > deadline:
                raise RuntimeError("no leader")
            time.sleep(0.05)
        leader = next(d for d in daemons if d.is_leader())

        def sample() -> None:  # the lease of whichever replica leads: lapsed while no one leads
            while not done.is_set():
                lapsed["samples"] += 1
                lapsed["lapsed"] += not any(d.daemon.parts.leadership.is_leader(d.daemon.clock()) for d in daemons)
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        writing = time.monotonic()
        pairs = writer.storm(groups)  # returns once its transaction committed
        # From the COMMIT: the daemons cannot see a run before it (writing 10,000 groups takes ~20 s).
        started = time.monotonic()
        committed = datetime.now(UTC)
        sampler.start()
        dups = [dup for _, dup in pairs]
        detected_at: float | None = None
        finished_at: float | None = None
        failover_at: float | None = None
        while time.monotonic() - started < limit:
            seen = {r for d in daemons for e in d.alerter.detected() for r in (x.run_id for x in e.finding.runs)}
            if detected_at is None and all(dup in seen for dup in dups):
                detected_at = time.monotonic() - started
            stopped = failed_runs(url, dups)
            reported = {run for d in daemons for run in d.alerter.results()}
            if replicas > 1 and failover_at is None and detected_at is not None and stopped >= groups // 10:
                leader.stop()  # a clean failover: the standby picks up the pending stops
                daemons.remove(leader)
                failover_at = time.monotonic() - started
            if detected_at is not None and (remediation == "off" or stopped == groups or set(dups) <= reported):
                finished_at = time.monotonic() - started
                break
            time.sleep(0.5)
        results: dict[str, int] = {}
        not_attempted = 0
        for d in daemons:
            for event in d.alerter.outcomes():
                for r in event.results:
                    results[r.result.value] = results.get(r.result.value, 0) + 1
                    not_attempted += "not attempted" in r.detail
        done.set()
        return {
            "groups": groups,
            "replicas": replicas,
            "remediation": remediation,
            "committed_at": committed.isoformat(),
            "written_s": round(started - writing, 2),  # the storm's transaction, before the clock starts
            "all_detected_s": None if detected_at is None else round(detected_at, 2),
            "all_stopped_or_reported_s": None if finished_at is None else round(finished_at, 2),
            "failover_at_s": None if failover_at is None else round(failover_at, 2),
            "stopped": failed_runs(url, dups),
            "results_reported": results,
            "not_attempted": not_attempted,
            "lease_samples": lapsed["samples"],
            "samples_without_a_live_lease": lapsed["lapsed"],
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    finally:
        done.set()
        for d in daemons:
            d.stop()
        writer.close()
        templates.drop_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--replicas", type=int, default=1, choices=(1, 2))
    parser.add_argument("--limit", type=float, default=600.0, help="seconds before giving up")
    parser.add_argument("--remediation", default="fail", choices=("fail", "off"), help="off: detection alone")
    parser.add_argument("--name", default=None)
    args = parser.parse_args(argv)
    row = run(args.groups, args.replicas, args.limit, args.remediation)
    out = {"provenance": provenance(), "settings": {k: str(v) for k, v in SETTINGS.items()}, "rows": [row]}
    name = args.name or f"storm-{args.groups}-{args.replicas}r"
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
