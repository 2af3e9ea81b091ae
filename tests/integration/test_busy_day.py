"""``dupguard scan`` with every periodic check on, over a compressed busy day of an HA deployment made by Airflow's
own code (tests/fixtures/scenarios/<ver>/busy/busy_day, scripts/airflow/scenarios_busy_day.py).

The day has two schedulers taking turns, rolling deploys (orphan resets of the stopped pod's tasks), pauses and
unpauses, clears, retries, reschedule sensors, deferrals, a backfill, manual runs, asset events from tasks and from
the REST API, watchers run by two triggerers and mapped tasks, and a few planted members of every kind. The
ground truth is what Airflow recorded for the planted ones; per kind, the scan must find every one of them and
nothing else: any other finding is a false one until shown otherwise.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import text

from detector.app.cli import main
from detector.checks.registry import KINDS
from detector.metadb.engine import make_engine, parse_url
from tests.pg import FIXTURES, Templates, ground_truth

pytestmark = pytest.mark.integration

SCENARIO = "busy/busy_day"
# The periodic checks each version has: double_bump is 3.0/3.1 only (fixed in 3.2.0), split_partition 3.2+.
APPLIES = {"3.1.2": set(KINDS) - {"split_partition"}, "3.3.2": set(KINDS) - {"double_bump"}}
VERSIONS = [v for v in APPLIES if (FIXTURES / "scenarios" / v / f"{SCENARIO}.json").is_file()]
# What a version can have planted: 3.2+ lock the asset queue (no asset race), keep asset triggers with their live
# owner (no second copy of a message, no watcher exposure) and give a reset task a history row.
PLANTABLE = {
    "3.1.2": {
        "group:asset",
        "group:trigger_event",
        "stranded_events",
        "stranded_events:committed_late",
        "double_bump",
        "trigger_flapping:exposure",
        "trigger_flapping:copies_without_id",
    },
    "3.3.2": {"stranded_events", "stranded_events:committed_late", "trigger_flapping:exposure"},
}

Found = dict[str, set[tuple[Any, ...]]]


def settings_env(truth: dict[str, Any]) -> dict[str, str]:
    """The deployment's Airflow [scheduler] orphan timing, given to dupguard as a deployment would."""
    timing = truth["notes"]["orphan_timing"]
    return {
        "DUPGUARD_DOUBLE_BUMP_HEALTH_CHECK_THRESHOLD": f"{timing['health_check_threshold_s']}s",
        "DUPGUARD_DOUBLE_BUMP_ORPHAN_CHECK_INTERVAL": f"{timing['check_interval_s']}s",
    }


def expected(truth: dict[str, Any]) -> Found:
    """The planted members, per kind, as Airflow recorded them."""
    groups = {g["kind"]: set() for g in truth["expected_groups"]} | {"asset": set(), "trigger_event": set()}
    for g in truth["expected_groups"]:
        groups[g["kind"]].add((g["dag_id"], tuple(sorted(g["run_ids"]))))
    return {
        **{f"group:{k}": v for k, v in groups.items()},
        "stranded_events": {
            (s["dag_id"], s["stranding_run_id"], tuple(s["event_ids"])) for s in truth["expected_stranded"]
        },
        "stranded_events:committed_late": {
            (s["dag_id"], s["window_run_id"], tuple(s["event_ids"])) for s in truth["expected_committed_late"]
        },
        "double_bump": {(b["ti_id"], tuple(b["tries"])) for b in truth["expected_bumps"]},
        "trigger_flapping:exposure": {(e["trigger_id"],) for e in truth["expected_exposures"]},
        "trigger_flapping:copies_without_id": {
            (c["dag_id"], c["first_run_id"], tuple(c["extra_run_ids"])) for c in truth["suspected_copies"]
        },
    }


