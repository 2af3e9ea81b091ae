"""docs/reference/sql.md lists every statement dupguard sends, and is what the code generates."""

from __future__ import annotations

from pathlib import Path

from detector.app.sql_doc import MODES, statements


def test_every_statement_says_why() -> None:
    """A statement without a docstring would be listed without a reason."""
    missing = [f"{s.module}:{s.name}" for s in statements() if not s.reason]
    assert missing == []


def test_the_page_names_what_each_mode_touches() -> None:
    """Spot checks against the code: the poll reads dag_run, the db backend writes task_instance, the
    leader lock reads pg_locks, the ledger writes only its own schema, detection writes nothing."""
    by = {(s.mode, s.name): s for s in statements()}
    assert "dag_run" in by["detection", "new_runs"].read
    assert by["remediation db backend", "DbBackend._set_tis"].written == ("task_instance",)
    assert by["remediation db backend", "run_state"].locked
    assert "pg_locks" in by["leader lock", "session_lock_status"].read
    assert by["checks", "requeue_stranded"].written == ("asset_dag_run_queue",)
    assert all(t.startswith("dupguard.") for s in statements() if s.mode == "ledger" for t in s.written + s.read)
    assert not [s.name for s in statements() if s.mode == "detection" and s.written]


def test_every_module_that_sends_a_statement_is_in_a_mode() -> None:
    """A new module with ``conn.execute`` must join a mode, or the page would silently miss it. The demo
    writes only its own throw-away SQLite file; the prepared probe sends ``top_run_and_queues``'s statement."""
    root = Path(__file__).resolve().parents[2] / "detector"
    listed = {m for _, modules in MODES for m in modules}
    sending = {
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "conn.execute(" in p.read_text() and p.parts[len(root.parts)] != "guard"
    }
    assert sending - listed == {"app/demo.py"}
