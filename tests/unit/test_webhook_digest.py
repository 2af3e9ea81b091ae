"""A storm digest to the JSON webhook is split into bounded POSTs (it was one 2.5 MB POST for 3,000 groups)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from datetime import timedelta

from detector.actions.alerts.channels.webhook import DIGEST_MAX_BYTES, DIGEST_MAX_GROUPS, WebhookChannel
from detector.actions.alerts.json_webhook import JsonWebhook
from detector.core.model import Confidence, Finding, Kind
from detector.core.ports import AlertEvent, AlertKind
from tests.factories import T0, run
from tests.slack_server import SlackServer


def _event(i: int) -> AlertEvent:
    dag_id = f"consumer_{i:05d}_" + "x" * 200  # long ids, as Airflow allows (250)
    kept = replace(run(dag_id, id=2 * i + 1, job=7), creator_hostname="scheduler-0")
    dup = replace(run(dag_id, id=2 * i + 2, job=8), creator_hostname="scheduler-1")
    finding = Finding(
        key=f"g{i}", kind=Kind.ASSET, confidence=Confidence.CONFIRMED, dag_id=dag_id,
        kept=kept, duplicates=(dup,), shared_event_ids=(i,), run_after=T0,
    )  # fmt: skip
    return AlertEvent(
        kind=AlertKind.DETECTED, finding=finding, detected_at=T0 + timedelta(seconds=1),
        cluster="prod-eu", mode="fail", assets=("s3://bucket/orders",),
    )  # fmt: skip


def test_a_3000_group_digest_arrives_in_bounded_parts_with_every_group_once() -> None:
    """Through the real webhook client to the local receiver: every POST under the byte and group caps,
    parts numbered 1..n with the same total, and every group delivered exactly once."""
    events = [_event(i) for i in range(3000)]
    server = SlackServer()
    try:
        WebhookChannel(JsonWebhook(server.generic_url, timeout=5)).digest(events)
        received = list(server.generic_payloads)
    finally:
        server.stop()
    assert server.rejected == []
    assert len(received) > 1
    for p in received:
        assert p["type"] == "digest" and p["total"] == 3000 and p["parts"] == len(received)
        assert len(json.dumps(p).encode()) <= DIGEST_MAX_BYTES
        assert p["count"] == len(p["groups"]) <= DIGEST_MAX_GROUPS
    assert sorted(p["part"] for p in received) == list(range(1, len(received) + 1))
    keys = Counter(g["key"] for p in received for g in p["groups"])
    assert set(keys) == {f"g{i}" for i in range(3000)} and set(keys.values()) == {1}


def test_a_small_digest_is_one_part() -> None:
    server = SlackServer()
    try:
        WebhookChannel(JsonWebhook(server.generic_url, timeout=5)).digest([_event(i) for i in range(7)])
    finally:
        server.stop()
    [p] = server.generic_payloads
    assert (p["part"], p["parts"], p["total"], p["count"]) == (1, 1, 7, 7)
