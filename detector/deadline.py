"""A whole-request deadline for blocking HTTP calls: from the connect to the answer's last byte.

The HTTP clients dupguard uses bound each socket operation, never the request: urllib3's
``Timeout(total=...)`` is the connect time plus *each* read ("the read and total timeouts only
measure the time between read operations", urllib3.util.timeout), and the ``timeout`` of
urllib.request and slack-sdk is the socket's. A peer that trickles one byte a second trips none of
them. None of these clients (nor requests or httpx, whose timeouts are per operation too) offers a
deadline over the whole request, so it is enforced around the call:

``with limit(seconds, peer):`` watches every connection the clients open or reuse inside it (they
are built with the classes below: ``bind_urllib3`` for the Airflow client's pool, ``opener`` for
urllib.request and, through ``install``, slack-sdk's clients). When the time is up a watchdog thread
shuts those sockets down (``shutdown``, not ``close``: it wakes a thread blocked in ``recv``), the
call fails, and ``limit`` raises ``DeadlineExceeded`` whatever the client made of the dead socket.
Each overrun is counted by ``peer`` (``exceeded``; ``dupguard_deadline_exceeded_total``).
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import io
import itertools
import socket
import ssl
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection as _U3Connection
from urllib3.connection import HTTPSConnection as _U3SConnection

_RECHECK = 0.05  # after the deadline: how often a socket still being connected is looked for
_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()


class DeadlineExceeded(TimeoutError):
    """No complete answer within the deadline (the connection was cut)."""


def exceeded() -> dict[str, int]:
    """Overruns since the process started, by peer."""
    with _counts_lock:
        return dict(_counts)


class _Scope:
    def __init__(self, seconds: float, peer: str) -> None:
        self.seconds, self.peer = seconds, peer
        self.conns: list[Any] = []  # connections (their ``sock`` may change: TLS wrap) and sockets
        self.expired = False
        self.open = True
        self.lock = threading.Lock()

    def watch(self, conn: Any) -> None:
        with self.lock:
            if all(c is not conn for c in self.conns):
                self.conns.append(conn)
            if self.expired:
                _cut(conn)

    def expire(self) -> bool:
        """Cut every watched connection; True while the scope is open (look again soon)."""
        with self.lock:
            if not self.open:
                return False
            self.expired = True
            for conn in self.conns:
                _cut(conn)
            return True


def _cut(conn: Any) -> None:
    sock = conn if isinstance(conn, socket.socket) else getattr(conn, "sock", None)
    if sock is None:
        return
    with contextlib.suppress(OSError):
        # the plain socket's shutdown: SSLSocket's own would drop its SSL object under a reading thread
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One thread for every deadline of the process (a heap of wake-up times)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Scope]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, when: float, scope: _Scope) -> None:
        with self._cond:
            heapq.heappush(self._heap, (when, next(self._seq), scope))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dupguard-deadline", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._cond.wait(None if not self._heap else self._heap[0][0] - time.monotonic())
                _, _, scope = heapq.heappop(self._heap)
            if scope.expire():
                self.arm(time.monotonic() + _RECHECK, scope)


_watchdog = _Watchdog()
_local = threading.local()


@contextlib.contextmanager
def limit(seconds: float, peer: str) -> Iterator[None]:
    """The block (one HTTP exchange) must end within ``seconds``, else ``DeadlineExceeded``."""
    scope = _Scope(seconds, peer)
    outer = getattr(_local, "scope", None)
    _local.scope = scope
    _watchdog.arm(time.monotonic() + seconds, scope)
    try:
        yield
    except Exception as exc:
        if _close(scope, outer):
            raise _exceeded(scope) from exc
        raise
    if _close(scope, outer):
        raise _exceeded(scope)  # a body cut short may have read as complete


def _close(scope: _Scope, outer: _Scope | None) -> bool:
    _local.scope = outer
    with scope.lock:
        scope.open = False
        return scope.expired


def _exceeded(scope: _Scope) -> DeadlineExceeded:
    with _counts_lock:
        _counts[scope.peer] += 1
    return DeadlineExceeded(f"timed out: no complete answer within {scope.seconds:g} s")


def watch(conn: Any) -> None:
    """Called by the connection classes below each time a request uses ``conn``."""
    scope = getattr(_local, "scope", None)
    if scope is not None:
        scope.watch(conn)


# --- urllib3 (the Airflow client) ------------------------------------------------------------------


class _U3Watched(_U3Connection):
    def connect(self) -> None:
        watch(self)
        super().connect()

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch(self)  # also a kept-alive connection, reused without a connect
        super().request(*args, **kwargs)


class _U3SWatched(_U3SConnection):
    def connect(self) -> None:
        watch(self)
        super().connect()

    def request(self, *args: Any, **kwargs: Any) -> None:
        watch(self)
        super().request(*args, **kwargs)


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _U3Watched


class _SPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _U3SWatched


def bind_urllib3(pool_manager: urllib3.PoolManager) -> None:
    """Make ``pool_manager``'s connections visible to ``limit`` (before its first request)."""
    pool_manager.pool_classes_by_scheme = {"http": _Pool, "https": _SPool}


# --- urllib.request (the JSON webhook, slack-sdk) --------------------------------------------------


class _Watched(http.client.HTTPConnection):
    def connect(self) -> None:
        watch(self)  # before the TLS handshake (HTTPS below), which a trickling peer can stretch too
        super().connect()
        watch(self.sock)  # urllib drops ``self.sock`` once the headers are in; the body still comes through it


class _SWatched(_Watched, http.client.HTTPSConnection):
    pass


def _bounded(open_: Any, req: urllib.request.Request, peer: str) -> http.client.HTTPResponse:
    """``open_(req)`` and the whole body read within the request's timeout; the body is then
    served from memory (urllib opens one connection per request, so nothing is kept alive)."""
    seconds = req.timeout  # set by OpenerDirector.open
    if not isinstance(seconds, int | float):
        return open_(req)  # type: ignore[no-any-return]  # no timeout asked for: no deadline either
    with limit(float(seconds), peer):
        resp: http.client.HTTPResponse = open_(req)
        body = resp.read()
    resp.fp = io.BufferedReader(io.BytesIO(body))
    resp.length, resp.chunked = len(body), False
    return resp


class _Handler(urllib.request.HTTPHandler):
    def __init__(self, peer: str) -> None:
        super().__init__()
        self.peer = peer

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return _bounded(lambda r: self.do_open(_Watched, r), req, self.peer)


class _SHandler(urllib.request.HTTPSHandler):
    def __init__(self, peer: str, context: ssl.SSLContext | None = None) -> None:
        super().__init__(context=context)
        self.peer = peer

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        context = self._context  # type: ignore[attr-defined]
        return _bounded(lambda r: self.do_open(_SWatched, r, context=context), req, self.peer)


def opener(peer: str, context: ssl.SSLContext | None = None) -> urllib.request.OpenerDirector:
    """urllib's default opener (proxies from the environment, redirects, errors as ``HTTPError``)
    whose every request with a timeout has that timeout as its whole-request deadline; ``context``:
    the TLS settings of HTTPS requests (None: the system's CAs, verified)."""
    return urllib.request.build_opener(_Handler(peer), _SHandler(peer, context))


def install(peer: str) -> None:
    """``opener(peer)`` for ``urllib.request.urlopen`` itself: slack-sdk's clients call it without an
    opener of their own (``urlopen(req, context=None, timeout=...)``) and take no connection class."""
    urllib.request.install_opener(opener(peer))
