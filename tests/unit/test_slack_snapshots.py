"""Snapshots of the Slack messages on-call reads: the Block Kit JSON of every outcome,
committed in tests/unit/snapshots/slack/, and each posted to the Slack stand-in, which checks it against
Slack's published limits (tests/slack_limits.py).

A deliberate change of a message: regenerate and review the diff,

    DUPGUARD_UPDATE_SNAPSHOTS=1 .venv/bin/pytest tests/unit/test_slack_snapshots.py
    git diff tests/unit/snapshots/slack/
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from detector.actions.alerts.channels.slack_bot import SlackBot
from detector.actions.alerts.notice import observation_notice
from detector.actions.alerts.oncall import Links
from detector.actions.alerts.slack_clients import make_web_client
from detector.actions.alerts.slack_messages import detected_message, digest_message, digest_outcome_message
from detector.actions.alerts.slack_messages import outcome_message as reply
from detector.actions.alerts.text import Message
from detector.actions.remediation.guarded import passive_result
from detector.app.ledger import MemoryLedger
from detector.app.wiring import build_alerter
from detector.checks.split_partition.alert import split_notice
from detector.checks.split_partition.rule import SplitPartition, SplitRow
from detector.config import RUNBOOK_URL, Config
from detector.core.checks import Observation
from detector.core.model import Confidence, Finding, Kind, TaskProgress
from detector.core.plan import Action, Mode, Outcome
from detector.core.ports import AlertEvent, AlertKind, RemediationResult, Result, StartedTask
from detector.metrics import Metrics
from tests.factories import T0, run
from tests.slack_server import SlackServer

SNAPSHOTS = Path(__file__).parent / "snapshots" / "slack"
UPDATE = os.environ.get("DUPGUARD_UPDATE_SNAPSHOTS") == "1"
UI = "https://airflow.example"
LINKS = Links(
    runbook_url="https://docs.example/dupguard/docs/runbooks.md", grafana_url="https://grafana.example/d/dupguard"
)


def _finding(confidence: Confidence = Confidence.CONFIRMED, started: bool = False) -> Finding:
    kept = replace(run("orders_consumer", id=901, job=11), creator_hostname="scheduler-0")
    dup = replace(run("orders_consumer", id=902, job=12), creator_hostname="scheduler-1")
    progress = {902: TaskProgress(total=3, started=1 if started else 0)}
    return Finding(
        key=f"asset|orders_consumer|{T0.isoformat()}",  # as detect.py makes it
        kind=Kind.ASSET,
        confidence=confidence,
        dag_id="orders_consumer",
        kept=kept,
        duplicates=(dup,),
        shared_event_ids=(4711, 4712),
        run_after=T0,
        progress=progress,
    )


def _event(f: Finding, mode: str = Mode.FAIL, unrecorded: str | None = None) -> AlertEvent:
    return AlertEvent(
        kind=AlertKind.DETECTED,
        finding=f,
        detected_at=T0 + timedelta(seconds=1),
        cluster="prod-eu",
        mode=mode,
        assets=("s3://lake/orders",),
        unrecorded=unrecorded,
    )


def _action(f: Finding, outcome: Outcome, mode: Mode) -> Action:
    return Action(f.key, f.dag_id, f.duplicates[0], f.kept.run_id, outcome, mode, note="")


def _executed(
    result: Result, detail: str = "", mode: Mode = Mode.FAIL, **kw: Any
) -> Callable[[Finding], RemediationResult]:
    outcome = Outcome.WOULD_REMEDIATE if mode is Mode.DRY_RUN else Outcome.REMEDIATE
    return lambda f: RemediationResult(_action(f, outcome, mode), result, detail, **kw)


def _planned(outcome: Outcome, mode: Mode = Mode.FAIL) -> Callable[[Finding], RemediationResult]:
    def make(f: Finding) -> RemediationResult:
        r = passive_result(_action(f, outcome, mode))
        assert r is not None
        return r

    return make


# outcome -> (how its result is made, the group's confidence, mode, whether a task of the duplicate started)
OUTCOMES: dict[str, tuple[Callable[[Finding], RemediationResult], Confidence, Mode, bool]] = {
    "dry_run": (_executed(Result.DRY_RUN, mode=Mode.DRY_RUN), Confidence.CONFIRMED, Mode.DRY_RUN, False),
    "dry_run_task_started": (_executed(Result.DRY_RUN, mode=Mode.DRY_RUN), Confidence.CONFIRMED, Mode.DRY_RUN, True),
    "done": (_executed(Result.DONE, committed_at=T0 + timedelta(seconds=2)), Confidence.CONFIRMED, Mode.FAIL, False),
    "already": (_executed(Result.ALREADY, "already failed (by an operator)"), Confidence.CONFIRMED, Mode.FAIL, False),
    "too_late": (_planned(Outcome.TOO_LATE), Confidence.CONFIRMED, Mode.FAIL, True),
    "caught_after_start": (
        _executed(
            Result.CAUGHT_AFTER_START,
            committed_at=T0 + timedelta(seconds=2),
            started_tasks=(StartedTask("extract", -1, None, "failed"),),
        ),
        Confidence.CONFIRMED,
        Mode.FAIL,
        False,
    ),
    "failed": (
        _executed(Result.FAILED, "HTTP 403 from PATCH dagRuns: the user lacks can_edit on DAG Runs"),
        Confidence.CONFIRMED,
        Mode.FAIL,
        False,
    ),
    "unknown": (_executed(Result.UNKNOWN, "the read-back failed: timed out"), Confidence.CONFIRMED, Mode.FAIL, False),
    "gone": (_executed(Result.GONE, "HTTP 404"), Confidence.CONFIRMED, Mode.FAIL, False),
    "not_confirmed": (_planned(Outcome.NOT_CONFIRMED), Confidence.SUSPECTED, Mode.FAIL, False),
    "disabled": (_planned(Outcome.DISABLED, Mode.OFF), Confidence.CONFIRMED, Mode.OFF, False),
    "prevented": (_planned(Outcome.PREVENTED), Confidence.CONFIRMED, Mode.FAIL, False),
    "stopped_before": (_planned(Outcome.STOPPED_BEFORE), Confidence.CONFIRMED, Mode.FAIL, False),
    "kept_before": (_planned(Outcome.KEPT_BEFORE), Confidence.CONFIRMED, Mode.FAIL, False),
}


def _outcome_messages(name: str) -> dict[str, Message]:
    """The first message as updated by the outcome, the thread reply, and the webhook's standalone follow-up."""
    make, confidence, mode, started = OUTCOMES[name]
    f = _finding(confidence, started)
    event = _event(f, mode)
    results = (make(f),)
    done = replace(event, kind=AlertKind.OUTCOME, results=results, outcome_at=event.detected_at + timedelta(seconds=2))
    return {
        "first_message_updated": detected_message(done, UI, results, links=LINKS),  # as slack_bot updates it
        "thread_reply": reply(done, UI, links=LINKS),
        "standalone_follow_up": reply(done, UI, threaded=False, links=LINKS),
    }


