"""Alert formatting: what on-call reads, within Slack's limits whatever the names."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

from detector.actions.alerts.channels.log import log_fields
from detector.actions.alerts.channels.webhook import digest_payload, severity, webhook_payload
from detector.actions.alerts.dispatch import outcome_signature
from detector.actions.alerts.group_text import plain_text, status_of
from detector.actions.alerts.slack_messages import (
    detected_message,
    digest_message,
    digest_outcome_message,
    limits_problems,
    outcome_message,
)
from detector.actions.alerts.text import BLOCK_LIMIT, HEADER_LIMIT, SCHEMA, SECTION_LIMIT, run_url
from detector.actions.alerts.text import cut_mrkdwn as _cut_mrkdwn
from detector.core.model import Confidence, Finding, Kind, Run
from detector.core.plan import Action, Mode, Outcome
from detector.core.ports import AlertEvent, AlertKind, RemediationResult, Result, StartedTask
from tests.factories import T0, run
from tests.slack_server import block_problems

UI = "http://airflow.example:8080"


def _run(id: int, dag_id: str = "consumer", job: int = 7, host: str = "scheduler-0") -> Run:
    return replace(run(dag_id, id=id, job=job), creator_hostname=host)


def _finding(
    dag_id: str = "consumer",
    n_dups: int = 1,
    confidence: Confidence = Confidence.CONFIRMED,
    key: str = "g1",
) -> Finding:
    kept = _run(1, dag_id, 7, "scheduler-0")
    dups = tuple(_run(100 + i, dag_id, 8, "scheduler-1") for i in range(n_dups))
    return Finding(
        key=key,
        kind=Kind.ASSET,
        confidence=confidence,
        dag_id=dag_id,
        kept=kept,
        duplicates=dups,
        shared_event_ids=(41, 42),
        run_after=T0,
    )


def _event(finding: Finding | None = None, assets: tuple[str, ...] = ("s3://bucket/orders",)) -> AlertEvent:
    return AlertEvent(
        kind=AlertKind.DETECTED,
        finding=finding or _finding(),
        detected_at=T0 + timedelta(seconds=1),
        cluster="prod-eu",
        mode="fail",
        assets=assets,
    )


def _outcome(event: AlertEvent, result: Result, detail: str = "") -> AlertEvent:
    results = tuple(
        RemediationResult(
            action=Action(
                event.finding.key,
                event.finding.dag_id,
                r,
                event.finding.kept.run_id,
                Outcome.REMEDIATE,
                Mode.FAIL,
                "note",
            ),
            result=result,
            detail=detail,
        )
        for r in event.finding.duplicates
    )
    return replace(event, kind=AlertKind.OUTCOME, results=results)


def _all_text(blocks: tuple[dict[str, object], ...]) -> str:
    return json.dumps(blocks)


def test_detected_message_names_everything_on_call_needs() -> None:
    """DAG, asset, event ids, kept and duplicate runs with UI links, creating job + host, mode, cluster."""
    e = _event()
    msg = detected_message(e, UI)
    text = _all_text(msg.blocks)
    kept, dup = e.finding.kept, e.finding.duplicates[0]
    for needle in (
        "consumer",
        "s3://bucket/orders",
        "41, 42",
        "prod-eu",
        "fail",
        "scheduler job 7",
        "scheduler-0",
        "scheduler job 8",
        "scheduler-1",
        "2026-03-12T11:35:10",
    ):
        assert needle in text, needle
    assert run_url(UI, "consumer", kept.run_id) in text  # type: ignore[operator]
    assert run_url(UI, "consumer", dup.run_id) in text  # type: ignore[operator]
    assert msg.text and "consumer" in msg.text  # the fallback Slack requires next to blocks


def test_run_url_quotes_run_id() -> None:
    """Run ids hold ':' and '+' (timestamps); the Airflow 3 UI path gets them percent-encoded."""
    url = run_url(UI + "/", "my dag", "asset_triggered__2026-03-12T11:35:09+00:00")
    assert url == f"{UI}/dags/my%20dag/runs/asset_triggered__2026-03-12T11%3A35%3A09%2B00%3A00"
    assert run_url(None, "d", "r") is None


def test_suspected_group_gets_distinct_lower_severity_message() -> None:
    """A suspected group says so in its header, explains itself, and is a warning rather than an error."""
    confirmed = _event()
    suspected = _event(_finding(confidence=Confidence.SUSPECTED))
    c_head = detected_message(confirmed).blocks[0]["text"]["text"]
    s_head = detected_message(suspected).blocks[0]["text"]["text"]
    assert "Suspected" in s_head and "Suspected" not in c_head and c_head != s_head
    assert "Never remediated automatically" in _all_text(detected_message(suspected).blocks)
    # a confirmed group being stopped (mode fail) is a warning until its outcome says how it ended
    assert severity(confirmed) == "warning" and severity(suspected) == "warning"
    assert severity(replace(confirmed, mode="dry-run")) == "error"
    assert webhook_payload(suspected)["severity"] == "warning"


def test_limits_hold_whatever_the_names() -> None:
    """Huge DAG ids, run ids, asset names and hundreds of duplicates stay within every Slack limit."""
    dag = "d" * 5000 + "&<>"
    f = replace(_finding(dag_id=dag, n_dups=400), partition_key="p&" * 3000)
    f = replace(f, duplicates=tuple(replace(r, run_id="r<&>" * 300, creator_hostname="h" * 900) for r in f.duplicates))
    e = _event(f, assets=tuple("asset&<" * 500 + str(i) for i in range(200)))
    for ui in (UI, "http://" + "x" * 4000):
        for msg in (
            detected_message(e, ui),
            detected_message(e, ui, _outcome(e, Result.FAILED, "x" * 9000).results),
            outcome_message(_outcome(e, Result.DONE), ui),
            outcome_message(_outcome(e, Result.DONE), ui, threaded=False),
            digest_message([e] * 3000, ui),
            digest_outcome_message([_outcome(e, Result.DONE)] * 3000),
        ):
            assert limits_problems(msg.blocks) == [] and block_problems(list(msg.blocks)) == []
            assert msg.text
            assert len(msg.blocks) <= BLOCK_LIMIT
            assert all(len(b["text"]["text"]) <= HEADER_LIMIT for b in msg.blocks if b["type"] == "header")
            assert all(len(b["text"]["text"]) <= SECTION_LIMIT for b in msg.blocks if b["type"] == "section")


def test_long_lists_say_how_many_were_left_out() -> None:
    """Cut lists end in '… and N more' rather than silently dropping duplicates or groups."""
    e = _event(_finding(n_dups=400))
    assert "more duplicate runs" in _all_text(detected_message(e, UI).blocks)
    digest = digest_message([e] * 3000, UI)
    assert "more groups" in _all_text(digest.blocks)


def test_names_are_escaped_and_cuts_never_split_escapes_or_links() -> None:
    """'&', '<', '>' in names are escaped; a cut drops a partial escape or link instead of breaking it."""
    e = _event(_finding(dag_id="a<b>&c"))
    text = _all_text(detected_message(e).blocks[1:])  # the header is plain_text: nothing to escape there
    assert "a&lt;b&gt;&amp;c" in text and "a<b>" not in text
    cut = _cut_mrkdwn("x" * 10 + "&amp;" + "y" * 10, 13)
    assert cut == "x" * 10 + "…"
    cut = _cut_mrkdwn("ab <http://u|label> cd", 10)
    assert cut == "ab …"


def test_outcome_status_is_worst_result() -> None:
    """failed beats too late beats dry-run beats stopped; no results is pending."""
    e = _event(_finding(n_dups=2))
    done = _outcome(e, Result.DONE).results
    failed = _outcome(e, Result.FAILED).results
    late = _outcome(e, Result.TOO_LATE).results
    assert status_of(()).name == "pending"
    assert status_of(done).name == "remediated"
    assert status_of((done[0], failed[1])).name == "failed"
    assert status_of((done[0], late[1])).name == "too_late"
    assert status_of(_outcome(e, Result.DRY_RUN).results).name == "dry_run"
    assert status_of(_outcome(e, Result.SKIPPED).results).name == "no_action"


def test_caught_after_start_is_its_own_status_and_names_the_task_that_ran() -> None:
    """A duplicate stopped after its task had started: status caught_after_start (below failed, above
    too late), warning severity, and every rendering names the task with its states; the v1 webhook
    result gains ``started_tasks`` and keeps every earlier field."""
    e = _event(_finding(n_dups=2))
    done, caught = _outcome(e, Result.DONE).results[0], _outcome(e, Result.CAUGHT_AFTER_START).results[1]
    caught = replace(caught, started_tasks=(StartedTask("extract", -1, "queued", "failed"),))
    failed = _outcome(e, Result.FAILED).results[1]
    late = _outcome(e, Result.TOO_LATE).results[1]
    assert status_of((done, caught)).name == "caught_after_start"
    assert status_of((caught, failed)).name == "failed"
    assert status_of((caught, late)).name == "caught_after_start"
    out = replace(e, kind=AlertKind.OUTCOME, results=(done, caught))
    assert severity(out) == "error"  # both runs executed: it pages
    for message in (detected_message(e, UI, out.results), outcome_message(out, UI)):
        assert "extract (queued -&gt; failed)" in _all_text(message.blocks) and "extract" in message.text
        assert not limits_problems(message.blocks)
    assert "extract (queued -> failed)" in plain_text(out, UI)
    p = json.loads(json.dumps(webhook_payload(out, UI)))
    assert p["remediation"]["status"] == "caught_after_start"
    first, second = p["remediation"]["results"]
    assert set(first) == {"run_id", "outcome", "result", "detail", "committed_at", "started_tasks"}
    assert first["result"] == "done" and first["started_tasks"] == []
    assert second["result"] == "caught_after_start"
    assert second["started_tasks"] == [
        {"task_id": "extract", "map_index": -1, "state_before": "queued", "state_after": "failed"}
    ]


def test_updated_first_message_shows_the_outcome() -> None:
    """The chat.update version of the first message carries each duplicate's result and the status."""
    e = _event()
    out = _outcome(e, Result.TOO_LATE)
    text = _all_text(detected_message(e, UI, out.results).blocks)
    assert "too late" in text
    assert "too late" not in _all_text(detected_message(e, UI).blocks)


