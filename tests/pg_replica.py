"""A real streaming replica (hot standby) of the test PostgreSQL, started by the test, stopped after.

``pg_basebackup -R`` copies the running test server (scripts/postgres.sh) and writes
``standby.signal`` and ``primary_conninfo``; the copy is started on a free port and streams the
primary's WAL, so a database created on the primary appears on the standby and ``pg_is_in_recovery()``
is true there. The test server's defaults allow it (``wal_level = replica``, ``max_wal_senders = 10``
and initdb's ``host replication all 127.0.0.1/32 trust``). PostgreSQL refuses to run as root: as root
(CI) the replica runs as the ``postgres`` OS user, like the primary.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg2
from sqlalchemy.engine import make_url

from tests.pg import admin_url
from tests.pgbouncer import _free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"{name} not found: run scripts/postgres.sh start (it installs postgresql-15)")
    return found[-1]


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


@dataclass(frozen=True)
class Replica:
    port: int
    primary_url: str
    log: Path  # the standby's server log (after the lines copied from the primary's)

    def url(self, primary_database_url: str) -> str:
        """The URL of the same database on the standby."""
        return make_url(primary_database_url).set(port=self.port).render_as_string(hide_password=False)

    def execute(self, statement: str) -> None:
        """Run ``statement`` on the standby, e.g. ``SELECT pg_wal_replay_pause()``."""
        with _connect(self.url(self.primary_url)) as standby:
            _scalar(standby, statement)

    def wait_caught_up(self, timeout: float = 120.0) -> None:
        """Until the standby has replayed everything the primary had written when this was called."""
        with _connect(self.primary_url) as primary:
            target = _scalar(primary, "SELECT pg_current_wal_lsn()")
        deadline = time.monotonic() + timeout
        with _connect(self.url(self.primary_url)) as standby:
            while time.monotonic() < deadline:
                if _scalar(standby, f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"):
                    return
                time.sleep(0.05)
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"the standby did not replay up to {target} within {timeout:g} s; its log ends:\n{tail}")


@contextmanager
def _connect(url: str) -> Iterator[psycopg2.extensions.connection]:
    conn = psycopg2.connect(url, connect_timeout=10)
    conn.autocommit = True
    try:
        yield conn
    finally:
        conn.close()


def _scalar(conn: psycopg2.extensions.connection, sql: str) -> object:
    with conn.cursor() as cur:
        cur.execute(sql)
        row = cur.fetchone()
    return None if row is None else row[0]


def _drop_slot(primary_url: str, slot: str) -> None:
    """Drop ``slot`` if it exists; its walsender (the stopped standby's) may not have noticed yet: ended."""
    where = f"FROM pg_replication_slots WHERE slot_name = '{slot}'"
    with _connect(primary_url) as primary:
        for _ in range(600):
            _scalar(primary, f"SELECT pg_terminate_backend(active_pid) {where} AND active_pid IS NOT NULL")
            try:
                _scalar(primary, f"SELECT pg_drop_replication_slot(slot_name) {where}")
                return
            except psycopg2.errors.ObjectInUse:  # the walsender had not exited yet
                time.sleep(0.1)
    # loud: a slot left behind keeps every WAL segment from its position on, until the disk is full
    raise RuntimeError(f"replication slot {slot} still in use after 60 s: drop it on the test server")


def _base_backup(
    host: str | None, port: int | None, user: str | None, data: Path, slot: str, primary_url: str, attempts: int = 3
) -> None:
    """``pg_basebackup -R`` into ``data``, tried again when it fails: the test server is shared, and a
    database another test drops while it is being copied fails the copy. Through a replication slot
    (``-C -S``, named in the standby's ``primary_slot_name``): without one, a primary that other tests
    keep writing to recycled the WAL the standby still needed before it had started ("requested WAL
    segment … has already been removed", never caught up)."""
    command = [_bin("pg_basebackup"), "-h", str(host), "-p", str(port), "-U", str(user), "-D", str(data)]
    command += ["-C", "-S", slot]
    for attempt in range(1, attempts + 1):
        _drop_slot(primary_url, slot)  # a failed attempt may have created it
        done = subprocess.run(
            # -c fast: the default spread checkpoint paces its writes over checkpoint_timeout x
            # completion_target (4.5 min) first; on a server the suite has filled with databases it
            # took that long and once ran into this timeout (CI of 2026-12-01)
            _as_postgres([*command, "-R", "-X", "stream", "-c", "fast", "--no-sync"]),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if done.returncode == 0:
            return
        for child in data.iterdir():  # pg_basebackup wants an empty folder
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        if attempt == attempts:
            _drop_slot(primary_url, slot)
            raise RuntimeError(f"pg_basebackup failed {attempts} times; last: {done.stderr.strip()[-2000:]}")


@contextmanager
def streaming_replica() -> Iterator[Replica]:
    """Start a hot standby of the test server on a free port; stop it and delete its data afterwards."""
    primary = make_url(admin_url())
    port = _free_port()
    data = Path(tempfile.mkdtemp(prefix="dupguard-replica-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres")
    data.chmod(0o700)
    slot = f"dupguard_test_{uuid.uuid4().hex[:12]}"
    primary_url = primary.render_as_string(hide_password=False)
    _base_backup(primary.host, primary.port, primary.username, data, slot, primary_url)
    # The copy carries the primary's port and socket folder: its own, given on the command line, win.
    options = f"-c port={port} -c unix_socket_directories={data} -c hot_standby=on"
    start = [_bin("pg_ctl"), "-D", str(data), "-l", str(data / "server.log"), "-o", options, "-w", "-t", "120"]
    try:
        subprocess.run(_as_postgres([*start, "start"]), check=True, capture_output=True, timeout=180)
        replica = Replica(port, primary.render_as_string(hide_password=False), data / "server.log")
        replica.wait_caught_up()
        yield replica
    finally:
        subprocess.run(_as_postgres([_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
        _drop_slot(primary_url, slot)  # a slot left behind would keep the primary's WAL forever
