"""Cost of ``dupguard scan`` against 100k, 1M and 10M run histories, next to the naive query.

Per size, each timed ``--repeat`` times (median reported):

- the real CLI, ``dupguard scan --database-url URL --since 1d --format json`` (a new process each
  time: interpreter start-up and imports included; ``dupguard --help`` is timed too, to show that
  share);
- the ``detector.app.scan.scan()`` function for the last day, in process;
- the naive query a user would write: GROUP BY (dag_id, run_after) over *all* asset-triggered
  runs joined to their consumed events, HAVING more than one run;
- the full-history CLI scan (no ``--since``), for information (``--repeat-full`` times).

It is also a sanity check: the groups found must be exactly the pairs planted by
benchmarks/history.py (``bench.planted``): those of the last day for ``--since 1d``, all of them
for the full scan and the naive query. EXPLAIN (ANALYZE, BUFFERS) plans of every statement the
scan sends, and of the naive query, go to benchmarks/results/plans/scan/<size>/.

    .venv/bin/python benchmarks/scan_cost.py --sizes 100k,1m,10m [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import history
from poll_cost import Capture, explain
from sqlalchemy import event

from detector.app.scan import scan
from detector.metadb.engine import connect, make_engine, open_airflow_db, parse_url

PLANS = history.RESULTS / "plans" / "scan"
DUPGUARD = str(history.ROOT / ".venv" / "bin" / "dupguard")
TARGET_S = 2.0
NAIVE = """
SELECT dr.dag_id, dr.run_after, count(DISTINCT dr.id) AS runs
FROM dag_run dr JOIN dagrun_asset_event e ON e.dag_run_id = dr.id
WHERE dr.run_type = 'asset_triggered'
GROUP BY 1, 2
HAVING count(DISTINCT dr.id) > 1
""".strip()


def planted(size: str, since: datetime | None) -> set[tuple[int, int]]:
    """(kept id, duplicate id) of the pairs planted with run_after >= since."""
    conn = history.connect(history.db_name(size))
    with conn.cursor() as cur:
        cur.execute(
            "SELECT kept_id, duplicate_id FROM bench.planted WHERE %s::timestamptz IS NULL OR run_after >= %s",
            (since, since),
        )
        found = {(int(a), int(b)) for a, b in cur.fetchall()}
    conn.close()
    return found


def pairs_from_json(size: str, doc: dict[str, Any]) -> set[tuple[int, int]]:
    """(kept id, duplicate id) of each group the CLI reported (run ids mapped to dag_run.id)."""
    conn = history.connect(history.db_name(size))
    out = set()
    with conn.cursor() as cur:
        for g in doc["groups"]:
            ids = []
            for run_id in [g["kept_run_id"], *g["duplicate_run_ids"]]:
                cur.execute("SELECT id FROM dag_run WHERE dag_id = %s AND run_id = %s", (g["dag_id"], run_id))
                ids.append(int(cur.fetchone()[0]))
            out.update((ids[0], d) for d in ids[1:])
    conn.close()
    return out


def run_cli(args: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([DUPGUARD, *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"dupguard {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return elapsed, cpu, proc.stdout


def check(label: str, got: set[tuple[int, int]], want: set[tuple[int, int]]) -> dict[str, Any]:
    ok = got == want
    print(f"    {label}: found {len(got)} pairs, planted {len(want)}: {'OK' if ok else 'MISMATCH'}")
    if not ok:
        print(f"      missing {sorted(want - got)[:10]} extra {sorted(got - want)[:10]}")
    return {"found": len(got), "planted": len(want), "exact": ok}


def cli_scan(size: str, url: str, since: list[str], repeat: int) -> dict[str, Any]:
    times = []
    cpus = []
    checks = []
    for _ in range(repeat):
        before = datetime.now(UTC)
        elapsed, cpu, out = run_cli(["scan", "--database-url", url, *since, "--format", "json"])
        times.append(elapsed)
        cpus.append(cpu)
        got = pairs_from_json(size, json.loads(out))
        # the window moves while the process runs: accept what was planted at either edge
        want_early = planted(size, before - timedelta(days=1) if since else None)
        want_late = planted(size, datetime.now(UTC) - timedelta(days=1) if since else None)
        checks.append(check("cli " + (" ".join(since) or "full"), got, want_early if got == want_early else want_late))
    return {
        "seconds": times,
        "median_s": round(statistics.median(times), 3),
        "check": checks[-1],
        "cpu_median_s": round(statistics.median(cpus), 3),
        "all_exact": all(c["exact"] for c in checks),
    }


def measure(size: str, repeat: int, repeat_full: int, log: Any = print) -> dict[str, Any]:
    meta = history.ensure(size, log=log)
    url = history.db_url(size)
    folder = PLANS / size
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        old.unlink()
    result: dict[str, Any] = {"runs": meta.runs, "repeat": repeat, "load_average_at_start": os.getloadavg()}
    log(f"  [{size}] dupguard --help (start-up and imports)")
    startup = [run_cli(["--help"])[:2] for _ in range(repeat)]
    result["cli_startup"] = {
        "median_s": round(statistics.median(w for w, _ in startup), 3),
        "cpu_median_s": round(statistics.median(c for _, c in startup), 3),
    }
    log(f"  [{size}] dupguard scan --since 1d (CLI)")
    result["cli_since_1d"] = cli_scan(size, url, ["--since", "1d"], repeat)

    log(f"  [{size}] scan() since 1d, in process")
    engine = make_engine(parse_url(url))
    db = open_airflow_db(engine)
    capture = Capture()
    event.listen(engine, "before_cursor_execute", capture)
    times = []
    for _ in range(repeat):
        capture.statements.clear()
        capture.on = True
        t0 = time.perf_counter()
        report = scan(db, now=datetime.now(UTC), since=timedelta(days=1))
        times.append(time.perf_counter() - t0)
        capture.on = False
    result["function_since_1d"] = {
        "seconds": times,
        "median_s": round(statistics.median(times), 3),
        "groups": len(report.findings),
        "runs_examined": report.runs_examined,
    }
    statements = list(capture.statements)
    with connect(engine) as conn:
        plans = explain(conn, statements)
        texts = explain(conn, statements, fmt="TEXT")
    result["function_since_1d"]["db_ms_by_statement"] = [
        {"query": p["query"], "ms": round(p["planning_ms"] + p["execution_ms"], 3)} for p in plans
    ]
    for n, (p, t) in enumerate(zip(plans, texts, strict=True), start=1):
        (folder / f"since-1d-{n:02d}-{p['query']}.json").write_text(json.dumps(p, indent=2) + "\n")
        (folder / f"since-1d-{n:02d}-{p['query']}.txt").write_text(p["sql"] + "\n\n" + t["text"] + "\n")

    log(f"  [{size}] naive GROUP BY over all asset-triggered runs")
    conn = history.connect(history.db_name(size))
    times = []
    with conn.cursor() as cur:
        for _ in range(repeat):
            t0 = time.perf_counter()
            cur.execute(NAIVE)
            rows = cur.fetchall()
            times.append(time.perf_counter() - t0)
        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + NAIVE)
        (folder / "naive.txt").write_text(NAIVE + "\n\n" + "\n".join(r[0] for r in cur.fetchall()) + "\n")
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + NAIVE)
        (folder / "naive.json").write_text(json.dumps(cur.fetchone()[0][0], indent=2) + "\n")
    conn.close()
    result["naive"] = {
        "seconds": times,
        "median_s": round(statistics.median(times), 3),
        "groups": len(rows),
        "planted_all": len(planted(size, None)),
    }
    print(f"    naive: {len(rows)} groups over all history, planted {result['naive']['planted_all']}")

    log(f"  [{size}] dupguard scan, full history (CLI)")
    result["cli_full"] = cli_scan(size, url, [], repeat_full)
    capture.statements.clear()
    capture.on = True
    scan(db, now=datetime.now(UTC))
    capture.on = False
    with connect(engine) as c:
        texts = explain(c, list(capture.statements), fmt="TEXT")
    for n, t in enumerate(texts, start=1):
        (folder / f"full-{n:02d}-{t['query']}.txt").write_text(t["text"] + "\n")
    engine.dispose()
    result["load_average_at_end"] = os.getloadavg()
    r = result
    log(
        f"  [{size}] since 1d: CLI {r['cli_since_1d']['median_s']:.2f} s, scan() "
        f"{r['function_since_1d']['median_s']:.3f} s; naive {r['naive']['median_s']:.2f} s; "
        f"full CLI {r['cli_full']['median_s']:.2f} s"
    )
    return result


def render(sizes: dict[str, Any]) -> str:
    rows = []
    for size, r in sizes.items():
        cli, fn, naive, full = r["cli_since_1d"], r["function_since_1d"], r["naive"], r["cli_full"]
        rows.append(
            [
                size,
                f"{cli['median_s']:.2f} s (CPU {cli['cpu_median_s']:.2f} s)",
                f"{r['cli_startup']['median_s']:.2f} s (CPU {r['cli_startup']['cpu_median_s']:.2f} s)",
                f"{fn['median_s'] * 1000:.0f} ms",
                f"{naive['median_s']:.2f} s",
                f"{naive['median_s'] / cli['median_s']:.1f}x",
                f"{naive['median_s'] / fn['median_s']:.0f}x",
                f"{full['median_s']:.2f} s",
                f"{cli['check']['found']}/{cli['check']['planted']} {'ok' if cli['all_exact'] else 'MISMATCH'}",
                f"{full['check']['found']}/{full['check']['planted']} {'ok' if full['all_exact'] else 'MISMATCH'}",
                f"{naive['groups']}/{naive['planted_all']}",
            ]
        )
    return (
        history.markdown_table(
            [
                "history",
                "CLI scan --since 1d, wall (process CPU)",
                "CLI start-up alone (--help)",
                "scan() since 1d",
                "naive GROUP BY (all history)",
                "naive / CLI",
                "naive / scan()",
                "CLI full-history scan",
                "pairs found / planted (1d)",
                "pairs found / planted (full)",
                "naive groups / planted",
            ],
            rows,
        )
        + f"\n\nTarget: CLI `scan --since 1d` on 10M < {TARGET_S:g} s."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100k,1m,10m", help="comma-separated: 100k,1m,10m")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each timed step")
    parser.add_argument("--repeat-full", type=int, default=3, help="runs of the full-history CLI scan")
    parser.add_argument("--tag", default="", help="write results/<script>-<tag>.* instead of merging")
    args = parser.parse_args(argv)
    done = {s: measure(s, args.repeat, args.repeat_full) for s in history.parse_sizes(args.sizes)}
    print(history.save("scan_cost", done, render, args.tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
