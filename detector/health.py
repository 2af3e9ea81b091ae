"""The small HTTP server: ``/livez`` (the loop is alive; never asks the database), ``/readyz`` (database
reachable, configuration valid) and ``/metrics`` (Prometheus text format)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class HealthServer:
    def __init__(
        self,
        port: int,
        registry: CollectorRegistry,
        live: Callable[[], bool],
        ready: Callable[[], bool],
        host: str = "0.0.0.0",  # noqa: S104 - probes and scrapes come from the kubelet and Prometheus
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/livez": lambda: _probe(live()),
            "/readyz": lambda: _probe(ready()),
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._respond(send_body=True)

            def do_HEAD(self) -> None:  # probes and uptime checkers may send HEAD
                self._respond(send_body=False)

            def _respond(self, *, send_body: bool) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                status, ctype, body = route() if route else (404, "text/plain", b"not found\n")
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return None  # probes every few seconds would drown the logs

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="dupguard-http", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _probe(ok: bool) -> tuple[int, str, bytes]:
    return (200, "text/plain", b"ok\n") if ok else (503, "text/plain", b"not ok\n")
