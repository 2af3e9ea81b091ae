"""structlog set-up: JSON with Airflow 3's top-level keys (timestamp, level, event, logger), or console.

The only module that touches global logging state.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO, cast

import structlog


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Route structlog and stdlib logging to stderr in ``fmt`` (json, console, or auto by TTY)."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
        if fmt == "console"
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[*shared, _add_logger_name, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


class _CurrentStderr:
    """Whatever ``sys.stderr`` is at write time. Binding the object at configure time would keep
    writing to a stream someone has since replaced and closed (test capture, an embedding host)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _add_logger_name(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event["logger"] = event.pop("logger_name", None) or event.get("logger") or "dupguard"
    return event


def get(name: str) -> Any:
    """A logger that reports ``name`` as its ``logger`` key.

    Lazy on purpose: modules call this at import, before ``configure`` runs; ``bind()`` would freeze
    whatever configuration was active then.
    """
    return structlog.get_logger(logger_name=name)
