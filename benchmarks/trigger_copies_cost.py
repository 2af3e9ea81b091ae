"""Cost of the id-less copies' reads (the trigger_flapping check, checks.trigger_flapping.rule_copies) at ``--sizes``
rows of ``asset_event``.

The history of benchmarks/trigger_event_cost.py (200 assets, 20 of them a trigger's; the 3.3.2 schema
with only Airflow's indexes), except that the trigger assets' events carry one Redis pub/sub message
with the same body each (``{"type": "message", "pattern": null, "channel": "orders", "data": ...}``:
the worst case, every event a candidate), and the 3 planted copies (0.2 s apart, each consumed by its
own run) are Redis messages too.

Measured, through ``TriggerFlappingCheck._copies`` (the reads and the rule, not the owner look):
``run``'s look for one flapping trigger on one asset, reading the last hour (``COPIES_LOOKBACK``), and
``scan``'s for a trigger exposed on all 20 trigger assets, all history and the last day.

    .venv/bin/python benchmarks/trigger_copies_cost.py --sizes 1m,10m --repeat 5 --out trigger_copies_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import stranded_check_cost as base  # noqa: E402
from benchmarks import trigger_event_cost as te  # noqa: E402
from benchmarks.history import machine, parse_sizes  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from detector.checks.trigger_flapping.check import COPIES_LOOKBACK, TriggerFlappingCheck  # noqa: E402
from detector.checks.trigger_flapping.rule import ASSET, TriggererJob, TriggerRow  # noqa: E402
from detector.config import Config  # noqa: E402
from detector.core.checks import CheckContext  # noqa: E402
from detector.metadb.engine import make_engine, open_airflow_db, parse_url  # noqa: E402
from detector.metrics import Metrics  # noqa: E402

REDIS = (
    "json_build_object('from_trigger', true, 'payload', json_build_object('type', 'message', 'pattern', NULL, "
    "'channel', 'orders', 'data', '{\"order\": 42}'))"
)
EVENTS = te.EVENTS.replace(te.SQS.format(mid="'m-' || i"), REDIS)
PLANT = te.PLANT.replace(te.SQS.format(mid="'dup-' || k"), REDIS)
assert EVENTS != te.EVENTS and PLANT != te.PLANT, "trigger_event_cost's SQL changed: update this benchmark"


def _median_ms(times: list[float]) -> float:
    return round(statistics.median(times) * 1000, 2)


def _trigger(asset_ids: tuple[int, ...], created: datetime) -> TriggerRow:
    names = tuple(f"asset_{a}" for a in asset_ids)
    return TriggerRow(1, created, 2, ASSET, names, tuple(f"dag_{a}" for a in asset_ids), asset_ids=asset_ids)


def measure(url: str, repeat: int) -> dict[str, Any]:
    db = open_airflow_db(make_engine(parse_url(url)))
    check = TriggerFlappingCheck(Config.of(), Metrics())
    timings: dict[str, list[float]] = {"run_last_hour": [], "scan_all_history": [], "scan_last_day": []}
    found: dict[str, int] = {}
    with db.engine.connect() as conn:
        newest = conn.exec_driver_sql("SELECT max(timestamp) FROM asset_event").scalar_one()
        oldest = conn.exec_driver_sql("SELECT min(timestamp) FROM asset_event").scalar_one()
        per_asset = conn.exec_driver_sql("SELECT count(*) FROM asset_event WHERE asset_id = 0").scalar_one()
        start = oldest - timedelta(days=1)
        jobs = [TriggererJob(j, f"triggerer-{j}", "running", start, None, newest) for j in (2, 3)]  # both alive
        db_now = newest + timedelta(seconds=1)
        cases = {
            "run_last_hour": ((0,), db_now - COPIES_LOOKBACK, True),
            "scan_all_history": (tuple(range(te.TRIGGER_ASSETS)), None, False),
            "scan_last_day": (tuple(range(te.TRIGGER_ASSETS)), newest - timedelta(days=1), False),
        }
        for name, (assets, since, live) in cases.items():
            ctx = CheckContext(db_now=db_now, now=datetime.now(UTC), live=live, since=since)
            for _ in range(repeat):
                began = time.perf_counter()
                obs = check._copies(conn, db, [_trigger(assets, start)], since, jobs, ctx)
                timings[name].append(time.perf_counter() - began)
                conn.rollback()
            found[name] = len(obs)
    db.engine.dispose()
    return {
        "events_of_one_trigger_asset": per_asset,
        **{f"{k}_ms": _median_ms(v) for k, v in timings.items()},
        **{f"{k}_ms_all": [round(x * 1000, 2) for x in v] for k, v in timings.items()},
        "sets_found": found,
        "sets_planted": {"run_last_hour": 1, "scan_all_history": 3, "scan_last_day": 3},
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="trigger_copies_cost.json", help="file name under benchmarks/results")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {
        "provenance": provenance(),
        "machine": machine(),
        "repeat": args.repeat,
        "window_seconds": 60,
        "sizes": {},
    }
    for size in parse_sizes(args.sizes):
        started = time.monotonic()
        url = te.build(size, EVENTS, PLANT, kind="trigger_copies")
        built = time.monotonic() - started
        out["sizes"][size] = measure(url, args.repeat) | {"build_seconds": round(built, 1)}
        print(size, json.dumps(out["sizes"][size]), flush=True)
    (base.RESULTS / args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
