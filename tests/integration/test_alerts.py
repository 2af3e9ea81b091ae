"""Alert delivery end to end against a local Slack-compatible server (tests/slack_server.py) on 127.0.0.1.

No real Slack, no PostgreSQL: the server validates every request as Slack would (and checks the
limits dupguard promises), and a thread-safe in-memory ledger stands in for the shared ledger of
replicas and restarts.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from email.utils import formatdate
from typing import Any

import pytest
from structlog.testing import capture_logs

from detector.actions.alerts.channels.webhook import webhook_payload
from detector.actions.alerts.dispatch import Dispatcher
from detector.actions.alerts.json_webhook import JsonWebhook
from detector.app.wiring import build_alerter
from detector.config import Config
from detector.core.model import Confidence, Finding, Kind, Run
from detector.core.plan import Action, Mode, Outcome
from detector.core.ports import AlertEvent, AlertKind, RemediationResult, Result
from detector.metrics import Metrics
from tests.factories import T0, run
from tests.slack_server import SlackServer

UI = "http://airflow.local:8080"
CHANNEL = "#dup-alerts"


class SharedLedger:
    """The ledger replicas and restarts share (claims and notes), in memory and thread-safe."""

    durable = True

    def __init__(self) -> None:
        self.claims: set[tuple[str, str]] = set()
        self.notes: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def claim(self, group_key: str, subject: str) -> bool:
        with self._lock:
            if (group_key, subject) in self.claims:
                return False
            self.claims.add((group_key, subject))
            return True

    def remember(self, group_key: str, name: str, value: str) -> None:
        with self._lock:
            self.notes[(group_key, name)] = value

    def recall(self, group_key: str, name: str) -> str | None:
        with self._lock:
            return self.notes.get((group_key, name))

    def watermark(self) -> int | None:
        return None

    def save_watermark(self, high: int) -> None:
        pass


@pytest.fixture
def server() -> Iterator[SlackServer]:
    s = SlackServer()
    yield s
    s.stop()


@pytest.fixture
def ledger() -> SharedLedger:
    return SharedLedger()


def _config(server: SlackServer, **overrides: Any) -> Config:
    settings: dict[str, Any] = {
        "slack_bot_token": server.token,
        "slack_channel": CHANNEL,
        "slack_api_url": server.api_url,
        "airflow_ui_url": UI,
        "cluster_name": "prod-eu",
        "alert_timeout": timedelta(seconds=1),
        "alert_storm_threshold": 5,
        # these tests count messages and payloads, not their pace (tests/unit/test_pace.py,
        # tests/integration/test_storm_sinks.py): a 3,000-group storm's parts are not held for minutes
        "alert_requests_per_minute": 100_000,
    }
    return Config.of(**(settings | overrides))


def _alerter(config: Config, ledger: SharedLedger, metrics: Metrics | None = None) -> Dispatcher:
    return build_alerter(config, ledger, metrics or Metrics(), digest_delay=0.3)


def _run(id: int, job: int, host: str) -> Run:
    return replace(run("orders_consumer", id=id, job=job), creator_hostname=host)


def _finding(key: str, base: int = 1) -> Finding:
    return Finding(
        key=key,
        kind=Kind.ASSET,
        confidence=Confidence.CONFIRMED,
        dag_id="orders_consumer",
        kept=_run(base, 11, "scheduler-0"),
        duplicates=(_run(base + 1, 12, "scheduler-1"),),
        shared_event_ids=(base * 10,),
        run_after=T0,
    )


def detected(key: str, base: int = 1) -> AlertEvent:
    return AlertEvent(
        kind=AlertKind.DETECTED,
        finding=_finding(key, base),
        detected_at=T0 + timedelta(seconds=1),
        cluster="prod-eu",
        mode="fail",
        assets=("s3://lake/orders",),
    )


def outcome(event: AlertEvent, result: Result, detail: str = "") -> AlertEvent:
    f = event.finding
    results = tuple(
        RemediationResult(
            action=Action(f.key, f.dag_id, r, f.kept.run_id, Outcome.REMEDIATE, Mode.FAIL, "note"),
            result=result,
            detail=detail,
        )
        for r in f.duplicates
    )
    return replace(event, kind=AlertKind.OUTCOME, results=results)


def _count(metrics: Metrics, channel: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value("dupguard_alerts_total", {"channel": channel, "outcome": outcome})
    return value or 0.0


def _events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == name]


# --- exactly once ---------------------------------------------------------------------------------


def test_one_message_per_group_across_a_restart(server: SlackServer, ledger: SharedLedger) -> None:
    """A restarted daemon (new dispatcher, same ledger) neither re-posts a group nor loses its thread."""
    first, metrics = detected("g1"), Metrics()
    before = _alerter(_config(server), ledger)
    before.notify(first)
    before.close(10)

    after = _alerter(_config(server), ledger, metrics)
    after.notify(first)  # re-detected after the restart
    after.notify(outcome(first, Result.DONE))
    after.close(10)

    [message] = server.top_level()
    assert [r.text for r in server.replies(message.ts)] != []
    assert len(server.replies(message.ts)) == 1 and len(message.updates) == 1
    assert _count(metrics, "slack", "deduplicated") == 1 and _count(metrics, "slack", "sent") == 1
    assert server.rejected == []


def test_one_message_per_group_across_two_replicas(server: SlackServer, ledger: SharedLedger) -> None:
    """Two replicas sharing a ledger, both told about the same groups at once, post each group once."""
    events = [detected(f"g{i}", base=10 * i) for i in range(4)]
    m1, m2 = Metrics(), Metrics()
    a = _alerter(_config(server), ledger, m1)
    b = _alerter(_config(server), ledger, m2)
    for e in events:
        a.notify(e)
        b.notify(e)
    a.close(10)
    b.close(10)

    assert len(server.top_level()) == 4
    assert _count(m1, "slack", "sent") + _count(m2, "slack", "sent") == 4
    assert _count(m1, "slack", "deduplicated") + _count(m2, "slack", "deduplicated") == 4
    assert server.rejected == []


def test_replies_and_updates_land_on_their_own_message(server: SlackServer, ledger: SharedLedger) -> None:
    """Each group's outcome is a reply in its own thread, and its own first message is updated to show it."""
    groups = {k: detected(k, base=10 * i) for i, k in enumerate(["g-a", "g-b", "g-c"], start=1)}
    results = {"g-a": Result.DONE, "g-b": Result.FAILED, "g-c": Result.TOO_LATE}
    alerter = _alerter(_config(server), ledger)
    for e in groups.values():
        alerter.notify(e)
    for key in reversed(list(groups)):  # outcomes in another order than the alerts
        alerter.notify(outcome(groups[key], results[key], detail="API said 409" if key == "g-b" else ""))
    alerter.close(10)

    expected = {"g-a": "duplicate stopped", "g-b": "remediation failed", "g-c": "too late"}
    assert len(server.top_level()) == 3
    for key, event in groups.items():
        ts = ledger.recall(key, "slack_ts")
        assert ts is not None
        message = server.messages[ts]
        assert event.finding.kept.run_id in json.dumps(message.blocks)
        [reply] = server.replies(ts)
        assert event.finding.duplicates[0].run_id in reply.text
        assert expected[key] in reply.text.lower()
        [update] = message.updates
        assert expected[key] in json.dumps(update["blocks"]).lower()
        assert event.finding.kept.run_id in json.dumps(update["blocks"])
    assert server.rejected == []


