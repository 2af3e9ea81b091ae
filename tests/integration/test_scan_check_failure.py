"""A periodic check that fails in ``scan`` costs its own answer only (the 100M-row measurement).

At 100M task instances the double_bump check's sequential scan outlasts scan's 60 s round-trip
deadline (benchmarks/results/measurements.md, double-bump check). Before, that one statement ended the whole scan with
exit 3 and an error document: the duplicate groups already read, and every other check, were lost.
Here the check's statement is held back for real past a short ``--db-timeout``: the scan's
``search_path`` finds first a ``task_instance`` view that sleeps in the server for the statements that
name ``task_instance_history`` (only that check's).
"""

from __future__ import annotations

import json

import psycopg2
import pytest
from sqlalchemy.engine import make_url

from detector.app.cli import main
from tests.pg import Templates, ground_truth

pytestmark = pytest.mark.integration

VERSION = "3.1.2"


# The check's statements read task_instance and name task_instance_history: a task_instance view
# first in the search_path sleeps in the server for those statements only (current_query()), once per
# statement as a One-Time Filter (a STABLE function without arguments is a pseudo-constant).
SLOW_HISTORY = """
CREATE SCHEMA dupguard_slow;
CREATE FUNCTION dupguard_slow.stall() RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN current_query() LIKE '%task_instance_history%' THEN (SELECT true FROM pg_sleep(30)) ELSE true END
$$;
CREATE VIEW dupguard_slow.task_instance AS SELECT * FROM public.task_instance WHERE dupguard_slow.stall();
"""


def _scan_with_history_stalled(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    conn = psycopg2.connect(url)
    with conn, conn.cursor() as cur:
        cur.execute(SLOW_HISTORY)
    conn.close()
    stalled = str(make_url(url).update_query_dict({"options": "-csearch_path=dupguard_slow,public"}))
    code = main(["scan", "--database-url", stalled, "--format", "json", "--db-timeout", "2s"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def test_a_check_past_the_deadline_leaves_the_groups_and_the_other_checks_standing(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    truth = ground_truth(VERSION, "race_asset")
    code, doc, err = _scan_with_history_stalled(pg_templates.clone(VERSION, "race_asset"), capsys)
    assert doc["error"] is None
    found = sorted((g["dag_id"], sorted([g["kept_run_id"], *g["duplicate_run_ids"]])) for g in doc["groups"])
    assert found == sorted((g["dag_id"], sorted(g["run_ids"])) for g in truth["expected_groups"])
    assert code == 1  # the duplicates found are the answer
    assert "no answer within 2s" in doc["check_errors"]["double_bump"]
    assert "double_bump" not in doc["checks"]
    # the check before it, and the one after it (on a fresh connection: the timed-out one is closed)
    assert {"stranded_events", "trigger_flapping"} <= set(doc["checks"])
    assert "dupguard: check double_bump failed, so its findings are missing from this report" in err
    assert "--disabled-checks double_bump" in err
    assert len([line for line in err.splitlines() if "double_bump" in line]) == 1  # one line says it


def test_a_failed_check_with_nothing_found_exits_3(pg_templates: Templates, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing found is no answer when a check could not look: not exit 0."""
    code, doc, err = _scan_with_history_stalled(pg_templates.clone(VERSION), capsys)
    assert doc["groups"] == [] and doc["error"] is None
    assert list(doc["check_errors"]) == ["double_bump"]
    assert code == 3
    assert "check double_bump failed" in err


def test_every_check_answering_reports_no_check_errors(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["scan", "--database-url", pg_templates.clone(VERSION), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert (code, doc["check_errors"]) == (0, {})
    assert "double_bump" in doc["checks"]
