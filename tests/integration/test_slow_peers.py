"""A peer that trickles its answer one byte a second (``tests.trickle``) trips no per-read
timeout; every outbound call has a whole-request deadline instead (``detector.deadline``), and an
overrun is counted (``dupguard_deadline_exceeded_total``), logged and, for alerts, shown in health.

Against the local Slack stand-in (``tests.slack_server``), whose trickled answers last ten minutes:
each wait below is for an event, with a limit far below that and far above the deadline."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from detector.airflowapi.client import Transient, make_client
from detector.airflowapi.session import Session
from detector.airflowapi.tokens import Budget, TokenSource
from detector.app.wiring import build_alerter
from detector.config import Config
from detector.metrics import Metrics
from tests.airflow_server import CountingProxy
from tests.alertmanager import Receiver, alertmanager, route_config
from tests.daemon_harness import wait_for
from tests.integration.test_alerts import SharedLedger, _alerter, _config, _count, _events, detected
from tests.slack_server import SlackServer

LIMIT = 90.0  # seconds an event may take here (the deadlines are 1.5-3 s, a trickle lasts 10 min)
# Each timeout is three times the trickle's pace (a byte a second), so no per-read timeout can fire.
TIMEOUT = timedelta(seconds=3)


@pytest.fixture
def server() -> Iterator[SlackServer]:
    s = SlackServer()
    yield s
    s.stop()


def _deadlines(peer: str) -> float:
    # the process's counts (detector.deadline), read through a registry
    return Metrics().registry.get_sample_value("dupguard_deadline_exceeded_total", {"peer": peer}) or 0.0


@pytest.mark.parametrize("transport", ["bot", "slack_webhook", "webhook"])
def test_a_trickling_receiver_is_cut_at_the_deadline_and_the_next_alert_goes_out(
    server: SlackServer, transport: str
) -> None:
    """Every attempt (first try and two retries) trickled: each is cut after --alert-timeout (3 s),
    the alert is logged undelivered naming the deadline, counted failed, shown in the alerter's
    health note (kept after later alerts went out), and the next alert is delivered at once instead of
    queueing behind it."""
    overrides = {
        "bot": {},
        "slack_webhook": {"slack_bot_token": None, "slack_channel": None, "slack_webhook_url": server.webhook_url},
        "webhook": {"slack_bot_token": None, "slack_channel": None, "webhook_url": server.generic_url},
    }[transport]
    channel = "webhook" if transport == "webhook" else "slack"
    peer = "webhook" if transport == "webhook" else "slack"
    before = _deadlines(peer)
    metrics = Metrics()
    server.trickle_next(3)
    with capture_logs() as logs:
        alerter = _alerter(_config(server, alert_timeout=TIMEOUT, **overrides), SharedLedger(), metrics)
        alerter.notify(detected("g1"))
        assert server.wait_for(lambda: server.trickled == 3, LIMIT), "each trickled attempt cut"
        assert server.wait_for(lambda: _count(metrics, channel, "failed") == 1, LIMIT)
        trouble = alerter.trouble()
        alerter.notify(detected("g2", base=20))
        alerter.close(LIMIT)
    [undelivered] = _events(logs, "alert_undelivered")
    assert undelivered["group_keys"] == ["g1"] and "no complete answer within 3 s" in undelivered["error"]
    assert trouble is not None and channel in trouble and "no complete answer within 3 s" in trouble
    assert _count(metrics, channel, "sent") == 1  # g2
    assert trouble.startswith(f"{channel}: 1 in the last 15 min (latest: ") and alerter.trouble() == trouble
    assert _deadlines(peer) - before == 3


def test_an_airflow_api_call_and_the_token_request_end_at_their_deadline(server: SlackServer) -> None:
    """The Airflow client (urllib3) against a trickling server: a call and a token request each raise
    Transient naming the deadline instead of reading for ten minutes; a caller's shorter deadline wins."""
    config = Config.of(airflow_api_url=server.base, airflow_token="static", airflow_timeout=TIMEOUT)
    session = Session.from_config(config)
    before = _deadlines("airflow_api"), _deadlines("airflow_token")
    server.trickle_next(2)
    errors: list[str] = []

    def calls() -> None:
        for deadline in (None, 1.5):
            try:
                session.request("POST", "/api/chat.postMessage", needs="nothing", deadline=deadline)
            except Transient as exc:
                errors.append(str(exc))

    worker = threading.Thread(target=calls, daemon=True)
    worker.start()
    worker.join(LIMIT)
    assert not worker.is_alive(), "the calls were still reading"
    assert errors == [
        "POST /api/chat.postMessage: timed out: no complete answer within 3 s (--airflow-timeout)",
        "POST /api/chat.postMessage: timed out: no complete answer within 1.5 s (--airflow-timeout)",
    ]
    tokens = TokenSource(make_client(config), server.base, username="u", password="p", static_token=None, timeout=3.0)
    server.trickle_next(1)
    failed: list[str] = []
    worker = threading.Thread(target=lambda: _fetch(tokens, failed), daemon=True)
    worker.start()
    worker.join(LIMIT)
    assert not worker.is_alive(), "the token request was still reading"
    assert failed == [f"POST {server.base}/auth/token: timed out: no complete answer within 3 s (--airflow-timeout)"]
    assert (_deadlines("airflow_api") - before[0], _deadlines("airflow_token") - before[1]) == (2, 1)


