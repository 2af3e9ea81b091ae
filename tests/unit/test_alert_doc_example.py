"""docs/how-to/alerts.md's example payload is what dupguard sends for the runs it shows (once its
``dedup_key`` was not a key dupguard makes).

The example's runs go through the real detection (``find_duplicates``, which makes the group key) and
the real payload builder; every field the example shows must be what the code puts there. Fields the
example leaves out are not checked (the field table above it lists them all), and ``text`` is shown
only up to its first line.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from detector.actions.alerts.channels.webhook import webhook_payload
from detector.core.detect import find_duplicates
from detector.core.model import ASSET_TRIGGERED, Run
from detector.core.ports import AlertEvent, AlertKind

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "alerts.md"
UI_URL = "https://airflow.example"


def doc_example() -> dict[str, Any]:
    """The JSON block under "Example (`type: detected`):" in docs/how-to/alerts.md."""
    found = re.search(r"Example \(`type: detected`\):\s*```json\n(.*?)\n```", DOC.read_text(encoding="utf-8"), re.S)
    assert found, "docs/how-to/alerts.md has no detected example"
    return dict(json.loads(found.group(1)))


def _run(doc: dict[str, Any], dag_id: str) -> Run:
    return Run(
        id=doc["id"],
        dag_id=dag_id,
        run_id=doc["run_id"],
        run_type=ASSET_TRIGGERED,
        run_after=datetime.fromisoformat(doc["run_after"]),
        state=doc["state"],
        partition_key=doc["partition_key"],
        creating_job_id=doc["creating_job_id"],
        creator_hostname=doc["creator_hostname"],
        queued_at=datetime.fromisoformat(doc["queued_at"]),
    )


def payload_for(example: dict[str, Any]) -> dict[str, Any]:
    """What dupguard sends for the example's runs, events and assets."""
    group = example["group"]
    runs = [_run(r, group["dag_id"]) for r in (group["kept"], *group["duplicates"])]
    events = {r.id: frozenset(group["shared_event_ids"]) for r in runs}
    [finding] = find_duplicates(runs, events)
    event = AlertEvent(
        kind=AlertKind.DETECTED,
        finding=finding,
        detected_at=datetime.fromisoformat(group["detected_at"]),
        cluster=example["cluster"],
        mode=example["remediation"]["mode"],
        assets=tuple(group["assets"]),
    )
    return webhook_payload(event, UI_URL)


def differences(shown: Any, sent: Any, where: str = "") -> list[str]:
    """Where ``shown`` (the doc) says something other than ``sent`` (the code); keys the doc leaves out
    are not differences."""
    if isinstance(shown, dict) and isinstance(sent, dict):
        return [d for k, v in shown.items() for d in differences(v, sent.get(k, "<absent>"), f"{where}.{k}")]
    if isinstance(shown, list) and isinstance(sent, list) and len(shown) == len(sent):
        return [d for i, (a, b) in enumerate(zip(shown, sent, strict=True)) for d in differences(a, b, f"{where}[{i}]")]
    return [] if shown == sent else [f"{where}: doc {shown!r}, code {sent!r}"]


def test_detected_example_is_what_dupguard_sends() -> None:
    """Every field of the example, dedup_key and group key included, is the code's for those runs."""
    example = doc_example()
    sent = payload_for(example)
    text = example.pop("text")
    assert differences(example, sent) == []
    assert text == sent["text"].splitlines()[0] + "\n…"


def test_dedup_key_is_the_group_key_detection_makes() -> None:
    """The example's dedup_key is the group key, as detection makes it for an exact pair
    (``asset|<dag_id>|<run_after of the first run>``)."""
    example = doc_example()
    kept = example["group"]["kept"]
    assert example["dedup_key"] == example["group"]["key"] == f"asset|orders_consumer|{kept['run_after']}"
    assert payload_for(example)["dedup_key"] == example["dedup_key"]


def test_the_comparison_sees_a_wrong_field() -> None:
    """The check itself: a wrong value anywhere is a difference, a field the doc leaves out is not."""
    sent = {"a": 1, "b": {"c": [1, 2]}, "extra": True}
    assert differences({"a": 1, "b": {"c": [1, 2]}}, sent) == []
    assert differences({"a": 1, "b": {"c": [1, 3]}}, sent) == [".b.c[1]: doc 3, code 2"]
    assert differences({"missing": 0}, sent) == [".missing: doc 0, code '<absent>'"]
