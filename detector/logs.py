"""structlog set-up: JSON with Airflow 3's top-level keys (timestamp, level, event, logger), or console.

The only module that touches global logging state. In JSON mode every line on stderr is one JSON
object, whoever logs it: dupguard's own structlog calls, and the standard library's ``logging`` of
every other library (SQLAlchemy, urllib3, slack-sdk, APScheduler) and Python warnings, through
structlog's ``ProcessorFormatter`` on the root logger's handler. Keys come in Airflow 3's order
(``timestamp``, ``level``, ``event``, ``logger``, then the event's own fields); an exception is a
structured ``exception`` field (type, message, frames, without local variables, which could hold
secrets) instead of a multi-line traceback. Both paths end in one writer (``_Stderr``): each record is
written whole, its newline included, under one lock shared by every logger and thread, so two records
never share a line (structlog's own ``PrintLogger`` wrote the line and its newline in two writes, under
a lock the standard library's handler did not take).
"""

from __future__ import annotations

import io
import logging
import sys
import threading
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog
from structlog.tracebacks import ExceptionDictTransformer

FIRST_KEYS = ("timestamp", "level", "event", "logger")


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Route structlog and stdlib logging to stderr in ``fmt`` (json, console, or auto by TTY)."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp")
    shared: list[Any] = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level, timestamper]
    tail: list[Any]
    if fmt == "console":
        console = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty(), exception_formatter=_printable_traceback)
        tail = [_printable_values, console]
    else:
        exceptions = structlog.processors.ExceptionRenderer(ExceptionDictTransformer(show_locals=False))
        tail = [exceptions, _airflow_key_order, structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=[*shared, _add_logger_name, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=_LineLogger,
        cache_logger_on_first_use=False,
    )
    _route_stdlib_logging(shared, tail, level)


def _route_stdlib_logging(shared: list[Any], tail: list[Any], level: str) -> None:
    """Other libraries' ``logging`` records through the same processors and renderer."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _add_record_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
    )
    handler = _LineHandler()
    handler.setFormatter(formatter)
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Libraries' INFO chatter (connection pools, HTTP retries) stays out unless dupguard logs less.
    root.setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))
    logging.captureWarnings(True)  # warnings.warn(...) becomes a JSON line too


_HANDLER_NAME = "dupguard"


class _Stderr:
    """Whatever ``sys.stderr`` is at write time (binding the object at configure time would keep writing to
    a stream someone has since replaced and closed: test capture, an embedding host), one whole line per
    write, under one lock for every logger and thread."""

    _lock = threading.Lock()

    @classmethod
    def write_line(cls, line: str) -> None:
        with cls._lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


class _LineLogger:
    """structlog's logger: the rendered record, written whole by ``_Stderr``."""

    def __init__(self, *args: Any) -> None:
        pass

    def msg(self, message: str) -> None:
        _Stderr.write_line(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


class _LineHandler(logging.Handler):
    """The standard library's records, formatted by structlog's ``ProcessorFormatter``, written by ``_Stderr``."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _Stderr.write_line(self.format(record))
        except Exception:  # noqa: BLE001 - as logging.StreamHandler: a failing write never raises into the caller
            self.handleError(record)


def _add_logger_name(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    event["logger"] = event.pop("logger_name", None) or event.get("logger") or "dupguard"
    return event


def _add_record_logger_name(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    record = event.get("_record")
    event["logger"] = record.name if isinstance(record, logging.LogRecord) else "root"
    return event


def _airflow_key_order(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """timestamp, level, event, logger first, as Airflow 3 writes its JSON logs."""
    ordered = {key: event.pop(key) for key in FIRST_KEYS if key in event}
    ordered.update(event)
    return ordered


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (``\\x1b``, ``\\n``, ``\\u202e``): a DAG or run id
    is whatever a DAG author wrote, and raw escape sequences in a terminal or spreadsheet can rewrite
    what the operator sees (clear the screen, hide a line, reverse text)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def _printable_values(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Console only: the renderer writes text values raw (others through ``repr``, which escapes);
    JSON escapes control characters itself. Tracebacks (``exc_info``) go to ``_printable_traceback``."""
    for key, value in event.items():
        if isinstance(value, str) and key != "exc_info":
            event[key] = printable(value)
    return event


def _printable_traceback(sio: TextIO, exc_info: Any) -> None:
    """The console's traceback: Python's plain one, each line escaped as values are (an exception's
    message may carry a DAG id), its line breaks kept. Never structlog's default where rich is
    installed (Airflow's own environment has it): that one prints every frame's local variables,
    which may hold secrets, and writes the message raw."""
    out = io.StringIO()
    structlog.dev.plain_traceback(out, exc_info)
    sio.write("\n".join(printable(line) for line in out.getvalue().split("\n")))


def get(name: str) -> Any:
    """A logger that reports ``name`` as its ``logger`` key.

    Lazy on purpose: modules call this at import, before ``configure`` runs; ``bind()`` would freeze
    whatever configuration was active then.
    """
    return structlog.get_logger(logger_name=name)