def test_outcome_announced_once_but_a_later_different_outcome_too(server: SlackServer, ledger: SharedLedger) -> None:
    """The same outcome replayed is deduplicated; a new result for the group (failed, then done) is posted."""
    e = detected("g1")
    alerter = _alerter(_config(server), ledger)
    alerter.notify(e)
    alerter.notify(outcome(e, Result.FAILED))
    alerter.notify(outcome(e, Result.FAILED))
    alerter.notify(outcome(e, Result.DONE))
    alerter.close(10)
    [message] = server.top_level()
    assert len(server.replies(message.ts)) == 2
    assert "duplicate stopped" in json.dumps(message.updates[-1]["blocks"])


# --- storms ---------------------------------------------------------------------------------------


def test_storm_becomes_one_digest_and_every_group_is_logged(server: SlackServer, ledger: SharedLedger) -> None:
    """Over the threshold within a minute, the rest go out as one digest (outcomes as one reply); all are logged."""
    events = [detected(f"s{i}", base=10 * i) for i in range(12)]
    with capture_logs() as logs:
        alerter = _alerter(_config(server, alert_storm_threshold=3), ledger)
        for e in events:
            alerter.notify(e)
        for e in events:
            alerter.notify(outcome(e, Result.DONE))
        alerter.close(10)

    top = server.top_level()
    assert len(top) == 3 + 1  # the first three, then one digest
    digest = top[-1]
    body = json.dumps(digest.blocks)
    assert "9 duplicate DAG run groups" in body
    assert all(e.finding.kept.run_id in body for e in events[3:])
    assert len(server.replies(digest.ts)) == 1  # the digested groups' outcomes, together
    assert digest.updates == []
    assert {e["group_key"] for e in _events(logs, "duplicate_detected")} == {e.finding.key for e in events}
    assert len(_events(logs, "remediation_outcome")) == 12
    assert len(_events(logs, "alert_storm")) == 1
    assert server.rejected == []


