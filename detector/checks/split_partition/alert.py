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

from detector.actions.alerts.oncall import NO_LINKS, Guidance, Links, guidance_section, icon, links_context
from detector.actions.alerts.text import (
    SCHEMA,
    SUMMARY_LIMIT,
    TEXT_LIMIT,
    Message,
    clip,
    context,
    escape,
    grid_url,
    header,
    section,
    slack_date,
)
from detector.checks.split_partition.rule import ADVICE, KIND, SplitPartition, row_line, split_dict

SPLIT_ALERT = "DupguardSplitPartition"  # its docs/runbooks.md anchor and Alertmanager alertname


@dataclass(frozen=True)
class SplitNotice:
    """One split, ready for every channel: the dispatcher claims ``key`` once per channel and sends."""

    key: str
    text: str
    payload: dict[str, Any]
    log_fields: dict[str, Any]
    split: SplitPartition
    cluster: str
    detected_at: datetime

    kind = KIND
    alertname = SPLIT_ALERT
    am_severity = "warning"  # HIGH or WARNING in Slack: someone must check, nothing is on fire

    def message(self, ui_url: str | None = None, links: Links | None = None) -> Message:
        """The Slack message, with the links each Slack channel has configured."""
        return split_message(self, ui_url, links or NO_LINKS)

    def am_fields(self) -> tuple[dict[str, str], dict[str, str]]:
        """Alertmanager's extra labels and annotations: the consumer waits, or a row is orphaned."""
        outcome = "waiting" if self.split.waiting else "orphaned_row"
        return {"dag_id": self.split.dag_id}, {"outcome": outcome, "partition_key": self.split.partition_key}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _title(split: SplitPartition, cluster: str) -> str:
    state = "waits for ever" if split.waiting else "has an orphaned pending row"
    return f"Split partition key {split.partition_key} of DAG {split.dag_id} on {cluster}: {state}"


def _guidance(split: SplitPartition, ui_url: str | None) -> Guidance:
    grid = grid_url(ui_url, split.dag_id)
    where = f" (<{grid}|DAG grid view>)" if grid and len(grid) <= 900 else ""
    dag, key = f"`{escape(clip(split.dag_id, 250))}`", f"`{escape(clip(split.partition_key, 250))}`"
    if split.waiting:
        todo = (
            f"Check{where} whether {dag} must be triggered for partition key {key} by hand; dupguard changes nothing."
        )
        return Guidance("HIGH", "the consumer waits for ever for this partition key", todo)
    todo = (
        f"Check{where} whether {dag} ran twice for partition key {key}; if it did, check the downstream effects "
        "of both runs. dupguard changes nothing."
    )
    return Guidance("WARNING", "an orphaned pending row: the consumer may run twice", todo)


def split_message(notice: SplitNotice, ui_url: str | None = None, links: Links = NO_LINKS) -> Message:
    """The Slack message of a split: severity and what to do first, the rows, then the runbook and links."""
    split = notice.split
    # ids, counts and dates only: nothing to escape (escaping would break the date tokens)
    rows = "\n".join(row_line(split, i, slack_date) for i in range(len(split.rows)))
    advice = _guidance(split, ui_url)
    since = f"Split since {slack_date(split.split_at)} · detected {slack_date(notice.detected_at)} · "
    blocks = (
        header(f"{icon(advice.level)} {advice.level}: {_title(split, notice.cluster)}"),
        guidance_section(advice),
        section(rows + "\n" + escape(ADVICE)),
        links_context(SPLIT_ALERT, links, ui_url, split.dag_id),
        context(since + escape(f"{split.key} · dupguard")),
    )
    return Message(text=escape(clip(f"{advice.headline}: {notice.text}", TEXT_LIMIT)), blocks=blocks)


def split_text(split: SplitPartition, cluster: str, detected_at: datetime) -> str:
    lines = [
        _title(split, cluster),
        f"{split.key}: split since {_iso(split.split_at)}, detected {_iso(detected_at)}",
        *(row_line(split, i) for i in range(len(split.rows))),
        ADVICE,
    ]
    return "\n".join(lines)


def split_log_fields(split: SplitPartition, cluster: str, detected_at: datetime) -> dict[str, Any]:
    fields = split_dict(split)
    fields["group_key"] = fields.pop("key")
    return fields | {"detected_at": _iso(detected_at), "cluster": cluster}


def split_notice(split: SplitPartition, cluster: str, detected_at: datetime) -> SplitNotice:
    text = split_text(split, cluster, detected_at)
    title = _title(split, cluster)
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
        payload=payload,
        log_fields=fields,
        split=split,
        cluster=cluster,
        detected_at=detected_at,
    )
