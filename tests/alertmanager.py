"""A real Alertmanager (Debian's ``prometheus-alertmanager``, with its ``amtool``) for the Alertmanager sink's
tests, and the webhook receiver its route notifies.

Each ``alertmanager()`` is a private instance on a free port with its own storage directory and
clustering off (``--cluster.listen-address=``), configured with the route the test gives: a test
sees exactly the notifications Alertmanager's dispatcher decided on. ``Receiver`` is a
``http.server`` on 127.0.0.1 that keeps every notification body (one per path, so routes to two
receivers can be told apart). Installed by scripts/alertmanager.sh when missing (CI's fresh
machine), the one install path for people and CI.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.daemon_harness import PATIENCE

BINARY = Path("/usr/bin/prometheus-alertmanager")
AMTOOL = Path("/usr/bin/amtool")
_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "alertmanager.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_installed() -> None:
    if not (BINARY.exists() and AMTOOL.exists()):
        subprocess.run([str(_SCRIPT)], check=True, capture_output=True, timeout=600)


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``condition`` until it returns something truthy (returned), else fail naming ``what``. A bound
    on liveness (times ``tests.daemon_harness.PATIENCE``)."""
    end = time.monotonic() + timeout * PATIENCE
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Receiver:
    """Every notification POSTed to it, by path, in arrival order."""

    def __init__(self) -> None:
        self.notifications: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver._lock:
                    receiver.notifications.append((self.path, body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def at(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [body for p, body in self.notifications if p == path]

    def alerts(self, path: str) -> list[dict[str, Any]]:
        """Every alert of every notification to ``path``, in order (an alert may come several times)."""
        return [alert for body in self.at(path) for alert in body["alerts"]]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def route_config(receiver_url: str, *, group_wait: str = "200ms", group_interval: str = "500ms") -> str:
    """Duplicate-run alerts grouped by DAG: critical ones to ``/pager``, the rest to ``/chat``; any
    other alert to a receiver that notifies nobody (so an alert that reaches a path went through the route)."""
    return f"""
route:
  receiver: nobody
  routes:
    - matchers: ['alertname=~"Dupguard.*"']
      receiver: chat
      group_by: [alertname, cluster, dag_id]
      group_wait: {group_wait}
      group_interval: {group_interval}
      repeat_interval: 1h
      routes:
        - matchers: ['severity="critical"']
          receiver: pager
receivers:
  - name: nobody
  - name: chat
    webhook_configs: [{{url: "{receiver_url}/chat", send_resolved: true}}]
  - name: pager
    webhook_configs: [{{url: "{receiver_url}/pager", send_resolved: true}}]
"""


@dataclass
class Alertmanager:
    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as resp:  # noqa: S310 - a local test server
            return json.loads(resp.read())

    def alerts(self, **labels: str) -> list[dict[str, Any]]:
        """Alertmanager's alerts (``/api/v2/alerts``: active, silenced and inhibited) with these labels."""
        return [a for a in self.get("/api/v2/alerts") if labels.items() <= a["labels"].items()]

    def amtool(self, *args: str) -> str:
        done = subprocess.run(
            [str(AMTOOL), f"--alertmanager.url={self.url}", *args], capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


@contextmanager
def alertmanager(config: str, *, web_config: str | None = None, scheme: str = "http") -> Iterator[Alertmanager]:
    """Start a private Alertmanager with ``config`` (YAML) and, with ``web_config``, its
    ``--web.config.file`` (TLS, basic auth); stop it afterwards."""
    ensure_installed()
    workdir = Path(tempfile.mkdtemp(prefix="dupguard-alertmanager-"))
    (workdir / "alertmanager.yml").write_text(config)
    port = free_port()
    command = [
        str(BINARY),
        f"--config.file={workdir / 'alertmanager.yml'}",
        f"--storage.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
        "--log.level=warn",
    ]
    if web_config is not None:
        (workdir / "web.yml").write_text(web_config)
        command.append(f"--web.config.file={workdir / 'web.yml'}")
    log = (workdir / "alertmanager.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    am = Alertmanager(f"{scheme}://127.0.0.1:{port}", proc, workdir)
    try:
        _wait_listening(port, proc, workdir)
        yield am
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], workdir: Path) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(
                f"alertmanager exited with {proc.returncode}: {(workdir / 'alertmanager.log').read_text()}"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("alertmanager did not listen within 30 s")


class ArrivalsProxy:
    """Forwards every POST to a real Alertmanager and keeps each request's arrival time: Alertmanager
    0.25 counts the alerts it receives, not the requests, and a storm's bound is on requests."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.arrivals: list[float] = []  # time.monotonic() of each request
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                with proxy._lock:
                    proxy.arrivals.append(time.monotonic())
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
                to = proxy.target + self.path
                request = urllib.request.Request(to, data=body, headers=headers, method="POST")  # noqa: S310 - local
                try:
                    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - a local test server
                        status, answer = resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    status, answer = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def times(self) -> list[float]:
        with self._lock:
            return list(self.arrivals)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
