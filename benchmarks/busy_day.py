"""False positives of ``dupguard scan`` (every periodic check on) on a compressed busy day of an HA deployment.

The fixture (tests/fixtures/scenarios/<ver>/busy/busy_day, made by Airflow's own code with
scripts/airflow/scenarios_busy_day.py) is loaded into a fresh database of the test PostgreSQL; ``dupguard scan
--format json`` runs ``--repeat`` times in this process (the CLI's ``main``), with the deployment's orphan timing
(the fixture's ``notes.orphan_timing``) as ``run`` would read it. Per kind: planted (the ground truth Airflow
recorded), found of them, other findings; and the scan's wall time.

    .venv/bin/python benchmarks/busy_day.py --version 3.1.2 --repeat 5 --out busy_day-3.1.2.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.provenance import provenance  # noqa: E402
from detector.app.cli import main  # noqa: E402
from tests.integration.test_busy_day import SCENARIO, compare, expected, found, settings_env  # noqa: E402
from tests.pg import FIXTURES, Templates, ground_truth  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def scan_once(url: str) -> tuple[float, int, dict[str, Any]]:
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(["scan", "--database-url", url, "--format", "json"])
    return time.perf_counter() - t0, code, json.loads(out.getvalue())


def measure(version: str, repeat: int) -> dict[str, Any]:
    truth = ground_truth(version, SCENARIO)
    os.environ.update(settings_env(truth))
    os.environ.pop("DUPGUARD_DISABLED_CHECKS", None)
    templates = Templates(made={})
    try:
        url = templates.clone(version, SCENARIO)
        walls, docs = [], []
        for _ in range(repeat):
            wall, code, doc = scan_once(url)
            walls.append(round(wall, 3))
            docs.append((code, doc))
    finally:
        templates.drop_all()
    code, doc = docs[-1]
    per_kind = compare(expected(truth), found(doc))
    sql = FIXTURES / "scenarios" / version / f"{SCENARIO}.sql"
    return {
        "airflow_version": version,
        "fixture": str(sql.relative_to(ROOT)),
        "fixture_bytes": sql.stat().st_size,
        "history": {
            "dag_runs": len(truth["runs"]),
            "run_types": sorted({r["run_type"] for r in truth["runs"]}),
            "worker_outcomes": truth["notes"]["worker_outcomes"],
            "deploys": [f"{d['kind']} {d['host']}" for d in truth["notes"]["deploys"]],
            "orphan_resets": len(truth["notes"]["orphan_resets"]),
            "generator_seconds": truth["generator_seconds"],
        },
        "settings": settings_env(truth),
        "exit_code": code,
        "check_errors": doc["check_errors"],
        "checks_run": sorted(doc["checks"]),
        "runs_examined": doc["runs_examined"],
        "per_kind": per_kind,
        "planted": sum(r["planted"] for r in per_kind.values()),
        "found": sum(r["found"] for r in per_kind.values()),
        "other_findings": sum(len(r["other"]) for r in per_kind.values()),
        "scan_wall_s": statistics.median(walls),
        "scan_wall_s_all": walls,
        "stable": all(json.dumps(compare(expected(truth), found(d))) == json.dumps(per_kind) for _, d in docs),
    }


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", default="3.1.2")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", help="file name under benchmarks/results/")
    args = ap.parse_args(argv)
    result = {**provenance(), "repeat": args.repeat, **measure(args.version, args.repeat)}
    text = json.dumps(result, indent=2) + "\n"
    if args.out:
        (RESULTS / args.out).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