# --- delivery -------------------------------------------------------------------------------------


def test_rate_limit_retry_after_is_honoured_then_delivered(server: SlackServer, ledger: SharedLedger) -> None:
    """A 429 with Retry-After: 1 is retried no sooner than a second later, and the alert arrives."""
    server.fail_next(1, 429, retry_after=1)
    metrics = Metrics()
    alerter = _alerter(_config(server), ledger, metrics)
    alerter.notify(detected("g1"))
    alerter.close(15)

    assert len(server.top_level()) == 1
    first, second = server.request_times[:2]
    assert second - first >= 1.0  # the client waited as told
    assert _count(metrics, "slack", "retried") == 1 and _count(metrics, "slack", "sent") == 1


def test_server_errors_are_retried(server: SlackServer, ledger: SharedLedger) -> None:
    """Two 500s in a row are retried with backoff; the alert is then delivered once."""
    server.fail_next(2, 500)
    metrics = Metrics()
    alerter = _alerter(_config(server), ledger, metrics)
    alerter.notify(detected("g1"))
    alerter.close(15)

    assert len(server.top_level()) == 1
    assert server.requests.count("/api/chat.postMessage") == 3
    assert _count(metrics, "slack", "retried") == 2 and _count(metrics, "slack", "failed") == 0


def test_hang_times_out_and_alert_is_logged_undelivered_with_content(server: SlackServer, ledger: SharedLedger) -> None:
    """Slack hanging on every attempt: each times out, and the alert is logged undelivered with its whole text."""
    server.hang_next(3, 30)
    metrics = Metrics()
    e = detected("g1")
    with capture_logs() as logs:
        alerter = _alerter(_config(server), ledger, metrics)
        alerter.notify(e)
        alerter.close(30)

    assert server.messages == {}
    assert server.requests.count("/api/chat.postMessage") == 3  # first try + 2 retries
    [undelivered] = _events(logs, "alert_undelivered")
    assert undelivered["channel"] == "slack" and "timed out" in undelivered["error"]
    for needle in ("orders_consumer", e.finding.kept.run_id, e.finding.duplicates[0].run_id, "scheduler-1", "prod-eu"):
        assert needle in undelivered["content"]
    assert _count(metrics, "slack", "failed") == 1 and _count(metrics, "slack", "retried") == 2


def test_notify_returns_while_slack_hangs(server: SlackServer, ledger: SharedLedger) -> None:
    """notify only logs and enqueues: with a request stuck in Slack, further notifies return (and are logged)."""
    server.hang_next(10, 60)
    with capture_logs() as logs:
        alerter = _alerter(_config(server), ledger)
        alerter.notify(detected("g1"))
        assert server.wait_for(lambda: server.hanging == 1)  # the worker is now stuck in Slack
        alerter.notify(detected("g2", base=20))
        alerter.notify(outcome(detected("g2", base=20), Result.DONE))
        still_hanging = server.hanging  # read after both notify calls returned
        logged = [e["event"] for e in logs]
        alerter.close(0.2)

    assert still_hanging == 1 and server.messages == {}
    assert logged.count("duplicate_detected") == 2 and logged.count("remediation_outcome") == 1
    undelivered = _events(logs, "alert_undelivered")
    assert {tuple(u["group_keys"]) for u in undelivered} == {("g1",), ("g2",)}
    assert len(undelivered) == 3  # g1 in flight, g2 detected and its outcome queued


# --- other transports -----------------------------------------------------------------------------


