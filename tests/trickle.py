"""A peer that trickles: an answer written one byte a second (per-read timeouts never fire).

Used by the local stand-ins (``tests.slack_server``, ``tests.airflow_server.CountingProxy``)."""

from __future__ import annotations

import threading
from typing import Any


def trickle(out: Any, data: bytes, stop: threading.Event, every: float = 1.0) -> bool:
    """Write ``data`` one byte per ``every`` seconds until done, ``stop`` is set or the client left;
    True if every byte went out."""
    for i in range(len(data)):
        try:
            out.write(data[i : i + 1])
            out.flush()
        except OSError:  # the client cut the connection (its deadline)
            return False
        if stop.wait(every):
            return False
    return True


def http_answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 answer as bytes (status line, headers, body)."""
    lines = [f"HTTP/1.1 {status} Trickled", f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