def _split_partition() -> SplitPartition:
    rows = (
        SplitRow(id=7, created_at=T0, created_dag_run_id=None, event_ids=(31,), age_seconds=95.0),
        SplitRow(
            id=8, created_at=T0 + timedelta(seconds=1), created_dag_run_id=None, event_ids=(32,), age_seconds=94.0
        ),
    )
    return SplitPartition(
        key="split:7", dag_id="daily_report", partition_key="2026-03-12", rows=rows, split_at=rows[1].created_at
    )


def _split() -> dict[str, Message]:
    notice = split_notice(_split_partition(), "prod-eu", T0 + timedelta(seconds=95))
    return {"message": notice.message(UI, LINKS), "without_links": notice.message()}


def _observation() -> dict[str, Message]:
    """A periodic check's alert as every kind without its own formatter gets it (alerts/notice.py)."""
    obs = Observation(
        kind="trigger_flapping",
        key="trigger_flapping|17",
        confidence="confirmed",
        severity="error",
        dag_ids=("orders_consumer",),
        title="Trigger 17 (MessageQueueTrigger) claimed by two live triggerers",
        lines=("triggerer job 41 on triggerer-0, then job 42 on triggerer-1", "feeds asset orders"),
        advice="Upgrade to Airflow 3.2.2 or run one triggerer; check orders_consumer for runs of one message.",
        facts={"trigger_id": 17},
        seen_at=T0,
    )
    notice = observation_notice(obs, "prod-eu", T0 + timedelta(seconds=3))
    return {"message": notice.message(UI, LINKS), "without_links": notice.message()}


def _others() -> Iterator[tuple[str, dict[str, Message]]]:
    f = _finding()
    yield (
        "detected",
        {
            "first_message": detected_message(_event(f), UI, links=LINKS),
            "no_links_configured": detected_message(_event(f)),
        },
    )
    yield (
        "detected_suspected",
        {"first_message": detected_message(_event(_finding(Confidence.SUSPECTED)), UI, links=LINKS)},
    )
    yield (
        "ledger_failure",
        {
            "first_message": detected_message(
                _event(
                    f, unrecorded="DUPGUARD_STATE_FILE /state/dupguard.json: cannot write (No space left on device)"
                ),
                UI,
                links=LINKS,
            )
        },
    )
    yield "split_partition", _split()
    yield "observation", _observation()
    events = [_event(replace(f, key=f"{f.key}#{i}")) for i in range(3)]
    outcomes = [
        replace(e, kind=AlertKind.OUTCOME, results=(OUTCOMES[n][0](e.finding),))
        for e, n in zip(events, ("done", "too_late", "failed"), strict=True)
    ]
    yield (
        "digest",
        {"digest": digest_message(events, UI, links=LINKS), "outcomes": digest_outcome_message(outcomes, links=LINKS)},
    )