def test_slack_webhook_one_message_per_group_then_follow_ups(server: SlackServer, ledger: SharedLedger) -> None:
    """With an incoming webhook: one message per group (also after a restart), outcomes as new messages."""
    config = _config(server, slack_bot_token=None, slack_channel=None, slack_webhook_url=server.webhook_url)
    e = detected("g1")
    a = _alerter(config, ledger)
    a.notify(e)
    a.close(10)
    b = _alerter(config, ledger)
    b.notify(e)
    b.notify(outcome(e, Result.DONE))
    b.close(10)

    assert len(server.webhook_messages) == 2
    first, follow_up = server.webhook_messages
    assert "orders_consumer" in first["text"] and first["blocks"][0]["type"] == "header"
    assert "duplicate stopped" in follow_up["text"] and "Follow-up" in json.dumps(follow_up["blocks"])
    assert server.rejected == []


def test_generic_webhook_gets_versioned_payloads_with_retries(server: SlackServer, ledger: SharedLedger) -> None:
    """The JSON webhook gets dupguard.alert/v1 payloads (detected, then outcome); a 503 is retried."""
    config = _config(server, slack_bot_token=None, slack_channel=None, webhook_url=server.generic_url)
    server.fail_next(1, 503)
    metrics = Metrics()
    e = detected("g1")
    alerter = _alerter(config, ledger, metrics)
    alerter.notify(e)
    alerter.notify(outcome(e, Result.FAILED, "409 from the API"))
    alerter.close(15)

    detected_p, outcome_p = server.generic_payloads
    assert detected_p["schema"] == "dupguard.alert/v1" and detected_p["type"] == "detected"
    assert detected_p["dedup_key"] == "g1" and detected_p["group"]["kept"]["creator_hostname"] == "scheduler-0"
    assert outcome_p["type"] == "outcome" and outcome_p["remediation"]["status"] == "failed"
    assert _count(metrics, "webhook", "retried") == 1 and _count(metrics, "webhook", "sent") == 2


def test_generic_webhook_honours_retry_after(server: SlackServer, ledger: SharedLedger) -> None:
    """A 429 from the JSON webhook with Retry-After: 1 is retried no sooner than a second later."""
    config = _config(server, slack_bot_token=None, slack_channel=None, webhook_url=server.generic_url)
    server.fail_next(1, 429, retry_after=1)
    alerter = _alerter(config, ledger)
    alerter.notify(detected("g1"))
    alerter.close(15)
    assert len(server.generic_payloads) == 1
    first, second = server.request_times[:2]
    assert second - first >= 1.0


@pytest.mark.parametrize("form", ["seconds", "http_date"])
def test_a_webhook_429_holds_the_payloads_after_it_too(server: SlackServer, form: str) -> None:
    """The JSON webhook answers a payload 429 with Retry-After 30 s (in seconds, or as an
    HTTP date): its retry waits for it, and so does the next payload, instead of being sent into the
    same refusal (a storm's next parts were). The waits are recorded, not slept."""
    slept: list[float] = []
    hook = JsonWebhook(server.generic_url, timeout=5.0, retries=2, sleep=slept.append)
    server.fail_next(1, 429, retry_after=30 if form == "seconds" else formatdate(time.time() + 30, usegmt=True))
    hook.send(webhook_payload(detected("g1"), UI))
    first, slept[:] = list(slept), []
    hook.send(webhook_payload(detected("g2", base=20), UI))
    assert [p["dedup_key"] for p in server.generic_payloads] == ["g1", "g2"]
    assert first and 25 < first[0] <= 30, first  # the retry waited for Retry-After, not the backoff
    assert len(slept) == 1 and 25 < slept[0] <= 30, slept  # the next payload waited for the rest of it


def test_generic_webhook_client_error_is_not_retried(server: SlackServer, ledger: SharedLedger) -> None:
    """A 400 means the receiver rejected the payload: no retry, logged undelivered with its content."""
    config = _config(server, slack_bot_token=None, slack_channel=None, webhook_url=server.generic_url)
    server.fail_next(1, 400)
    with capture_logs() as logs:
        alerter = _alerter(config, ledger)
        alerter.notify(detected("g1"))
        alerter.close(10)
    assert server.requests.count(server.generic_path) == 1
    [u] = _events(logs, "alert_undelivered")
    assert "HTTP 400" in u["error"] and "orders_consumer" in u["content"]