def test_outcome_signature_tells_outcomes_apart() -> None:
    """The same outcome has the same signature; a different result for the group another one."""
    e = _event()
    assert outcome_signature(_outcome(e, Result.FAILED)) == outcome_signature(_outcome(e, Result.FAILED, "again"))
    assert outcome_signature(_outcome(e, Result.FAILED)) != outcome_signature(_outcome(e, Result.DONE))


def test_webhook_payload_is_versioned_and_complete() -> None:
    """dupguard.alert/v1: type, severity, dedup_key, the group with run links, remediation, plain text."""
    e = _event()
    p = json.loads(json.dumps(webhook_payload(e, UI)))
    assert p["schema"] == SCHEMA == "dupguard.alert/v1"
    assert p["type"] == "detected" and p["dedup_key"] == "g1" and p["cluster"] == "prod-eu"
    g = p["group"]
    assert g["dag_id"] == "consumer" and g["shared_event_ids"] == [41, 42] and g["assets"] == ["s3://bucket/orders"]
    assert g["kept"]["creating_job_id"] == 7 and g["kept"]["creator_hostname"] == "scheduler-0"
    assert g["duplicates"][0]["url"].startswith(UI + "/dags/consumer/runs/")
    assert p["remediation"] == {"mode": "fail", "status": "pending", "results": []}
    o = webhook_payload(_outcome(e, Result.FAILED, "409 conflict"), UI)
    assert o["type"] == "outcome" and o["remediation"]["status"] == "failed"
    assert o["remediation"]["results"][0]["detail"] == "409 conflict"
    d = digest_payload([e, _event(_finding(key="g2"))], UI)
    assert d["type"] == "digest" and d["count"] == 2 and [x["key"] for x in d["groups"]] == ["g1", "g2"]


def test_plain_text_and_log_fields_hold_every_field_uncut() -> None:
    """What an undelivered alert logs is the whole content, however long; log fields list every field."""
    e = _event(_finding(n_dups=400))
    text = plain_text(e, UI)
    assert all(r.run_id in text for r in e.finding.duplicates)
    assert "scheduler-1" in text and "s3://bucket/orders" in text and "prod-eu" in text
    fields = log_fields(e, UI)
    assert fields["creating_job_ids"] == [7] + [8] * 400
    assert fields["creator_hostnames"][0] == "scheduler-0"
    for key in (
        "dag_id",
        "kind",
        "confidence",
        "group_key",
        "kept_run",
        "duplicate_runs",
        "shared_event_ids",
        "assets",
        "run_after",
        "partition_key",
        "detected_at",
        "remediation_mode",
        "cluster",
    ):
        assert key in fields
