"""The small HTTP server: ``/livez`` (the loop is alive; never asks the database), ``/readyz`` (this
replica is up: leading and polling, or standing by behind a live leader — ``detector.app.status``; the
body names the state and why) and ``/metrics`` (Prometheus text format).

It must answer a scrape storm and shrug off clients that leave early: a thread per request (daemon
threads, so shutdown never waits for a slow client), a listen backlog far above the standard
library's 5 (a burst of connections beyond the backlog waits for SYN retransmits, seconds), and a
client that disconnected mid-response is a debug line, never a traceback on stderr.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from detector import logs

log = logs.get("dupguard.health")
_TEXT = "text/plain; charset=utf-8"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen() backlog; the kernel caps it at net.core.somaxconn

    def handle_error(self, request: Any, client_address: Any) -> None:
        """The standard library prints a traceback to stderr here; a client going away is routine."""
        exc = sys.exc_info()[1]
        log.debug("http_client_error", error=type(exc).__name__ if exc else None)


class HealthServer:
    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        live: Callable[[], bool],
        ready: Callable[[], tuple[bool, str]],
        host: str = "0.0.0.0",  # noqa: S104 - probes and scrapes come from the kubelet and Prometheus
    ) -> None:
        def readyz() -> tuple[int, str, bytes]:
            ok, detail = ready()
            return (200 if ok else 503), _TEXT, f"{'ok' if ok else 'not ok'}: {detail}\n".encode()

        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/livez": lambda: _probe(live()),
            "/readyz": readyz,
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
        }

        class Handler(BaseHTTPRequestHandler):
            timeout = 10  # a client that sends nothing does not hold a thread forever

            def do_GET(self) -> None:
                self._respond(send_body=True)

            def do_HEAD(self) -> None:  # probes and uptime checkers may send HEAD
                self._respond(send_body=False)

            def _respond(self, *, send_body: bool) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, ctype, body = route() if route else (404, _TEXT, b"not found\n")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None  # probes every few seconds would drown the logs

        self._server = _Server((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="dupguard-http", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _probe(ok: bool) -> tuple[int, str, bytes]:
    return (200, _TEXT, b"ok\n") if ok else (503, _TEXT, b"not ok\n")
