"""`auto` takes a session lock only on a session proven pinned.

A session lock is safe only when every statement of the lock connection reaches one server session.
The old check compared the server's view of the client address and port with the local socket; on
one host (dupguard, a local PgBouncer and PostgreSQL side by side) an ephemeral port can coincide,
and a session lock then went through transaction pooling, where a second replica's statement lands
on the same server session and "takes" the lock too. Real PgBouncer on this host in each pool mode,
and a plain TCP proxy (which is pinned although the server sees the proxy's socket)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection

from detector.app.leader import LOCK_REFUSED, LOCK_UNAVAILABLE, AdvisoryLock
from detector.config import SETTINGS_BY_NAME
from detector.metadb import catalog, leader_lock
from detector.metadb.engine import make_engine, parse_url
from tests.pg import Templates
from tests.pgbouncer import pgbouncer
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration
LEASE = timedelta(seconds=3)
KEY = int(SETTINGS_BY_NAME["lock_key"].default)


def _lock(url: str, mode: str = "auto") -> AdvisoryLock:
    return AdvisoryLock(make_engine(parse_url(url), pool_size=1), KEY, mode=mode, lease=LEASE)


@pytest.fixture
def db_url(pg_templates: Templates) -> str:
    return pg_templates.clone("3.1.2")


@pytest.fixture
def coinciding_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server reports this very socket's address and port as its client's: what an ephemeral port
    that coincides on one host looks like to a check that compares them (the check before this fix)."""

    def own_endpoint(conn: Connection) -> tuple[str | None, int | None]:
        fd = conn.connection.dbapi_connection.fileno()  # type: ignore[union-attr]
        with socket.socket(fileno=socket.dup(fd)) as own:
            host, port = own.getsockname()[:2]
        return str(host), int(port)

    monkeypatch.setattr(leader_lock, "client_endpoint", own_endpoint, raising=False)


@pytest.mark.usefixtures("coinciding_address")
def test_coinciding_address_still_takes_the_transaction_lock_through_transaction_pooling(db_url: str) -> None:
    """With the address and port coinciding, `auto` through transaction pooling still takes the
    transaction lock, and a second contender never holds the lock at the same time. (Before the fix:
    the session lock, and the second contender's statement on the same server session also "held" it.)"""
    now = datetime.now(UTC)
    with pgbouncer(db_url, "transaction") as url:
        a, b = _lock(url), _lock(url)
        try:
            assert a.ensure(now) is True
            assert a.lock_kind == "transaction"
            for _ in range(5):
                assert a.ensure(now) is True
                assert b.ensure(now) is False
        finally:
            a.release()
            b.release()


@contextmanager
def busy_neighbour(url: str) -> Iterator[None]:
    """Another client's steady stream of short transactions through ``url`` meanwhile."""
    stop = threading.Event()
    engine = make_engine(parse_url(url), pool_size=1)

    def traffic() -> None:
        while not stop.is_set():
            with engine.connect() as conn:
                catalog.ping(conn)
                conn.commit()

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
        engine.dispose()


@pytest.mark.parametrize("pool_size", [1, 20])
@pytest.mark.usefixtures("coinciding_address")
def test_transaction_pooling_with_a_busy_neighbour_is_never_pinned(db_url: str, pool_size: int) -> None:
    """Small and large pools, another client's transactions in flight: `auto` always chooses the
    transaction lock and `session` refuses, at every one of 10 reconnects."""
    with pgbouncer(db_url, "transaction", pool_size=pool_size) as url, busy_neighbour(url):
        for _ in range(10):
            auto, session = _lock(url), _lock(url, mode="session")
            try:
                assert auto.ensure(datetime.now(UTC)) is True and auto.lock_kind == "transaction"
                auto.release()
                assert session.ensure(datetime.now(UTC)) is False
                assert session.problem is not None and session.problem.code == LOCK_REFUSED
            finally:
                auto.release()
                session.release()


@pytest.mark.usefixtures("coinciding_address")
def test_statement_pooling_never_gets_a_session_lock(db_url: str) -> None:
    """Statement pooling admits no transaction, so no lock can be held there: `auto` never leads and
    says why (PgBouncer's own words), `session` refuses."""
    with pgbouncer(db_url, "statement") as url:
        auto, session = _lock(url), _lock(url, mode="session")
        try:
            assert auto.ensure(datetime.now(UTC)) is False
            assert auto.problem is not None and auto.problem.code == LOCK_UNAVAILABLE
            assert "statement pooling" in auto.problem.reason
            assert session.ensure(datetime.now(UTC)) is False
            assert session.problem is not None and session.problem.code in (LOCK_REFUSED, LOCK_UNAVAILABLE)
        finally:
            auto.release()
            session.release()


@pytest.fixture(params=["session_pooling", "tcp_proxy", "direct"])
def pinned_url(request: pytest.FixtureRequest, db_url: str) -> Iterator[str]:
    if request.param == "session_pooling":
        with pgbouncer(db_url, "session") as url:
            yield url
    elif request.param == "tcp_proxy":
        upstream = parse_url(db_url)
        with TcpProxy(str(upstream.host), int(upstream.port or 5432)) as proxy:
            yield upstream.set(port=proxy.port).render_as_string(hide_password=False)
    else:
        yield db_url


def test_pinned_sessions_take_the_session_lock(pinned_url: str) -> None:
    """Session pooling, a plain TCP proxy and a direct connection pin the lock's session: `auto` and
    `session` take the session lock there, one holder at a time, handed over on release. (Before the
    fix the proxy and session pooling got the transaction lock and `session` refused them.)"""
    now = datetime.now(UTC)
    a, b = _lock(pinned_url), _lock(pinned_url, mode="session")
    try:
        assert a.ensure(now) is True and a.lock_kind == "session"
        for _ in range(3):
            assert a.ensure(now) is True
            assert b.ensure(now) is False
        a.release()
        assert b.ensure(now) is True and b.lock_kind == "session"
        assert a.ensure(now) is False
    finally:
        a.release()
        b.release()
