"""Idle cost of an HA pair: a leader and a standby `dupguard run` (poll 10 ms) on one database.

Per replica process: user+system CPU from /proc. On the database side: the CPU of the live backends
(children of the postmaster, from /proc) and of the backends that exited meanwhile (the postmaster's
``cutime + cstime``: a standby that opened a new connection for every lock attempt started and ended a
backend each second). Uses a PostgreSQL cluster of its own (port 55471, fsync off), so no other client's
backends are counted. ``--variants name=checkout,...`` runs the daemons from several checkouts,
interleaved.

    .venv/bin/python -m benchmarks.standby_cost [--repeats 3] [--seconds 20] [--variants before=<dir>,after=.]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.detection_latency import CLK, cpu_seconds, daemon_env, fresh_db
from benchmarks.provenance import provenance

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PORT = 55471


def reaped_children_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / CLK


def live_children_cpu(pid: int) -> float:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    total = 0.0
    for child in out:
        try:
            total += cpu_seconds(int(child))
        except FileNotFoundError:
            continue
    return total


def measure(url: str, postmaster: int, code: Path, seconds: float, workdir: Path, tag: str) -> dict[str, Any]:
    db = fresh_db(url, "standby_cost")
    subprocess.run([sys.executable, "-m", "detector", "init-db", "--database-url", db], check=True, capture_output=True)
    env = daemon_env(db, "10ms") | {"PYTHONPATH": str(code)}
    procs = []
    for name in ("leader", "standby"):
        with (workdir / f"{tag}-{name}.log").open("wb") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "detector", "run"], env=env, cwd=code, stdout=out,
                                          stderr=subprocess.STDOUT))  # fmt: skip
        time.sleep(3)
    time.sleep(2)
    try:
        start = [cpu_seconds(p.pid) for p in procs] + [reaped_children_cpu(postmaster), live_children_cpu(postmaster)]
        load0, t0 = os.getloadavg()[0], time.monotonic()
        time.sleep(seconds)
        end = [cpu_seconds(p.pid) for p in procs] + [reaped_children_cpu(postmaster), live_children_cpu(postmaster)]
        elapsed = time.monotonic() - t0
    finally:
        for p in procs:
            p.terminate()
            p.wait(15)
    pct = [round(100 * (b - a) / elapsed, 2) for a, b in zip(start, end, strict=True)]
    return {"leader_cpu_pct": pct[0], "standby_cpu_pct": pct[1], "exited_backends_cpu_pct": pct[2],
            "live_backends_cpu_pct": pct[3], "load_before": round(load0, 2),
            "load_after": round(os.getloadavg()[0], 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--variants", default=f"this={ROOT}")
    parser.add_argument("--tag", default=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    args = parser.parse_args()
    variants = {k: Path(v).resolve() for k, _, v in (item.partition("=") for item in args.variants.split(","))}
    workdir = Path(tempfile.mkdtemp(prefix="dupguard-standby-"))
    workdir.chmod(0o711)
    data = workdir / "pg"
    env = os.environ | {"DUPGUARD_TEST_PG_PORT": str(PORT), "DUPGUARD_TEST_PG_DATA": str(data)}
    url = subprocess.run([str(ROOT / "scripts/postgres.sh"), "start"], env=env, check=True, capture_output=True,
                         text=True).stdout.strip()  # fmt: skip
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    runs: list[dict[str, Any]] = []
    try:
        for n in range(args.repeats):
            for name, code in variants.items():
                runs.append({"variant": name, "run": n, **measure(url, postmaster, code, args.seconds, workdir, name)})
                print(json.dumps(runs[-1]), flush=True)
    finally:
        subprocess.run([str(ROOT / "scripts/postgres.sh"), "stop"], env=env, check=False, capture_output=True)
    keys = ["leader_cpu_pct", "standby_cpu_pct", "exited_backends_cpu_pct", "live_backends_cpu_pct", "load_before"]
    summary = {
        name: {k: statistics.median(r[k] for r in runs if r["variant"] == name) for k in keys} for name in variants
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"standby_cost-{args.tag}.json"
    meta = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "args": vars(args)}
    meta["provenance"] = provenance()
    out.write_text(json.dumps({"meta": meta, "runs": runs, "summary": summary}, indent=1) + "\n")
    print("| variant | " + " | ".join(keys) + " |")
    for name, row in summary.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:g}" for k in keys) + " |")
    print(f"raw: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
