"""Catch rate on a real HA Airflow: a matrix of end-to-end runs (benchmarks/results/e2e.md).

Each run starts a fresh cluster (``tests/e2e/harness.py``: PostgreSQL database, ``airflow db
migrate``, API server, DAG processor, two schedulers with the LocalExecutor or the CeleryExecutor
(Redis, two workers), optionally the triggerer with an AssetWatcher, one or two ``dupguard run``
replicas), lets the producer emit asset events for ``--duration`` seconds, drains, and judges the
result against ground truth read from the database (``tests/e2e/truth.py``). Runs go one after
another (a 2-core machine cannot run two clusters honestly); ``--reps`` repeats each cell.

    .venv/bin/python -m benchmarks.e2e_catch_rate                      # the default matrix below
    .venv/bin/python -m benchmarks.e2e_catch_rate --executor local,celery --backend api,db \\
        --pickup 0 --guard off,on --fault on --reps 3 --duration 120 --tag matrix17

Writes ``benchmarks/results/e2e_<tag>.json`` (every report, per-duplicate rows and raw latency
samples included) and ``benchmarks/results/e2e_<tag>.md`` (one table per executor, repetitions of a
cell pooled, for benchmarks/results/e2e.md), rewritten after every run so an interrupted matrix keeps what it
measured. ``--cells`` picks explicit cells instead of the product:
``backend:mode:pickup:guard:fault[:duration]`` separated by commas (crossed with ``--executor`` and
``--source``), e.g. ``api:fail:0:off:on,db:skip:1:off:off:600``. ``--airflow 3.2.2 --dags partitioned``
runs the cells on another Airflow with the partitioned producer/consumer pair. ``--watcher on`` adds
the triggerer and the AssetWatcher consumers; ``--replicas 2 --kills N --outage 20`` the failover and
API-outage faults. ``--seed`` makes the random moments of the faults repeatable.

``--report TAG,TAG`` runs nothing: it prints the table of runs already stored under those tags, runs
of one cell pooled across tags (how benchmarks/results/e2e.md's tables are made).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.provenance import provenance
from tests.e2e.harness import HarnessError, RunSpec, run
from tests.e2e.truth import percentiles, summary_line

RESULTS = Path(__file__).resolve().parent / "results"
ONOFF = {True: "on", False: "off"}


def _onoff(text: str) -> bool:
    if text not in {"on", "off"}:
        raise argparse.ArgumentTypeError(f"{text!r}: use on or off")
    return text == "on"


def _list(kind: Any) -> Any:
    return lambda text: [kind(x.strip()) for x in text.split(",") if x.strip()]


def cells(args: argparse.Namespace) -> list[RunSpec]:
    common = {
        "fanout": args.fanout,
        "producer_sleep": args.producer_sleep,
        "airflow_version": args.airflow,
        "dags": args.dags,
        "watcher": args.watcher,
        "replicas": args.replicas,
        "leader_kills": args.kills,
        "api_outage": args.outage,
        "celery_workers": args.celery_workers,
        "seed": args.seed,
        "poll_interval": args.poll,
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
    for executor, source in itertools.product(args.executor, args.source):
        for backend, mode, pickup, guard, fault, seconds in raw:
            prefix = "" if args.dags == "asset" and args.airflow == "3.1.2" else f"{args.airflow}-{args.dags}-"
            # the pickup delay stands in for a real executor's latency: LocalExecutor only
            pickup = pickup if executor == "local" else 0.0
            name = f"{prefix}{executor}-{source}-{backend}-{mode}-pickup{pickup:g}s"
            name += f"-guard{ONOFF[guard]}-fault{ONOFF[fault]}"
            name += f"-poll{args.poll}" if args.poll else ""
            spec = {
                "executor": executor,
                "source": source,
                "backend": backend,
                "mode": mode,
                "pickup_delay": pickup,
                "guard": guard,
                "fault_max_ms": args.fault_ms if fault else 0.0,
                "duration": seconds,
            }
            for rep in range(args.reps):
                suffix = f"-rep{rep + 1}" if args.reps > 1 else ""
                out.append(RunSpec(name=name + suffix, **common | spec))
    return out


def cell_key(spec: dict[str, Any]) -> tuple[Any, ...]:
    """What makes two runs repetitions of one cell: every setting but the name and the seed (no poll
    interval, as stored before it was a setting, is dupguard's default)."""
    return tuple(
        sorted((k, v) for k, v in spec.items() if k not in ("name", "seed") and (k, v) != ("poll_interval", ""))
    )


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float] | None:
    """95 % Wilson score interval of k successes in n (None for n = 0)."""
    if n == 0:
        return None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def pool(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Repetitions of one cell, pooled: sums of the counts, percentiles of every raw sample, the
    catch rate with its 95 % Wilson interval over the pooled duplicates (the duplicates of one run
    are not independent, so the per-run range is given as well), and the failed runs."""
    ok = [r for r in reports if "error" not in r]
    counts = (
        "asset_events",
        "asset_events_from_trigger",
        "consumer_runs",
        "duplicate_groups",
        "groups_detected",
        "false_positives",
        "remediations_of_kept_runs",
        "duplicate_runs",
        "prevented_by_guard",
        "stopped_before_start",
        "detected_but_ran",
        "missed",
        "not_started_not_stopped",
        "failed_by_airflow_before_start",
        "remediated_then_ran",
        "remediated_after_start",
        "leader_kills",
        "kills_without_takeover",
    )
    out: dict[str, Any] = {k: sum(r.get(k, 0) or 0 for r in ok) for k in counts}
    out["n"], out["failed_runs"] = len(ok), [r["error"][:120] for r in reports if "error" in r]
    caught = out["prevented_by_guard"] + out["stopped_before_start"]
    out["catch_rate"] = caught / out["duplicate_runs"] if out["duplicate_runs"] else None
    out["catch_ci"] = wilson(caught, out["duplicate_runs"])
    rates = [r["catch_rate"] for r in ok if r.get("catch_rate") is not None]
    out["catch_range"] = (min(rates), max(rates)) if rates else None
    for name in ("latency", "detection", "deadline"):
        out[name] = percentiles([x for r in ok for x in r.get("samples_ms", {}).get(name, [])])
    takeovers = [r["takeover_ms"] for r in ok if r.get("takeover_ms", {}).get("n")]
    out["takeover_max_ms"] = max((t["max"] for t in takeovers), default=None)
    outages = [r["outage"] for r in ok if "outage" in r]
    out["outage"] = {
        "runs": len(outages),
        "unavailable_s": [o["unavailable_s"] for o in outages],
        "waiting": sum(o["not_started_at_return"] for o in outages),
        "stopped": sum(o["stopped_before_start"] for o in outages),
        "not_run": sum(o["not_run_not_stopped"] for o in outages),
        "ran": sum(len(o["ran"]) for o in outages),
    }
    return out


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:g}" if isinstance(x, float) else str(x)


def _tail(stats: dict[str, Any]) -> str:
    """p50 / p99; below 100 samples the nearest-rank p99 is the largest sample, so it is called max."""
    if (stats.get("n") or 0) < 100 and stats.get("max") is not None:
        return f"{_fmt(stats['p50'])} / max {_fmt(stats['max'])}"
    return f"{_fmt(stats['p50'])} / {_fmt(stats['p99'])}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def table(reports: list[dict[str, Any]]) -> str:
    """One table per executor; one row per cell (its repetitions pooled)."""
    cells_of: dict[str, dict[tuple[Any, ...], list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in reports:
        cells_of[r["spec"].get("executor", "local")][cell_key(r["spec"])].append(r)
    head = (
        "| source | backend | mode | pickup | guard | fault inj. | faults | n | events (trigger) | dup. groups "
        "| detected | false pos. | kept runs touched | duplicates | prevented (guard) | stopped before start "
        "| detected but ran | missed | not run, not stopped | catch rate [95 % CI] (per-run range) "
        "| detection p50 / p99 or max ms | latency p50 / p99 or max ms | deadline p50 / p99 or max ms "
        "| API outage: waiting → stopped / not run / ran |"
    )
    out = []
    for executor in sorted(cells_of):
        out += [f"\n**{executor} executor**\n", head, "|" + "---|" * (head.count("|") - 1)]
        for runs in cells_of[executor].values():
            s, p = runs[0]["spec"], pool(runs)
            faults = []
            if s.get("replicas", 1) > 1 or s.get("leader_kills"):
                kills = f", {p['leader_kills']} kills (takeover ≤ {_fmt(p['takeover_max_ms'])} ms)"
                replicas = f"{s.get('replicas', 1)} replica" + ("s" if s.get("replicas", 1) > 1 else "")
                faults.append(replicas + (kills if s.get("leader_kills") else ""))
            if s.get("api_outage"):
                faults.append(f"API down {s['api_outage']:g} s")
            if s.get("watcher"):
                faults.append("watcher")
            if s.get("poll_interval"):  # not a fault: the one setting of dupguard's a cell may vary
                faults.append(f"poll {s['poll_interval']}")
            ci = p["catch_ci"]
            rate = _pct(p["catch_rate"]) + (f" [{_pct(ci[0])}-{_pct(ci[1])}]" if ci else "")
            if p["catch_range"] and p["n"] > 1:
                rate += f" ({_pct(p['catch_range'][0])}-{_pct(p['catch_range'][1])})"
            fault_ms = f"0-{s['fault_max_ms']:g} ms" if s["fault_max_ms"] else "off"
            o = p["outage"]
            outage = f"{o['waiting']} → {o['stopped']} / {o['not_run']} / {o['ran']}" if o["runs"] else "-"
            n = f"{p['n']}" + (f" ({len(p['failed_runs'])} failed)" if p["failed_runs"] else "")
            lat, det, dl = p["latency"], p["detection"], p["deadline"]
            out.append(
                f"| {s.get('source', 'database')} | {s['backend']} | {s['mode']} | {s['pickup_delay']:g} s "
                f"| {ONOFF[bool(s['guard'])]} | {fault_ms} "
                f"| {', '.join(faults) or '-'} | {n} | {p['asset_events']} ({p['asset_events_from_trigger']}) "
                f"| {p['duplicate_groups']} | {p['groups_detected']} | {p['false_positives']} "
                f"| {p['remediations_of_kept_runs']} | {p['duplicate_runs']} | {p['prevented_by_guard']} "
                f"| {p['stopped_before_start']} | {p['detected_but_ran']} | {p['missed']} "
                f"| {p['not_started_not_stopped']} | {rate} | {_tail(det)} "
                f"| {_tail(lat)} | {_tail(dl)} | {outage} |"
            )
    return "\n".join(out) + "\n"


OLD_RAN_KEY = "caught_after_start"  # the e2e label "detected but ran" in results stored before it was renamed


def stored(tag: str) -> list[dict[str, Any]]:
    """The reports of a finished (or interrupted) matrix."""
    runs: list[dict[str, Any]] = json.loads((RESULTS / f"e2e_{tag}.json").read_text())["runs"]
    for report in runs:  # stored before the label was renamed (it is not the remediation result of that name)
        if OLD_RAN_KEY in report and "detected_but_ran" not in report:
            report["detected_but_ran"] = report.pop(OLD_RAN_KEY)
    return runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--executor", type=_list(str), default=["local"], help="local,celery")
    p.add_argument("--source", type=_list(str), default=["database"], help="dupguard's source: database,api")
    p.add_argument("--backend", type=_list(str), default=["api", "db"])
    p.add_argument("--mode", type=_list(str), default=["fail"])
    p.add_argument("--pickup", type=_list(float), default=[0.0, 1.0], help="worker pickup delays, s (local only)")
    p.add_argument("--guard", type=_list(_onoff), default=[False])
    p.add_argument("--fault", type=_list(_onoff), default=[True])
    p.add_argument("--fault-ms", type=float, default=500.0, help="fault injection: random 0..N ms")
    p.add_argument("--cells", help="explicit cells backend:mode:pickup:guard:fault,... (instead of the product)")
    p.add_argument("--duration", type=float, default=240.0, help="seconds of producer activity per run")
    p.add_argument("--reps", type=int, default=1, help="repetitions of each cell")
    p.add_argument("--fanout", type=int, default=1)
    p.add_argument("--watcher", type=_onoff, default=False, help="triggerer + AssetWatcher consumers (on/off)")
    p.add_argument("--replicas", type=int, default=1, help="dupguard replicas")
    p.add_argument("--kills", type=int, default=0, help="leader SIGKILLs per run, at random moments")
    p.add_argument("--outage", type=float, default=0.0, help="seconds the API server is stopped, once per run")
    p.add_argument("--celery-workers", type=int, default=2)
    p.add_argument("--poll", default="", help="dupguard's poll interval, e.g. 20ms (default: its own)")
    p.add_argument("--seed", type=int, default=0, help="random moments of the faults (0: fresh per run)")
    p.add_argument("--airflow", default="3.1.2", help="Airflow version (.airflow-venvs/<version>)")
    p.add_argument("--dags", choices=["asset", "partitioned"], default="asset", help="DAG set (partitioned: 3.2+)")
    p.add_argument("--producer-sleep", type=float, default=2.0)
    p.add_argument("--tag", default=datetime.now(UTC).strftime("%Y%m%dT%H%M%S"))
    p.add_argument("--workdir", type=Path, help="where run directories (logs) go (default: a temp dir)")
    p.add_argument("--report", type=_list(str), help="print the pooled table of these stored tags; run nothing")
    args = p.parse_args(argv)
    if args.report:
        print(table([run for tag in args.report for run in stored(tag)]), end="")
        return 0

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dupguard-e2e-"))
    RESULTS.mkdir(exist_ok=True)
    out_json, out_md = RESULTS / f"e2e_{args.tag}.json", RESULTS / f"e2e_{args.tag}.md"
    reports: list[dict[str, Any]] = []
    meta = {
        "tag": args.tag,
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "airflow": args.airflow,
        "dags": args.dags,
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
        "argv": sys.argv[1:] if argv is None else argv,
        "workdir": str(workdir),
        "provenance": provenance(),
    }
    for spec in cells(args):
        t0 = time.monotonic()
        load = os.getloadavg()[0]
        print(f"[{datetime.now(UTC):%H:%M:%S}] {spec.name} (load {load:.1f}) ...", flush=True)
        try:
            report = run(spec, workdir / spec.name)
        except HarnessError as exc:
            report = {"spec": spec.__dict__, "error": str(exc), "run_dir": str(workdir / spec.name)}
            print(f"  failed: {exc}", flush=True)
        else:
            print("  " + summary_line(report) + f" ({time.monotonic() - t0:.0f} s)", flush=True)
        report["load_average_start"] = round(load, 2)
        report["load_average_end"] = round(os.getloadavg()[0], 2)
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