def _cases() -> dict[str, dict[str, Message]]:
    return {name: _outcome_messages(name) for name in OUTCOMES} | dict(_others())


def _json(messages: dict[str, Message]) -> dict[str, Any]:
    # through JSON and back: the snapshot compares what is sent, not Python objects (tuples are lists there)
    data: dict[str, Any] = json.loads(json.dumps({k: m.as_kwargs() for k, m in messages.items()}))
    return data


CASES = _cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_message_matches_its_snapshot(name: str) -> None:
    """Each outcome's messages are exactly the committed Block Kit JSON (regenerate: module docstring)."""
    path = SNAPSHOTS / f"{name}.json"
    got = _json(CASES[name])
    if UPDATE:
        SNAPSHOTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=2, ensure_ascii=False) + "\n")
    assert path.exists(), f"no snapshot {path.name}: run DUPGUARD_UPDATE_SNAPSHOTS=1 .venv/bin/pytest {__file__}"
    assert got == json.loads(path.read_text()), (
        f"{name} changed: if meant, DUPGUARD_UPDATE_SNAPSHOTS=1 and review the diff"
    )


def test_every_snapshot_file_is_a_case() -> None:
    """A snapshot whose case was removed is not left behind unchecked."""
    assert sorted(p.stem for p in SNAPSHOTS.glob("*.json")) == sorted(CASES)


@pytest.fixture(scope="module")
def slack() -> Iterator[SlackServer]:
    server = SlackServer()
    yield server
    server.stop()


@pytest.mark.parametrize("name", sorted(CASES))
def test_snapshot_is_accepted_by_the_slack_stand_in(slack: SlackServer, name: str) -> None:
    """Every committed snapshot, posted with the real bot transport, passes Slack's published block limits."""
    bot = SlackBot(make_web_client(slack.token, api_url=slack.api_url, timeout=5, on_retry=lambda: None), "#alerts")
    snapshot = json.loads((SNAPSHOTS / f"{name}.json").read_text())
    for kwargs in snapshot.values():
        bot.post(Message(text=kwargs["text"], blocks=tuple(kwargs["blocks"])))
    assert slack.rejected == []


# --- what the snapshots must say, whatever their wording (a regenerated snapshot cannot drop these) ---

LEVELS = {
    # a duplicate that will run (nobody stopped it) or ran pages
    "CRITICAL": {
        "too_late",
        "caught_after_start",
        "failed",
        "dry_run",
        "dry_run_task_started",
        "unknown",
        "disabled",
        "kept_before",
    },
    "HIGH": {"detected", "ledger_failure"},
    "WARNING": {"not_confirmed", "detected_suspected"},
    "INFO": {"done", "already", "gone", "prevented", "stopped_before"},
}
KEPT = "https://airflow.example/dags/orders_consumer/runs/asset_triggered__2026-03-12T11%3A35%3A09.550275%2B00%3A00_00000901"
DUP = KEPT.replace("00000901", "00000902")
DATE = re.compile(r"<!date\^(\d+)\^\{date_short_pretty\} \{time_secs\}\|([^>|]+)>")


def _mrkdwn(m: Message) -> str:
    texts = [b["text"]["text"] for b in m.blocks if b["type"] in ("section", "header")]
    return "\n".join(texts + [e["text"] for b in m.blocks if b["type"] == "context" for e in b["elements"]])


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_severity_is_in_words_in_the_header_the_first_section_and_the_fallback(level: str) -> None:
    """Not only an emoji: the level word heads the message, the section under it, and the notification text."""
    for name in LEVELS[level]:
        first = next(iter(CASES[name].values()))
        head, advice = first.blocks[0]["text"]["text"], first.blocks[1]["text"]["text"]
        assert f" {level}: " in head and advice.startswith(f"*{level} — ") and first.text.startswith(f"{level} — "), (
            name
        )
        assert "*What to do now:* " in advice, name