def _fetch(tokens: TokenSource, failed: list[str]) -> None:
    try:
        tokens.get(Budget())
    except Transient as exc:
        failed.append(str(exc))


def test_a_trickling_alertmanager_member_is_cut_at_the_deadline_and_counted() -> None:
    """An HA pair of a real Alertmanager: member 1 is reached through a proxy that forwards each push
    and trickles Alertmanager's answer back. Each of its three attempts is cut at --alert-timeout (3 s),
    counted in dupguard_deadline_exceeded_total{peer="alertmanager-1"} (a series from the start, like
    the other peers': it was never exported), logged undelivered naming the deadline and named in the
    alerter's health note; member 2 gets the alert meanwhile, and once member 1 answers again the
    next alert reaches it."""
    receiver = Receiver()
    metrics = Metrics()
    try:
        with alertmanager(route_config(receiver.url)) as am, CountingProxy(int(am.url.rsplit(":", 1)[1])) as proxy:
            config = Config.of(
                alertmanager_urls=(proxy.url, am.url),
                alert_timeout=TIMEOUT,
                alertmanager_resend_interval=timedelta(hours=1),  # no re-send within the test
            )
            with capture_logs() as logs:
                alerter = build_alerter(config, SharedLedger(), metrics, digest_delay=0.3)
                metrics.init_alerts(alerter.channel_names)  # as the daemon's wiring does
                before = metrics.registry.get_sample_value(
                    "dupguard_deadline_exceeded_total", {"peer": "alertmanager-1"}
                )
                proxy.trickle.add("/api/v2/alerts")
                alerter.notify(detected("g1"))
                wait_for(lambda: _count(metrics, "alertmanager-1", "failed") == 1, LIMIT, "member 1's attempts cut")
                trouble = alerter.trouble()
                proxy.trickle.clear()
                alerter.notify(detected("g2", base=20))
                alerter.close(LIMIT)
            after = metrics.registry.get_sample_value("dupguard_deadline_exceeded_total", {"peer": "alertmanager-1"})
            assert {a["labels"]["group_key"] for a in am.alerts()} == {"g1", "g2"}
    finally:
        receiver.stop()
    assert before is not None and after is not None and after - before == 3
    assert _count(metrics, "alertmanager-2", "sent") == 2 and _count(metrics, "alertmanager-2", "failed") == 0
    assert _count(metrics, "alertmanager-1", "sent") == 1 and _count(metrics, "alertmanager-1", "retried") == 2
    [undelivered] = _events(logs, "alert_undelivered")
    assert undelivered["channel"] == "alertmanager-1" and undelivered["group_keys"] == ["g1"]
    assert "no complete answer within 3 s" in undelivered["error"]
    assert trouble is not None and trouble.startswith("alertmanager-1: 1 in the last 15 min (latest: ")
    assert "no complete answer within 3 s" in trouble
