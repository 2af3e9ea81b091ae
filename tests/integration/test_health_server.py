"""The health server of a real `dupguard run` process answers a scrape storm and never
prints a traceback for clients that leave early."""

from __future__ import annotations

import socket
import struct
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_harness import wait_for
from tests.integration.test_run_process import free_port, metric, spawn
from tests.pg import Templates

pytestmark = pytest.mark.integration
STORM = 200


@pytest.fixture
def daemon(pg_templates: Templates, tmp_path: Path) -> Iterator[tuple[int, Path]]:
    port, log = free_port(), tmp_path / "health.log"
    p = spawn(pg_templates.clone("3.1.2"), log, DUPGUARD_HTTP_PORT=str(port))
    try:
        wait_for(lambda: metric(port, "dupguard_leader") == 1.0, what="leading")
        yield port, log
    finally:
        p.kill()
        p.wait(10)


def _get(port: int, path: str, results: list[int | str], start: threading.Barrier) -> None:
    start.wait()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            resp.read()
            results.append(int(resp.status))
    except OSError as exc:
        results.append(type(exc).__name__)


def test_scrape_storm_every_request_answered(daemon: tuple[int, Path]) -> None:
    """200 concurrent /metrics requests (and probes among them): every one answered 200."""
    port, _ = daemon
    results: list[int | str] = []
    start = threading.Barrier(STORM)
    paths = ["/metrics"] * (STORM - 20) + ["/livez", "/readyz"] * 10
    threads = [threading.Thread(target=_get, args=(port, p, results, start)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    failed = [r for r in results if r != 200]
    assert len(results) == STORM and not failed, failed


def test_clients_that_disconnect_leave_no_traceback(daemon: tuple[int, Path]) -> None:
    """Clients that send a request and reset the connection at once: no traceback, no non-JSON
    line on the daemon's output, and the server keeps answering."""
    port, log = daemon
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        s.close()
    for _ in range(20):  # half-sent requests, closed politely
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /metr")
        s.close()
    assert metric(port, "dupguard_leader") == 1.0  # still answering
    text = log.read_text()
    assert "Traceback" not in text
    assert all(line.startswith("{") for line in text.splitlines() if line.strip()), text[-2000:]