@pytest.mark.parametrize("name", ["dry_run", "disabled", "failed", "kept_before"])
def test_an_unstopped_duplicate_says_how_to_stop_it_by_hand_with_its_link(name: str) -> None:
    for m in CASES[name].values():
        todo = _mrkdwn(m)
        assert "has started, stop it by hand: mark it failed in the Airflow UI" in todo and f"<{DUP}|duplicate>" in todo


@pytest.mark.parametrize("name", ["too_late", "caught_after_start", "dry_run_task_started"])
def test_when_both_ran_it_says_check_both_runs_downstream_effects_with_both_links(name: str) -> None:
    for m in CASES[name].values():
        todo = _mrkdwn(m)
        assert "check the downstream effects of both runs" in todo
        assert f"<{KEPT}|kept run>" in todo and f"<{DUP}|duplicate>" in todo


@pytest.mark.parametrize("name", sorted(LEVELS["INFO"]))
def test_a_finished_stop_says_nothing_to_do(name: str) -> None:
    assert all("*What to do now:* Nothing to do" in _mrkdwn(m) for m in CASES[name].values())


def test_links_to_the_runbook_dashboard_and_grid_view_when_configured() -> None:
    configured, bare = _mrkdwn(CASES["detected"]["first_message"]), _mrkdwn(CASES["detected"]["no_links_configured"])
    assert (
        "<https://docs.example/dupguard/docs/runbooks.md#DupguardDuplicateRun|Runbook: DupguardDuplicateRun>"
        in configured
    )
    assert "<https://grafana.example/d/dupguard|Grafana dashboard>" in configured
    assert "<https://airflow.example/dags/orders_consumer|DAG grid view>" in configured
    # without DUPGUARD_RUNBOOK_URL the runbook is still a link on-call can click: the released page
    assert f"<{RUNBOOK_URL}#DupguardDuplicateRun|Runbook: DupguardDuplicateRun>" in bare
    assert RUNBOOK_URL.startswith("https://github.com/airflow-dupguard/airflow-dupguard/blob/v")
    assert "grafana" not in bare and "DAG grid view" not in bare
    split = _mrkdwn(CASES["split_partition"]["message"])
    assert (
        "runbooks.md#DupguardSplitPartition|" in split
        and "<https://airflow.example/dags/daily_report|DAG grid view>" in split
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_times_are_slack_date_tokens_with_the_iso_time_as_fallback(name: str) -> None:
    """Each token's fallback is the ISO time of the same instant; a token is never escaped into text."""
    for kind, m in CASES[name].items():
        text = _mrkdwn(m)
        assert "&lt;!date" not in text
        for unix, iso in DATE.findall(text):
            assert datetime.fromisoformat(iso).timestamp() // 1 == int(unix)
        if kind.startswith(("first_message", "message")):  # run_after and detection (a split: its rows too)
            assert len(DATE.findall(text)) >= 2, f"{name}: no date tokens"
    if name in ("done", "caught_after_start"):  # the stop's commit time, in the thread reply
        assert DATE.search(_mrkdwn(CASES[name]["thread_reply"]))


def test_the_daemons_alerter_sends_the_configured_links(slack: SlackServer) -> None:
    """build_alerter passes DUPGUARD_RUNBOOK_URL, DUPGUARD_GRAFANA_DASHBOARD_URL and the UI URL to both
    Slack messages of a group (the first, updated with the outcome, and the thread reply) and to a split."""
    config = Config.of(
        slack_bot_token=slack.token,
        slack_channel="#dupguard",
        slack_api_url=slack.api_url,
        airflow_ui_url=UI,
        runbook_url=LINKS.runbook_url,
        grafana_dashboard_url=LINKS.grafana_url,
        cluster_name="prod-eu",
    )
    alerter = build_alerter(config, MemoryLedger(), Metrics())
    first = _event(_finding())
    alerter.notify(first)
    assert slack.wait_for(lambda: any(m.channel == "CDUPGUARD" for m in slack.messages.values()))
    alerter.notify(replace(first, kind=AlertKind.OUTCOME, results=(OUTCOMES["too_late"][0](first.finding),)))
    alerter.notify_notice(split_notice(_split_partition(), "prod-eu", T0))
    alerter.close(10)
    posted = [m for m in slack.messages.values() if m.channel == "CDUPGUARD"]
    sent = [{"text": m.text, "blocks": m.blocks} for m in posted] + [u for m in posted for u in m.updates]
    assert len(sent) == 4 and slack.rejected == []  # first, reply, split, and the first one's update
    for message in sent:
        links = json.dumps(message["blocks"])
        assert (
            f"{LINKS.runbook_url}#Dupguard" in links and f"<{LINKS.grafana_url}|" in links and "DAG grid view" in links
        )
    assert posted[0].updates[0]["blocks"][1]["text"]["text"].startswith("*CRITICAL — both runs executed*")
