"""The read-only SQLite engine (``scan``, ``run`` and ``demo`` on an Airflow SQLite file) serves every
thread of the daemon: a connection one thread made and gave back to the pool is used by another next
(the poll after a remediation worker or the preparer). sqlite3's default ``check_same_thread`` refused
that ("SQLite objects created in a thread can only be used in that same thread"): a ``poll_crashed``
seen under load in ``tests/unit/test_bad_input.py``'s ``run --once`` cases."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sqlalchemy import text

from detector.metadb.engine import make_engine, parse_url


def test_a_connection_made_in_one_thread_serves_another(tmp_path: Path) -> None:
    db = tmp_path / "airflow.db"
    sqlite3.connect(db).executescript("CREATE TABLE dag_run (id INTEGER PRIMARY KEY); INSERT INTO dag_run VALUES (7);")
    engine = make_engine(parse_url(f"sqlite:///{db}"), read_only=True)
    made: list[object] = []

    def elsewhere() -> None:
        with engine.connect() as conn:  # made in this thread, given back to the pool at the end
            made.append(conn.connection.dbapi_connection)

    try:
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        with engine.connect() as conn:  # this thread gets that very connection
            assert conn.connection.dbapi_connection is made[0]
            assert conn.execute(text("SELECT id FROM dag_run")).scalar_one() == 7
    finally:
        engine.dispose()
