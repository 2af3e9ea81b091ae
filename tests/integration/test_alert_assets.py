"""Alerts name the assets of the duplicated trigger: the daemon reads them from Airflow's
``asset`` table through the events the group's runs consumed, so the webhook's ``assets`` and Slack's
"Asset(s)" line are filled. Real daemons on the Airflow-made fixture of every supported version; the
events they produced are delivered by the real alerter to a local Slack-compatible server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from detector.app.ledger import MemoryLedger
from detector.app.wiring import build_alerter
from detector.config import Config
from detector.core.ports import AlertEvent
from detector.metrics import Metrics
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates
from tests.slack_server import SlackServer

pytestmark = pytest.mark.integration

LONG_AGO = timedelta(days=3650)  # the look-back reaches the Airflow-made scenario's runs
ORDERS = "orders (s3://warehouse/orders)"  # asset name, and its URI where it differs
CASES = [  # version, scenario, what the alert names
    ("3.0.6", "race_asset", ORDERS),
    ("3.1.2", "race_asset", ORDERS),
    ("3.2.2", "race_partitioned", "hourly_sales"),
    # 3.3.2 makes no race duplicate; its split partition key runs the OR consumer twice, once per asset
    ("3.3.2", "split_or", "sales_eu, sales_us"),
]


@pytest.fixture
def server() -> Iterator[SlackServer]:
    s = SlackServer()
    yield s
    s.stop()


def _deliver(server: SlackServer, event: AlertEvent) -> tuple[dict[str, Any], str]:
    """The real alerter sends ``event``: (the webhook's payload, the Slack message as JSON text)."""
    settings: dict[str, Any] = {
        "slack_bot_token": server.token,
        "slack_channel": "#dup-alerts",
        "slack_api_url": server.api_url,
        "webhook_url": server.generic_url,
        "alert_timeout": timedelta(seconds=2),
    }
    alerter = build_alerter(Config.of(**settings), MemoryLedger(), Metrics(), digest_delay=0.3)
    alerter.notify(event)
    alerter.close(15)
    [payload] = server.generic_payloads
    [message] = server.top_level()
    return payload, json.dumps(message.__dict__, default=str)


@pytest.mark.parametrize(("version", "scenario", "asset"), CASES, ids=[c[0] for c in CASES])
def test_alerts_name_the_triggering_asset(
    version: str, scenario: str, asset: str, pg_templates: Templates, daemons: list[Running], server: SlackServer
) -> None:
    url = pg_templates.clone(version, scenario)
    d = start_daemon(url, durable=False, startup_lookback=LONG_AGO)
    daemons.append(d)
    wait_for(lambda: bool(d.alerter.detected()), what="the Airflow-made group")
    event = d.alerter.detected()[0]
    names = tuple(asset.split(", "))
    assert event.assets == names
    wait_for(lambda: bool(d.alerter.outcomes()), what="its outcome")
    assert d.alerter.outcomes()[0].assets == names  # the follow-up names it too
    payload, slack = _deliver(server, event)
    assert payload["group"]["assets"] == list(names)
    assert "Asset(s)" in slack and all(name in slack for name in names)
