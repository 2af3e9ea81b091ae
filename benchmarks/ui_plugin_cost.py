"""Cost of a page of the UI plugin ("HA health", detector/guard/ui_plugin.py) on 1M and 10M run histories.

A page answers from the documents the plugin keeps in memory (detector/guard/ha_health_scans.py), which
a background refresh renews; before the first ones are in, a page waits at most 0.8 s, then says that
dupguard is reading the database and reloads itself.
Per size (benchmarks/history.py's histories), each timed ``--repeat`` times (median reported):

- first findings: how long after the first request the findings are in, ``Scans.documents()`` on a new
  ``Scans``: ``dupguard doctor`` and ``dupguard scan --since 7d`` (the plugin's default window), run as the
  plugin runs them (new processes, the URL in the environment); no page waits for it;
- warm: a later page, ``Scans.documents()`` (stale, so it also starts the background refresh) and the nav
  page made for an admin (``readable`` + ``render_nav``), in process.

Not in these figures: the API server's own request handling and the auth manager's DAG list (Airflow's
cost, the same for its own pages). The history databases hold the tables dupguard reads, not a whole
Airflow schema, so no real API server runs on them here (tests/integration/test_ui_plugin.py runs one).

    .venv/bin/python benchmarks/ui_plugin_cost.py --sizes 1m,10m [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import history

from detector.guard import ha_health
from detector.guard.ha_health_scans import Scans

DUPGUARD = str(history.ROOT / ".venv" / "bin" / "dupguard")
TARGET_S = 1.0


def _scans(url: str) -> Scans:
    return Scans([DUPGUARD], since="7d", refresh=0, timeout=600, database_url=lambda: url)


def measure(size: str, repeat: int, log: Any = print) -> dict[str, Any]:
    meta = history.ensure(size, log=log)
    url = history.db_url(size)
    cold, warm = [], []
    doc: dict[str, Any] = {}
    doctor: dict[str, Any] | None = None
    for _ in range(repeat):
        scans = _scans(url)
        t0 = time.perf_counter()
        doc, doctor = scans.documents()
        cold.append(time.perf_counter() - t0)
        if doc.get("error"):
            raise RuntimeError(f"scan failed: {doc['error']}")
        for _ in range(20):
            t0 = time.perf_counter()
            now, now_doctor = scans.documents()
            ha_health.render_nav(ha_health.readable(now, None), now_doctor, ha_health.Links(""))
            warm.append(time.perf_counter() - t0)
        while scans._refreshing.locked():  # let the background refresh end before the next round
            time.sleep(0.1)
    log(f"  [{size}] cold {statistics.median(cold):.2f} s, warm {statistics.median(warm) * 1000:.1f} ms")
    return {
        "runs": meta.runs,
        "repeat": repeat,
        "cold_seconds": [round(s, 3) for s in cold],
        "cold_median_s": round(statistics.median(cold), 3),
        "warm_median_ms": round(statistics.median(warm) * 1000, 2),
        "warm_max_ms": round(max(warm) * 1000, 2),
        "groups": len(doc.get("groups") or []),
        "doctor_ok": doctor is not None,
    }


def render(sizes: dict[str, Any]) -> str:
    rows = []
    for size, m in sizes.items():
        p = m["provenance"]
        rows.append(
            [
                size,
                f"{m['runs']:,}",
                f"{m['warm_median_ms']} ms (max {m['warm_max_ms']} ms)",
                f"{m['cold_median_s']} s",
                m["groups"],
                "yes" if m["doctor_ok"] else "no",
                f"{p['commit']}{'' if p['clean'] else ' (uncommitted code)'}",
                ", ".join(str(x) for x in p["load_average"]),
            ]
        )
    headers = [
        "history",
        "dag_run rows",
        "a page (warm, from memory)",
        "first findings after start (doctor + scan --since 7d, in the background)",
        "groups",
        "doctor answered",
        "commit",
        "load (1/5/15 min)",
    ]
    return history.markdown_table(headers, rows) + f"\n\nTarget: a page within {TARGET_S:g} s at 10M dag_run rows."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = {size: measure(size, args.repeat) for size in history.parse_sizes(args.sizes)}
    print(history.save("ui_plugin_cost", sizes, render))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
