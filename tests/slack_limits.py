"""Slack's published Block Kit limits, checked on every message the Slack stand-in receives.

From Slack's reference pages (read 2026-12-01):
- https://docs.slack.dev/reference/block-kit/blocks (a message holds at most 50 blocks; ``block_id`` ≤ 255)
- https://docs.slack.dev/reference/block-kit/blocks/header-block (``plain_text`` only, ≤ 150 characters)
- https://docs.slack.dev/reference/block-kit/blocks/section-block (text ≤ 3000; ``fields`` ≤ 10 items of ≤ 2000)
- https://docs.slack.dev/reference/block-kit/blocks/context-block (1 to 10 elements: images and text objects)
- https://docs.slack.dev/reference/block-kit/blocks/actions-block (≤ 25 elements)
- https://docs.slack.dev/reference/block-kit/block-elements/button-element (text ``plain_text`` ≤ 75, url ≤ 3000)
- https://docs.slack.dev/reference/block-kit/composition-objects/text-object (type ``plain_text`` or ``mrkdwn``,
  1 to 3000 characters; ``emoji`` only on ``plain_text``, ``verbatim`` only on ``mrkdwn``)
- https://docs.slack.dev/reference/methods/chat.postMessage (``text`` is the fallback of ``blocks``)

Each problem is worded like Slack's own ``invalid_blocks`` errors, ending with the JSON pointer of what
breaks the limit (``must be less than 151 characters [json-pointer:/blocks/0/text/text]``).
"""

from __future__ import annotations

from typing import Any

BLOCK_LIMIT, HEADER_LIMIT, TEXT_LIMIT, FIELD_LIMIT, FIELDS, CONTEXT_ELEMENTS = 50, 150, 3000, 2000, 10, 10
ACTIONS_ELEMENTS, BUTTON_TEXT_LIMIT, URL_LIMIT, ID_LIMIT = 25, 75, 3000, 255
BLOCK_TYPES = {"header", "section", "context", "divider", "actions", "image", "rich_text"}
TEXT_TYPES = {"plain_text", "mrkdwn"}


def _text(obj: Any, at: str, limit: int = TEXT_LIMIT, plain: bool = False) -> list[str]:
    """A text object: its type, flags and length."""
    if not isinstance(obj, dict):
        return [f"must be a text object [json-pointer:{at}]"]
    kind, text = obj.get("type"), obj.get("text")
    if kind not in TEXT_TYPES or (plain and kind != "plain_text"):
        wanted = "plain_text" if plain else "plain_text or mrkdwn"
        return [f"must be {wanted}, not {kind!r} [json-pointer:{at}/type]"]
    problems = []
    if "emoji" in obj and kind != "plain_text":
        problems.append(f"emoji is only allowed on plain_text [json-pointer:{at}/emoji]")
    if "verbatim" in obj and kind != "mrkdwn":
        problems.append(f"verbatim is only allowed on mrkdwn [json-pointer:{at}/verbatim]")
    if not isinstance(text, str) or not text:
        problems.append(f"must be more than 0 characters [json-pointer:{at}/text]")
    elif len(text) > limit:
        problems.append(f"must be less than {limit + 1} characters [json-pointer:{at}/text]")
    return problems


def _button(e: dict[str, Any], at: str) -> list[str]:
    problems = _text(e.get("text"), f"{at}/text", BUTTON_TEXT_LIMIT, plain=True)
    if "url" in e and not 0 < len(str(e["url"])) <= URL_LIMIT:
        problems.append(f"must be less than {URL_LIMIT + 1} characters [json-pointer:{at}/url]")
    if len(str(e.get("action_id", ""))) > ID_LIMIT:
        problems.append(f"must be less than {ID_LIMIT + 1} characters [json-pointer:{at}/action_id]")
    return problems


def _section(b: dict[str, Any], at: str) -> list[str]:
    if "text" not in b and not b.get("fields"):
        return [f"must provide text or fields [json-pointer:{at}]"]
    problems = _text(b["text"], f"{at}/text") if "text" in b else []
    fields = b.get("fields", [])
    if len(fields) > FIELDS:
        problems.append(f"must provide no more than {FIELDS} items [json-pointer:{at}/fields]")
    for j, f in enumerate(fields):
        problems += _text(f, f"{at}/fields/{j}", FIELD_LIMIT)
    accessory = b.get("accessory")
    if isinstance(accessory, dict) and accessory.get("type") == "button":
        problems += _button(accessory, f"{at}/accessory")
    return problems


def _elements(b: dict[str, Any], at: str, most: int, check: Any) -> list[str]:
    """A block of 1 to ``most`` elements, each checked by ``check`` (None: not checked)."""
    elements = b.get("elements", [])
    if not elements or len(elements) > most:
        return [f"must provide 1 to {most} items [json-pointer:{at}/elements]"]
    problems: list[str] = []
    for j, e in enumerate(elements):
        c = check(e) if isinstance(e, dict) else None
        if c is not None:
            problems += c(e, f"{at}/elements/{j}")
    return problems


def _context(b: dict[str, Any], at: str) -> list[str]:
    return _elements(b, at, CONTEXT_ELEMENTS, lambda e: None if e.get("type") == "image" else _text)


def _actions(b: dict[str, Any], at: str) -> list[str]:
    return _elements(b, at, ACTIONS_ELEMENTS, lambda e: _button if e.get("type") == "button" else None)


_CHECKS = {
    "header": lambda b, at: _text(b.get("text"), f"{at}/text", HEADER_LIMIT, plain=True),
    "section": _section,
    "context": _context,
    "actions": _actions,
}


def block_problems(blocks: Any) -> list[str]:
    """What Slack would answer ``invalid_blocks`` for in ``blocks`` (empty: Slack takes them)."""
    if not isinstance(blocks, list):
        return ["must be an array [json-pointer:/blocks]"]
    problems = []
    if len(blocks) > BLOCK_LIMIT:
        problems.append(f"must provide no more than {BLOCK_LIMIT} items [json-pointer:/blocks]")
    for i, b in enumerate(blocks):
        at = f"/blocks/{i}"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind not in BLOCK_TYPES:
            problems.append(f"unknown block type {kind!r} [json-pointer:{at}/type]")
            continue
        if len(str(b.get("block_id", ""))) > ID_LIMIT:
            problems.append(f"must be less than {ID_LIMIT + 1} characters [json-pointer:{at}/block_id]")
        check = _CHECKS.get(kind)
        if check is not None:
            problems += check(b, at)
    return problems


def message_problems(params: dict[str, Any]) -> list[str]:
    """A whole message: the ``text`` fallback is required next to blocks (dupguard's promise; Slack only
    warns ``missing_text_in_blocks`` then), and the blocks within the limits above."""
    if not params.get("text"):
        return ["no text fallback [json-pointer:/text]"]
    return block_problems(params["blocks"]) if "blocks" in params else []


def invalid_blocks(problems: list[str]) -> dict[str, Any]:
    """Slack Web API's answer to blocks it cannot take (HTTP 200, ``ok`` false)."""
    return {
        "ok": False,
        "error": "invalid_blocks",
        "errors": problems,
        "response_metadata": {"messages": [f"[ERROR] {p}" for p in problems]},
    }
