"""Catch rate on a real HA Airflow 3.1.2: a matrix of end-to-end runs (issue 8, docs/e2e.md).

Each cell starts a fresh cluster (``tests/e2e/harness.py``: PostgreSQL database, ``airflow db
migrate``, API server, DAG processor, two schedulers with LocalExecutor, ``dupguard run``), lets the
producer emit asset events for ``--duration`` seconds, drains, and judges the result against ground
truth read from the database (``tests/e2e/truth.py``). Cells run one after another (a 2-core machine
cannot run two clusters honestly).

    .venv/bin/python -m benchmarks.e2e_catch_rate                      # the default matrix below
    .venv/bin/python -m benchmarks.e2e_catch_rate --backend api,db --mode fail,skip \\
        --pickup 0,1 --guard off,on --fault on,off --duration 300 --tag full

Writes ``benchmarks/results/e2e_<tag>.json`` (every report, per-duplicate rows included) and
``benchmarks/results/e2e_<tag>.md`` (the table for docs/e2e.md), rewritten after every cell so an
interrupted matrix keeps what it measured. ``--cells`` picks explicit cells instead of the product:
``backend:mode:pickup:guard:fault[:duration]`` separated by commas, e.g.
``api:fail:0:off:on,db:skip:1:off:off:600``. ``--airflow 3.2.2 --dags partitioned`` runs the cells on
another Airflow with the partitioned producer/consumer pair (``tests/e2e/dags_partitioned/``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.e2e.harness import HarnessError, RunSpec, run
from tests.e2e.truth import summary_line

RESULTS = Path(__file__).resolve().parent / "results"


def _onoff(text: str) -> bool:
    if text not in {"on", "off"}:
        raise argparse.ArgumentTypeError(f"{text!r}: use on or off")
    return text == "on"


def _list(kind: Any) -> Any:
    return lambda text: [kind(x.strip()) for x in text.split(",") if x.strip()]


def cells(args: argparse.Namespace) -> list[RunSpec]:
    common = {
        "duration": args.duration,
        "fanout": args.fanout,
        "producer_sleep": args.producer_sleep,
        "fault_max_ms": 0.0,
        "airflow_version": args.airflow,
        "dags": args.dags,
    }
    raw: list[tuple[str, str, float, bool, bool, float]]
    if args.cells:
        raw = []
        for cell in args.cells.split(","):
            backend, mode, pickup, guard, fault, *duration = cell.split(":")
            seconds = float(duration[0]) if duration else args.duration
            raw.append((backend, mode, float(pickup), _onoff(guard), _onoff(fault), seconds))
    else:
        product = itertools.product(args.backend, args.mode, args.pickup, args.guard, args.fault)
        raw = [(*cell, args.duration) for cell in product]
    out = []
    for backend, mode, pickup, guard, fault, seconds in raw:
        prefix = "" if args.dags == "asset" and args.airflow == "3.1.2" else f"{args.airflow}-{args.dags}-"
        onoff = {True: "on", False: "off"}
        name = f"{prefix}{backend}-{mode}-pickup{pickup:g}s-guard{onoff[guard]}-fault{onoff[fault]}"
        out.append(
            RunSpec(
                name=name,
                backend=backend,
                mode=mode,
                pickup_delay=pickup,
                guard=guard,
                **common | {"fault_max_ms": args.fault_ms if fault else 0.0, "duration": seconds},
            )
        )
    return out


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


def table(reports: list[dict[str, Any]]) -> str:
    head = (
        "| backend | mode | pickup | guard | fault inj. | events | consumer runs | dup. groups | detected "
        "| false pos. | kept runs touched | duplicates | prevented (guard) | stopped before start "
        "| caught after start | missed | catch rate | latency p50 / p99 ms | deadline p50 / p99 ms "
        "| deadline (serial) p50 / p99 ms |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in reports:
        s = r["spec"]
        if "error" in r:
            lines.append(
                f"| {s['backend']} | {s['mode']} | {s['pickup_delay']:g} s | {'on' if s['guard'] else 'off'} "
                f"| {'on' if s['fault_max_ms'] else 'off'} | failed: {r['error'][:80]} |"
            )
            continue
        lat, dl, ds = r["latency_ms"], r["deadline_ms"], r["deadline_serial_ms"]
        rate = "-" if r["catch_rate"] is None else f"{100 * r['catch_rate']:.0f} %"
        lines.append(
            f"| {s['backend']} | {s['mode']} | {s['pickup_delay']:g} s | {'on' if s['guard'] else 'off'} "
            f"| {'0-' + format(s['fault_max_ms'], 'g') + ' ms' if s['fault_max_ms'] else 'off'} "
            f"| {r['asset_events']} | {r['consumer_runs']} | {r['duplicate_groups']} | {r['groups_detected']} "
            f"| {r['false_positives']} | {r['remediations_of_kept_runs']} | {r['duplicate_runs']} "
            f"| {r['prevented_by_guard']} | {r['stopped_before_start']} | {r['caught_after_start']} | {r['missed']} "
            f"| {rate} | {_fmt(lat['p50'])} / {_fmt(lat['p99'])} | {_fmt(dl['p50'])} / {_fmt(dl['p99'])} "
            f"| {_fmt(ds['p50'])} / {_fmt(ds['p99'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", type=_list(str), default=["api", "db"])
    p.add_argument("--mode", type=_list(str), default=["fail"])
    p.add_argument("--pickup", type=_list(float), default=[0.0, 1.0], help="worker pickup delays, seconds")
    p.add_argument("--guard", type=_list(_onoff), default=[False])
    p.add_argument("--fault", type=_list(_onoff), default=[True])
    p.add_argument("--fault-ms", type=float, default=500.0, help="fault injection: random 0..N ms")
    p.add_argument("--cells", help="explicit cells backend:mode:pickup:guard:fault,... (instead of the product)")
    p.add_argument("--duration", type=float, default=240.0, help="seconds of producer activity per cell")
    p.add_argument("--fanout", type=int, default=1)
    p.add_argument("--airflow", default="3.1.2", help="Airflow version (.airflow-venvs/<version>)")
    p.add_argument("--dags", choices=["asset", "partitioned"], default="asset", help="DAG set (partitioned: 3.2+)")
    p.add_argument("--producer-sleep", type=float, default=2.0)
    p.add_argument("--tag", default=datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))
    p.add_argument("--workdir", type=Path, help="where run directories (logs) go (default: a temp dir)")
    args = p.parse_args(argv)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dupguard-e2e-"))
    RESULTS.mkdir(exist_ok=True)
    out_json, out_md = RESULTS / f"e2e_{args.tag}.json", RESULTS / f"e2e_{args.tag}.md"
    reports: list[dict[str, Any]] = []
    meta = {
        "tag": args.tag,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "airflow": args.airflow,
        "dags": args.dags,
        "machine": f"{platform.node()} {platform.machine()}, {__import__('os').cpu_count()} CPUs",
        "argv": sys.argv[1:] if argv is None else argv,
        "workdir": str(workdir),
    }
    for spec in cells(args):
        t0 = time.monotonic()
        print(f"[{datetime.now(UTC):%H:%M:%S}] {spec.name} ...", flush=True)
        try:
            report = run(spec, workdir / spec.name)
        except HarnessError as exc:
            report = {"spec": spec.__dict__, "error": str(exc), "run_dir": str(workdir / spec.name)}
            print(f"  failed: {exc}", flush=True)
        else:
            print("  " + summary_line(report) + f" ({time.monotonic() - t0:.0f} s)", flush=True)
        reports.append(report)
        out_json.write_text(json.dumps({"meta": meta, "runs": reports}, indent=2, default=str))
        out_md.write_text(
            f"<!-- benchmarks/e2e_catch_rate.py, tag {args.tag}, {meta['started']}, {meta['machine']} -->\n"
            + table(reports)
        )
    print(f"\nwrote {out_json} and {out_md}")
    return 1 if any("error" in r for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
