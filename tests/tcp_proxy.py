"""A plain TCP proxy for tests: each client connection gets its own upstream connection, bytes copied
both ways unchanged (what a cloud SQL proxy, an SSH tunnel or a Kubernetes port-forward does).

The server sees the proxy's socket, never the client's; yet the client's session is pinned to one
server backend for its whole life. ``delay`` slows every forwarded chunk (a slow network or API);
``drop()`` resets every open connection (a network cut), leaving the listener up.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from types import TracebackType


class TcpProxy:
    def __init__(self, upstream_host: str, upstream_port: int, *, delay: float = 0.0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay = delay
        self.connections = 0  # client connections accepted so far
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tcp-proxy", daemon=True)

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            # close() alone does not wake the accept() blocked in _accept on Linux (the join below then
            # waited its whole 5 s); shutdown() does, with EINVAL.
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop()
        self._thread.join(5)

    def drop(self) -> None:
        """Reset every connection open now (both sides see the connection end)."""
        with self._lock:
            sockets, self._open = list(self._open), set()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                upstream = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections += 1
                self._open.update((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), name="tcp-proxy-pipe", daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                if self.delay:
                    time.sleep(self.delay)
                dst.sendall(chunk)
        except OSError:
            pass  # either side went away
        finally:
            for s in (src, dst):  # one side ending ends the pair, as a real proxy does
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._open.discard(src)
            src.close()  # each pipe closes the socket it reads: never a descriptor the other still uses
