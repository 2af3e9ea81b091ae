"""A local Slack stand-in on 127.0.0.1 for alert tests: the Web API methods dupguard calls and webhooks.

Serves ``POST /api/chat.postMessage`` and ``POST /api/chat.update`` (form or JSON bodies, ``Bearer``
token checked), a Slack incoming webhook at ``/services/...`` and a generic JSON webhook at
``/generic/...``. It validates what it receives as Slack would, and more strictly: ``text`` is
required next to ``blocks``, every block is checked against Slack's published Block Kit limits
(``tests/slack_limits.py``, which cites Slack's pages; a violation is answered as Slack answers it,
``invalid_blocks`` with the JSON pointer of each problem), a ``thread_ts`` must name a top-level
message it issued in that channel, and ``chat.update`` must target an existing message by channel
*id*. Everything accepted is recorded; everything rejected lands in ``rejected`` (tests assert it
stays empty).

Faults for the next K requests: ``fail_next(k, 429, retry_after=1)``, ``fail_next(k, 500)``,
``hang_next(k, seconds)`` (the request is held, then the connection dropped without an answer and
without recording anything, as if Slack never took it), ``trickle_next(k)`` (an answer written one
byte a second, ``tests.trickle``; recorded in ``trickled`` once the client cut it). ``stop()``
releases every hang and trickle.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from tests.slack_limits import block_problems, invalid_blocks, message_problems
from tests.trickle import http_answer, trickle

__all__ = ["Posted", "SlackServer", "block_problems"]


@dataclass
class Posted:
    ts: str
    channel: str  # the channel id
    text: str
    blocks: list[dict[str, Any]]
    thread_ts: str | None
    updates: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Fault:
    status: int | None = None  # answer with this status
    retry_after: int | str | None = None  # seconds, or an HTTP date
    hang: float | None = None  # hold the request this long, then drop it
    trickle: bool = False  # answer one byte a second (for ten minutes)


class SlackServer:
    """Start with ``SlackServer(token=...)``; ``api_url``, ``webhook_url`` and ``generic_url`` point at it."""

    def __init__(self, token: str = "xoxb-test-token", webhook_path: str = "/services/T000/B000/secretpath") -> None:  # noqa: S107
        self.token = token
        self.webhook_path = webhook_path
        self.generic_path = "/generic/routing-key-secret"
        self.messages: dict[str, Posted] = {}  # ts -> message (bot)
        self.webhook_messages: list[dict[str, Any]] = []
        self.generic_payloads: list[dict[str, Any]] = []
        self.rejected: list[tuple[str, str]] = []  # (path, reason)
        self.requests: list[str] = []  # every request's path, faults included
        self.request_times: list[float] = []  # time.monotonic() of each request's arrival
        self.hanging = 0  # requests currently held by a hang
        self.trickled = 0  # trickled answers the client gave up on (cut before their end)
        self._faults: list[Fault] = []
        self._ts = itertools.count(1)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._release = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="slack-server", daemon=True)
        self._thread.start()

    # -- addresses -------------------------------------------------------------------------------

    @property
    def base(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def api_url(self) -> str:
        return self.base + "/api"

    @property
    def webhook_url(self) -> str:
        return self.base + self.webhook_path

    @property
    def generic_url(self) -> str:
        return self.base + self.generic_path

    @staticmethod
    def channel_id(name: str) -> str:
        return name if name.startswith("C") else "C" + name.lstrip("#").upper().replace("-", "")[:10]

    # -- control ---------------------------------------------------------------------------------

    def fail_next(self, k: int, status: int, retry_after: int | str | None = None) -> None:
        with self._lock:
            self._faults += [Fault(status=status, retry_after=retry_after) for _ in range(k)]

    def hang_next(self, k: int, seconds: float) -> None:
        with self._lock:
            self._faults += [Fault(hang=seconds) for _ in range(k)]

    def trickle_next(self, k: int) -> None:
        with self._lock:
            self._faults += [Fault(trickle=True) for _ in range(k)]

    def stop(self) -> None:
        self._release.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 20.0) -> bool:
        """Wait until ``predicate()`` (evaluated under the server's lock) holds; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(min(left, 0.05))
            return True

    def top_level(self) -> list[Posted]:
        with self._lock:
            return [m for m in self.messages.values() if m.thread_ts is None]

    def replies(self, ts: str) -> list[Posted]:
        with self._lock:
            return [m for m in self.messages.values() if m.thread_ts == ts]

    # -- request handling ------------------------------------------------------------------------

    def _take_fault(self) -> Fault | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _record(self, fn: Callable[[], None]) -> None:
        with self._changed:
            fn()
            self._changed.notify_all()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

            def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = (json.dumps(body) if not isinstance(body, str) else body).encode()
                self.send_response(status)
                ctype = "application/json" if not isinstance(body, str) else "text/plain"
                self.send_header("Content-Type", ctype + "; charset=utf-8")
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                arrived = time.monotonic()
                server._record(lambda: (server.requests.append(self.path), server.request_times.append(arrived)))
                fault = server._take_fault()
                if fault and fault.hang is not None:
                    server._record(lambda: setattr(server, "hanging", server.hanging + 1))
                    server._release.wait(fault.hang)
                    server._record(lambda: setattr(server, "hanging", server.hanging - 1))
                    self.close_connection = True
                    return  # no answer at all: the client times out
                if fault and fault.trickle:
                    body = json.dumps({"ok": True, "ts": "1", "pad": "x" * 600}).encode()
                    answer = http_answer(200, body, {"Content-Type": "application/json"})
                    if not trickle(self.wfile, answer, server._release):
                        server._record(lambda: setattr(server, "trickled", server.trickled + 1))
                    self.close_connection = True
                    return
                if fault and fault.status is not None:
                    headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                    if fault.status == 429:
                        self._answer(429, {"ok": False, "error": "ratelimited"}, headers)
                    else:
                        self._answer(fault.status, "upstream trouble", headers)
                    return
                if self.path.startswith("/api/"):
                    self._api(self.path[len("/api/") :], raw)
                elif self.path == server.webhook_path:
                    self._webhook(raw)
                elif self.path == server.generic_path:
                    self._generic(raw)
                else:
                    self._answer(404, "no such endpoint")

            def _reject(self, status: int, reason: str, body: Any) -> None:
                server._record(lambda: server.rejected.append((self.path, reason)))
                self._answer(status, body)

            def _params(self, raw: bytes) -> dict[str, Any]:
                ctype = self.headers.get("Content-Type", "")
                if ctype.startswith("application/json"):
                    data: dict[str, Any] = json.loads(raw or b"{}")
                    return data
                params: dict[str, Any] = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                if isinstance(params.get("blocks"), str):
                    params["blocks"] = json.loads(params["blocks"])
                return params

            def _api(self, method: str, raw: bytes) -> None:
                if self.headers.get("Authorization") != f"Bearer {server.token}":
                    return self._reject(200, "invalid_auth", {"ok": False, "error": "invalid_auth"})
                p = self._params(raw)
                if method not in {"chat.postMessage", "chat.update"}:
                    return self._reject(200, "unknown_method", {"ok": False, "error": "unknown_method"})
                problems = message_problems(p)
                if problems:
                    return self._reject(200, "; ".join(problems), invalid_blocks(problems))
                channel = server.channel_id(str(p.get("channel", "")))
                if not p.get("channel"):
                    return self._reject(200, "channel_not_found", {"ok": False, "error": "channel_not_found"})
                with server._lock:
                    if method == "chat.postMessage":
                        thread = p.get("thread_ts")
                        parent = server.messages.get(thread) if thread else None
                        if thread and (parent is None or parent.channel != channel or parent.thread_ts is not None):
                            reason = "thread_ts names no top-level message of this channel"
                            server.rejected.append((self.path, reason))
                            error: dict[str, Any] = {"ok": False, "error": "thread_not_found"}
                        else:
                            ts = f"1700000000.{next(server._ts):06d}"
                            server.messages[ts] = Posted(ts, channel, p["text"], p.get("blocks", []), thread)
                            error = {"ok": True, "channel": channel, "ts": ts, "message": {"text": p["text"]}}
                    else:
                        target = server.messages.get(str(p.get("ts")))
                        if target is None or target.channel != p.get("channel"):
                            server.rejected.append((self.path, "update of an unknown message (or channel name)"))
                            error = {"ok": False, "error": "message_not_found"}
                        else:
                            target.updates.append({"text": p["text"], "blocks": p.get("blocks", [])})
                            error = {"ok": True, "channel": target.channel, "ts": target.ts}
                    server._changed.notify_all()
                self._answer(200, error)

            def _webhook(self, raw: bytes) -> None:
                p = json.loads(raw or b"{}")
                problems = message_problems(p)
                if problems:  # an incoming webhook answers 400 with the bare error name
                    return self._reject(400, "; ".join(problems), "invalid_blocks")
                server._record(lambda: server.webhook_messages.append(p))
                self._answer(200, "ok")

            def _generic(self, raw: bytes) -> None:
                p = json.loads(raw or b"{}")
                types = {"detected", "outcome", "digest", "digest_outcome", "split_partition", "trigger_flapping"}
                if p.get("schema") != "dupguard.alert/v1" or p.get("type") not in types:
                    return self._reject(400, "not a dupguard.alert/v1 payload", "bad payload")
                server._record(lambda: server.generic_payloads.append(p))
                self._answer(202, {"status": "accepted"})

        return Handler
