"""A peer that trickles: an answer written one byte a second (per-read timeouts never fire).

Used by the local stand-ins (``tests.slack_server``, ``tests.airflow_server.CountingProxy``) and
``TricklingServer`` (tests/integration/test_sigterm.py)."""

from __future__ import annotations

import contextlib
import socket
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


class TricklingServer:
    """Accepts TCP connections, reads each request, then answers it one byte a second: every alert
    endpoint and the Airflow API at once, each call held until its client's own total deadline."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.recv(65536)  # the request (its head at least): then the answer starts, and never ends in time
            trickle(conn.makefile("wb", buffering=0), http_answer(200, b'{"ok": true}' + b" " * 200), self._stop)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self.sock.close()
        for conn in self.held:
            conn.close()
