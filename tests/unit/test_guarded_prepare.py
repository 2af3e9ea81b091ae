"""The remediator's readiness and shutdown (benchmarks/results/mutation.md): ``prepare`` says why the
``api`` backend cannot act at once and publishes ``dupguard_remediation_ready{backend}``; ``close``
releases its HTTP connections. The real API client against local sockets: a static token needs no
request, a refused port and a server answering 503 give no token."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.metadb.engine import make_engine, parse_url
from detector.metadb.schema import Family, airflow_tables
from detector.metrics import Metrics

# Never connected to here: nothing in these tests reads the metadata database.
DB = "postgresql://dupguard@127.0.0.1:1/airflow"
ENGINE = make_engine(parse_url(DB))
TABLES = airflow_tables(Family.AIRFLOW_3_1)


def _remediator(**settings: Any) -> tuple[GuardedRemediator, Metrics]:
    metrics = Metrics()
    config = Config.of(database_url=DB, remediation="fail", remediation_backend="api", **settings)
    remediator = build_remediator(config, ENGINE, TABLES, metrics)
    assert isinstance(remediator, GuardedRemediator)
    return remediator, metrics


def _ready(metrics: Metrics, backend: str = "api") -> float | None:
    return metrics.registry.get_sample_value("dupguard_remediation_ready", {"backend": backend})


def test_a_static_token_is_ready_at_once() -> None:
    remediator, metrics = _remediator(airflow_api_url="http://127.0.0.1:1", airflow_token="a-token")
    try:
        assert remediator.prepare() is None
        assert _ready(metrics) == 1
    finally:
        remediator.close()


def test_no_token_from_a_refused_api_is_said_and_published() -> None:
    with socket.socket() as closed:  # a port bound, never listening: the connection is refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
        remediator, metrics = _remediator(airflow_api_url=url, airflow_username="u", airflow_password="p")
        try:
            problem = remediator.prepare()
        finally:
            remediator.close()
    refused = "connection refused or unreachable (is the API server up?)"
    assert problem == f"no token from the Airflow API: POST {url}/auth/token: {refused}"
    assert _ready(metrics) == 0


def test_backends_without_a_token_have_nothing_to_prepare() -> None:
    """The ``db`` backend and no backend at all (off, dry-run): ready, no gauge."""
    metrics = Metrics()
    for settings in ({"remediation": "fail", "remediation_backend": "db"}, {"remediation": "dry-run"}):
        remediator = build_remediator(Config.of(database_url=DB, **settings), ENGINE, TABLES, metrics)
        assert isinstance(remediator, GuardedRemediator)
        assert remediator.prepare() is None
        remediator.close()
    assert _ready(metrics, "db") is None and _ready(metrics, "none") is None


class _Unavailable:
    """An HTTP server answering 503 to everything, keeping each connection alive; counts the
    connections its clients closed (EOF)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(8)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.opened = 0
        self.closed = threading.Semaphore(0)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.opened += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                if b"\r\n\r\n" in data:
                    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
        self.closed.release()


@pytest.fixture
def unavailable() -> Iterator[_Unavailable]:
    server = _Unavailable()
    yield server
    server.listener.close()


def test_close_releases_the_api_connections(unavailable: _Unavailable) -> None:
    """After a request the connection stays pooled (keep-alive); ``close`` (at shutdown) closes it."""
    remediator, _ = _remediator(airflow_api_url=unavailable.url, airflow_username="u", airflow_password="p")
    assert remediator.prepare() == f"no token from the Airflow API: POST {unavailable.url}/auth/token: HTTP 503"
    assert unavailable.opened >= 1 and not unavailable.closed.acquire(blocking=False)
    remediator.close()
    for _ in range(unavailable.opened):
        assert unavailable.closed.acquire(timeout=30), "close() left an API connection open"