def found(doc: dict[str, Any]) -> Found:
    """What the scan document reports, per kind, in the same shape."""
    out: Found = {"group:asset": set(), "group:trigger_event": set()}
    for g in doc["groups"]:
        out.setdefault(f"group:{g['kind']}", set()).add((g["dag_id"], tuple(sorted(r["run_id"] for r in g["runs"]))))
    for kind, entries in doc["checks"].items():
        for o in entries:
            if kind == "stranded_events" and o.get("reason") == "committed_late":
                out.setdefault(f"{kind}:committed_late", set()).add((o["dag_id"], o["run_id"], tuple(o["event_ids"])))
            elif kind == "stranded_events" and not o.get("reason"):
                out.setdefault(kind, set()).add((o["dag_id"], o["run_id"], tuple(o["event_ids"])))
            elif kind == "double_bump":
                out.setdefault(kind, set()).add((o["ti_id"], tuple(o["tries"])))
            elif kind == "trigger_flapping" and o["confidence"] == "exposure":
                out.setdefault(f"{kind}:exposure", set()).add((o["trigger_id"],))
            elif kind == "trigger_flapping" and o.get("reason") == "copies_without_id":
                out.setdefault(f"{kind}:copies_without_id", set()).add(
                    (o["dag_ids"][0], o["first_run_id"], tuple(o["extra_run_ids"]))
                )
            else:  # a kind or a reason this test does not know: an other finding
                out.setdefault(f"{kind}:{o.get('reason') or o['confidence']}", set()).add((o["key"],))
    return out


def compare(want: Found, got: Found) -> dict[str, dict[str, Any]]:
    """Per kind: planted, found of them, missed, and the other findings (each one false until explained)."""
    return {
        kind: {
            "planted": len(want.get(kind, set())),
            "found": len(want.get(kind, set()) & got.get(kind, set())),
            "missed": sorted(map(list, want.get(kind, set()) - got.get(kind, set()))),
            "other": sorted(map(list, got.get(kind, set()) - want.get(kind, set()))),
        }
        for kind in sorted(set(want) | set(got))
    }


def scan_doc(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["scan", "--database-url", url, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("version", VERSIONS)
def test_scan_finds_every_planted_member_and_nothing_else(
    version: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    truth = ground_truth(version, SCENARIO)
    for name, value in settings_env(truth).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("DUPGUARD_DISABLED_CHECKS", raising=False)
    code, doc = scan_doc(pg_templates.clone(version, SCENARIO), capsys)
    assert code == 1 and doc["check_errors"] == {}
    assert set(doc["checks"]) == APPLIES[version]
    report = compare(expected(truth), found(doc))
    assert {k for k, r in report.items() if r["planted"]} == PLANTABLE[version]
    assert {k: (r["missed"], r["other"]) for k, r in report.items()} == {k: ([], []) for k in report}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_day_is_busy(version: str) -> None:
    """What makes the day worth scanning happened, by Airflow's records: not a few runs of one DAG."""
    truth = ground_truth(version, SCENARIO)
    outcomes = truth["notes"]["worker_outcomes"]
    assert {"success", "retry", "reschedule", "defer", "trigger_fired", "manual_run", "rest_event"} <= set(outcomes)
    run_types = {r["run_type"] for r in truth["runs"]}
    assert {"scheduled", "manual", "backfill", "asset_triggered"} <= run_types
    deploys = truth["notes"]["deploys"]
    assert {"scheduler", "scheduler killed", "triggerer"} <= {d["kind"] for d in deploys}
    assert sum(d["kind"] == "scheduler" for d in deploys) >= 2
    # Rolling deploys and a killed pod: orphan checks reset tasks in flight. On 3.0/3.1 the next try keeps the id
    # and has no history row: the double bump's look-alike, which only the stopped job's row tells apart.
    assert truth["notes"]["orphan_resets"]
    assert bool(truth["leftovers"]["tries_without_history_reset"]) == (version < "3.2")
    # Events registered while their consumer was paused through the REST API (patch_dag log rows), consumed by no
    # run although a run was created after them: not stranded, and the scan must say nothing of them.
    [paused] = truth["events_while_paused"]
    assert paused["event_ids"] and [r["event"] for r in paused["log"]][-2:] == ["patch_dag", "patch_dag"]
    assert len(truth["runs"]) >= 50


@pytest.mark.parametrize("version", VERSIONS)
def test_without_the_pause_records_the_paused_events_would_be_reported(
    version: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look-alike is in the day: with the ``log`` rows gone (what ``airflow db clean --tables log`` leaves, the
    log then covering nothing before the events) the REST-paused events look stranded, and the scan says so."""
    truth = ground_truth(version, SCENARIO)
    for name, value in settings_env(truth).items():
        monkeypatch.setenv(name, value)
    url = pg_templates.clone(version, SCENARIO)
    engine = make_engine(parse_url(url))
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM log"))
    finally:
        engine.dispose()
    _, doc = scan_doc(url, capsys)
    [paused] = truth["events_while_paused"]
    reported = {(o["dag_id"], tuple(o["event_ids"])) for o in doc["checks"]["stranded_events"] if not o.get("reason")}
    assert (paused["dag_id"], tuple(paused["event_ids"])) in reported
