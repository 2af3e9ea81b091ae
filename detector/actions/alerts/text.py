"""Text pieces every alert message is made of: cutting, Slack mrkdwn escaping, Airflow UI links, Slack
dates, the Slack ``Message`` and the limits and envelope name every channel's messages keep.

Pure, and imported by the message modules (``group_text``, ``slack_messages``, ``oncall``, ``notice``,
``split``, the channels), never the other way.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

# Slack's limits (https://api.slack.com/reference/block-kit/blocks)
HEADER_LIMIT = 150
SECTION_LIMIT = 3000  # also a context element's text
BLOCK_LIMIT = 50
TEXT_LIMIT = 3000  # the notification fallback; Slack accepts 40 000 but truncates much earlier on phones
SUMMARY_LIMIT = 1024  # PagerDuty's summary limit, a sane bound for any receiver
SCHEMA = "dupguard.alert/v1"  # the webhook payloads' envelope (docs/how-to/alerts.md)

# Slack shows the reader's own time zone; the fallback (old clients, notifications) is the ISO time.
# https://docs.slack.dev/messaging/formatting-message-text#date-formatting
_DATE_FORMAT = "{date_short_pretty} {time_secs}"


@dataclass(frozen=True)
class Message:
    """A Slack message: ``text`` is the fallback (notifications, screen readers), ``blocks`` the layout."""

    text: str
    blocks: tuple[dict[str, Any], ...]

    def as_kwargs(self) -> dict[str, Any]:
        return {"text": self.text, "blocks": list(self.blocks)}


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape(text: str) -> str:
    """Escape Slack mrkdwn control characters (https://api.slack.com/reference/surfaces/formatting)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _ui(ui_url: str) -> str:
    return ui_url.rstrip("/")


def run_url(ui_url: str | None, dag_id: str, run_id: str) -> str | None:
    """The Airflow 3 UI page of one run: ``{ui}/dags/{dag_id}/runs/{run_id}``, both path parts quoted."""
    if not ui_url:
        return None
    return f"{_ui(ui_url)}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def grid_url(ui_url: str | None, dag_id: str) -> str | None:
    """The DAG's page in the Airflow 3 UI, whose left panel is the grid view unless the reader chose the
    graph (airflow/ui/src/layouts/Details/DetailsLayout.tsx: ``default_dag_view`` "grid", 3.0 to 3.3)."""
    return f"{_ui(ui_url)}/dags/{quote(dag_id, safe='')}" if ui_url else None


def slack_date(value: datetime | None) -> str:
    """A Slack date token (``<!date^UNIX^format|fallback>``) whose fallback is the ISO time, to the microsecond."""
    if value is None:
        return "unknown"
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)  # Airflow stores UTC
    return f"<!date^{int(aware.timestamp())}^{_DATE_FORMAT}|{value.isoformat()}>"


def cut_mrkdwn(text: str, limit: int) -> str:
    """Cut escaped mrkdwn to ``limit`` without splitting an ``&amp;`` escape or a ``<url|label>`` link."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    amp, lt = cut.rfind("&"), cut.rfind("<")
    if amp > cut.rfind(";"):
        cut = cut[:amp]
    if lt > cut.rfind(">"):
        cut = cut[:lt]
    if cut.count("`") % 2:
        cut = cut[: cut.rfind("`")]
    return cut + "…"


def header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": clip(text, HEADER_LIMIT), "emoji": True}}


def section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": cut_mrkdwn(text, SECTION_LIMIT)}}


def context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": cut_mrkdwn(text, SECTION_LIMIT)}]}