def test_log_sink_alone_logs_every_field(ledger: SharedLedger) -> None:
    """Without Slack or a webhook every group is still one duplicate_detected event with every field."""
    e = detected("g1")
    with capture_logs() as logs:
        alerter = build_alerter(Config.of(cluster_name="prod-eu", airflow_ui_url=UI), ledger, Metrics())
        alerter.notify(e)
        alerter.notify(outcome(e, Result.FAILED, "boom"))
        alerter.close(1)
    [d] = _events(logs, "duplicate_detected")
    assert d["dag_id"] == "orders_consumer" and d["group_key"] == "g1" and d["confidence"] == "confirmed"
    assert d["kept_run"] == e.finding.kept.run_id and d["duplicate_runs"] == [e.finding.duplicates[0].run_id]
    assert d["creating_job_ids"] == [11, 12] and d["creator_hostnames"] == ["scheduler-0", "scheduler-1"]
    assert d["shared_event_ids"] == [10] and d["assets"] == ["s3://lake/orders"] and d["cluster"] == "prod-eu"
    assert d["remediation_mode"] == "fail" and d["detected_at"].startswith("2026-03-12T11:35:10")
    assert d["runs"][1]["url"].startswith(UI + "/dags/orders_consumer/runs/")
    [o] = _events(logs, "remediation_outcome")
    assert o["status"] == "failed" and o["results"][0]["detail"] == "boom" and o["log_level"] == "error"


def test_first_alert_already_carrying_results_shows_them(server: SlackServer, ledger: SharedLedger) -> None:
    """The daemon remediates before alerting: a DETECTED event with results is one message showing the outcome,
    and both duplicate_detected and remediation_outcome are logged."""
    e = outcome(detected("g1"), Result.DONE)
    e = replace(e, kind=AlertKind.DETECTED)
    with capture_logs() as logs:
        alerter = _alerter(_config(server), ledger)
        alerter.notify(e)
        alerter.close(10)
    [message] = server.top_level()
    assert "duplicate stopped" in json.dumps(message.blocks) and message.updates == []
    assert server.replies(message.ts) == []
    assert [x["event"] for x in logs if x["event"] in {"duplicate_detected", "remediation_outcome"}] == [
        "duplicate_detected",
        "remediation_outcome",
    ]


# --- secrets --------------------------------------------------------------------------------------


def test_secrets_never_appear_in_logs(
    server: SlackServer, ledger: SharedLedger, caplog: pytest.LogCaptureFixture
) -> None:
    """Token, Slack webhook URL and JSON webhook URL appear in no log line, through retries, hangs and failures."""
    caplog.set_level(logging.DEBUG)
    secrets = [server.token, server.webhook_path, server.generic_path, "secretpath", "routing-key-secret"]
    bot = _config(server, webhook_url=server.generic_url, slack_webhook_url=server.webhook_url)
    hook = _config(server, slack_bot_token=None, slack_channel=None, slack_webhook_url=server.webhook_url)
    with capture_logs() as logs:
        for config in (bot, hook):
            server.fail_next(1, 429, retry_after=0)
            server.fail_next(1, 500)
            server.hang_next(6, 30)
            alerter = _alerter(config, SharedLedger())
            e = detected("g1")
            alerter.notify(e)
            alerter.notify(outcome(e, Result.FAILED))
            alerter.close(30)
    structured = json.dumps(logs, default=str)
    stdlib = "\n".join(r.getMessage() for r in caplog.records)
    assert "alert_undelivered" in structured and "alerts_configured" in structured  # logs were captured
    for secret in secrets:
        assert secret not in structured and secret not in stdlib


# --- storms -------------------------------------------------------------------------


def _keys(payloads: list[dict[str, Any]], *types: str) -> list[str]:
    """Every group key the payloads of ``types`` carry (one per single, each group of a digest part)."""
    found = []
    for p in payloads:
        if p["type"] in types:
            found += [g["key"] for g in p["groups"]] if "groups" in p else [p["dedup_key"]]
    return found


