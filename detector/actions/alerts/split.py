"""What a split-partition alert says (apache/airflow#71070): Slack message, webhook payload, log fields.

Pure: a ``SplitPartition`` in, data out. A split is not a duplicate group (there may be no run
at all), so it has its own message and webhook ``type`` ``split_partition`` in the same
``dupguard.alert/v1`` envelope (``schema``, ``type``, ``severity``, ``summary``, ``dedup_key``,
``cluster``, ``text``), with a ``split`` object instead of ``group``. Nothing is remediated.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from detector.actions.alerts.format import (
    SCHEMA,
    SUMMARY_LIMIT,
    TEXT_LIMIT,
    Message,
    clip,
    escape,
)
from detector.core.split import SplitPartition, split_dict

_ADVICE = (
    "Airflow wrote this partition key's asset events into two asset_partition_dag_run rows "
    "(apache/airflow#71070): a consumer that needs both waits for ever, one that needs either runs twice. "
    "dupguard changes nothing; check whether the DAG must be triggered for this key by hand."
)


@dataclass(frozen=True)
class SplitNotice:
    """One split, ready for every channel: the dispatcher claims ``key`` once per channel and sends."""

    key: str
    text: str
    message: Message
    payload: dict[str, Any]
    log_fields: dict[str, Any]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _title(split: SplitPartition, cluster: str) -> str:
    state = "waits for ever" if split.waiting else "has an orphaned pending row"
    return f"Split partition key {split.partition_key} of DAG {split.dag_id} on {cluster}: {state}"


def _row_line(split: SplitPartition, index: int) -> str:
    r = split.rows[index]
    made = "pending" if r.pending else f"made dag_run id {r.created_dag_run_id}"
    events = ", ".join(map(str, r.event_ids)) or "none"
    return f"row {r.id}: created {_iso(r.created_at)} ({r.age_seconds:.0f} s ago), {made}, asset events {events}"


def split_text(split: SplitPartition, cluster: str, detected_at: datetime) -> str:
    lines = [
        _title(split, cluster),
        f"{split.key}: split since {_iso(split.split_at)}, detected {_iso(detected_at)}",
        *(_row_line(split, i) for i in range(len(split.rows))),
        _ADVICE,
    ]
    return "\n".join(lines)


def split_log_fields(split: SplitPartition, cluster: str, detected_at: datetime) -> dict[str, Any]:
    fields = split_dict(split)
    fields["group_key"] = fields.pop("key")
    return fields | {"detected_at": _iso(detected_at), "cluster": cluster}


def split_notice(split: SplitPartition, cluster: str, detected_at: datetime) -> SplitNotice:
    text = split_text(split, cluster, detected_at)
    title = _title(split, cluster)
    blocks = (
        {"type": "header", "text": {"type": "plain_text", "text": clip(":jigsaw: " + title, 150), "emoji": True}},
        {
            "type": "section",
            "text": {
                "type": "mrkdwn",
                "text": clip(
                    escape("\n".join(_row_line(split, i) for i in range(len(split.rows)))) + "\n" + escape(_ADVICE),
                    3000,
                ),
            },
        },
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": clip(escape(f"{split.key} · dupguard"), 3000)}],
        },
    )
    fields = split_log_fields(split, cluster, detected_at)
    payload = {
        "schema": SCHEMA,
        "type": split.kind,
        "severity": "error" if split.waiting else "warning",
        "summary": clip(title, SUMMARY_LIMIT),
        "dedup_key": split.key,
        "cluster": cluster,
        "split": {k: v for k, v in fields.items() if k not in ("group_key", "cluster")} | {"key": split.key},
        "text": text,
    }
    return SplitNotice(
        key=split.key,
        text=text,
        message=Message(text=escape(clip(text, TEXT_LIMIT)), blocks=blocks),
        payload=payload,
        log_fields=fields,
    )