def test_a_storm_is_digested_on_the_webhook_too_and_every_payload_is_counted(server: SlackServer) -> None:
    """3,000 groups in one commit, then (once their digest went out, as a remediation takes its time)
    their 3,000 outcomes, to Slack and to a JSON webhook whose receiver answers its first POST with a
    429 (Retry-After: 1). Outcomes are digested like the detections (bounded parts, not a POST per
    group), every group is in exactly one detection and one outcome payload, and
    dupguard_alerts_total{outcome="sent"} counts every message and payload that arrived."""
    hook = SlackServer()
    try:
        events = [detected(f"s{i}", base=10 * i) for i in range(3000)]
        metrics = Metrics()
        hook.fail_next(1, 429, retry_after=1)
        # a generous timeout: on a loaded machine a cut (and retried) 100-group POST would arrive twice
        config = _config(server, webhook_url=hook.generic_url, alert_timeout=timedelta(seconds=30))
        alerter = build_alerter(config, SharedLedger(), metrics, digest_delay=5)  # 3,000 notify calls in one
        began = time.monotonic()
        for e in events:
            alerter.notify(e)
        notifying = time.monotonic() - began  # on a loaded machine the calls can outlast one digest window
        assert hook.wait_for(lambda: any(p["type"] == "digest" for p in hook.generic_payloads), 120)
        for e in events:
            alerter.notify(outcome(e, Result.DONE))
        alerter.close(120)
        payloads = list(hook.generic_payloads)
    finally:
        hook.stop()
    every = sorted(e.finding.key for e in events)
    assert sorted(_keys(payloads, "detected", "digest")) == every
    assert sorted(_keys(payloads, "outcome", "digest_outcome")) == every
    assert [p["type"] for p in payloads].count("outcome") == 5  # the groups before the storm began
    assert len(payloads) < 100  # bounded parts (at most 100 groups each), never one per group
    assert hook.rejected == [] and server.rejected == []
    assert hook.requests.count(hook.generic_path) == len(payloads) + 1  # + the refused one, retried
    assert _count(metrics, "webhook", "sent") == len(payloads) and _count(metrics, "webhook", "failed") == 0
    assert _count(metrics, "webhook", "retried") == 1
    # Slack: five alerts, then one digest per digest window the 3,000 calls spanned (one, unless loaded)
    assert 1 <= len(server.top_level()) - 5 <= 1 + int(notifying // 5)
    assert _count(metrics, "slack", "sent") == len(server.messages) and _count(metrics, "slack", "failed") == 0


def test_a_new_leaders_pick_up_of_pending_stops_is_digested(server: SlackServer) -> None:
    """A new leader finishing 300 stops an earlier leader decided: their DETECTED alerts went out from
    that leader, so here only outcomes arrive, of groups this process never announced. Past the storm
    threshold they are gathered (one follow-up per digest delay), not one Slack message and one
    webhook POST per group as before."""
    hook = SlackServer()
    try:
        config = _config(server, webhook_url=hook.generic_url)  # storm threshold 5
        alerter = build_alerter(config, SharedLedger(), Metrics(), digest_delay=1)
        events = [outcome(detected(f"f{i}", base=10 * i), Result.DONE) for i in range(300)]
        for e in events:
            alerter.notify(e)
        alerter.close(60)
        payloads = list(hook.generic_payloads)
    finally:
        hook.stop()
    assert sorted(_keys(payloads, "outcome", "digest_outcome")) == sorted(e.finding.key for e in events)
    assert [p["type"] for p in payloads].count("outcome") == 5  # before the storm threshold was passed
    assert len(payloads) <= 5 + 3  # + 295 gathered outcomes, in parts of at most 100
    assert len(server.top_level()) <= 5 + 1


def test_each_undelivered_digest_part_is_counted_and_logged_with_its_own_groups(server: SlackServer) -> None:
    """A digest of 250 groups goes out in three parts; the receiver refuses the first (HTTP 400): the
    other two are still sent, and the refused part is one alert_undelivered line naming its 100
    groups, counted failed once, while sent counts the two parts that arrived."""
    config = _config(server, slack_bot_token=None, slack_channel=None, webhook_url=server.generic_url)
    metrics = Metrics()
    server.fail_next(1, 400)
    with capture_logs() as logs:
        alerter = build_alerter(replace(config, alert_storm_threshold=0), SharedLedger(), metrics, digest_delay=30)
        for i in range(250):  # one digest: close() sends it at once
            alerter.notify(detected(f"p{i:03d}", base=10 * i))
        alerter.close(60)
    parts = server.generic_payloads
    assert [(p["part"], p["count"]) for p in parts] == [(2, 100), (3, 50)]
    [undelivered] = _events(logs, "alert_undelivered")
    assert undelivered["alert"] == "digest" and "HTTP 400" in undelivered["error"]
    assert undelivered["group_keys"] == [f"p{i:03d}" for i in range(100)]
    assert _count(metrics, "webhook", "sent") == 2 and _count(metrics, "webhook", "failed") == 1
