"""Several groups' claims, roles and notes at once (a poll's groups), on every ledger: the memory and
file ledgers and the durable ledger on real PostgreSQL. What each group wins is what ``claim_all``
group after group gives, and the PostgreSQL ledger sends one statement for all of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.engine.interfaces import CacheStats

from detector.app import ledger as ledger_module
from detector.app.ledger import DbLedger, MemoryLedger, init_db
from detector.app.ledger_file import FileLedger
from detector.app.ledger_memory import DUPLICATE, KEPT
from detector.core.ports import Observed, Pending
from detector.metadb.engine import make_engine, parse_url
from tests.pg import Templates

pytestmark = pytest.mark.integration

Ledger = MemoryLedger | DbLedger
# Group g1's "detected" is taken before (another replica); g1 asks "action:a" twice, in two findings.
ASKED: list[tuple[str, list[str]]] = [
    ("g1", ["detected", "action:a"]),
    ("g2", ["detected", "action:b", "detected:r2"]),
    ("g1", ["action:a", "action:c"]),
    ("g3", []),
]


@pytest.fixture(params=["memory", "file", "postgres"])
def make_ledger(request: pytest.FixtureRequest, tmp_path: Path, pg_templates: Templates) -> Iterator[Callable[[], Any]]:
    """A factory of fresh, empty ledgers of one kind (each a database or file of its own)."""
    engines: list[Engine] = []

    def make() -> Ledger:
        if request.param == "memory":
            return MemoryLedger()
        if request.param == "file":
            return FileLedger(str(tmp_path / f"state-{len(list(tmp_path.iterdir()))}.json"))
        engine = make_engine(parse_url(pg_templates.clone("3.1.2")))
        init_db(engine)
        engines.append(engine)
        return DbLedger(engine, owner="this")

    yield make
    for engine in engines:
        engine.dispose()


def _taken_before(ledger: Ledger) -> None:
    other = DbLedger(ledger.engine, owner="other") if isinstance(ledger, DbLedger) else ledger
    assert other.claim("g1", "detected")


def test_each_group_wins_what_claiming_one_after_the_other_wins(make_ledger: Callable[[], Ledger]) -> None:
    """A subject taken before is lost, a subject asked by two findings of one group is the first
    one's, every other subject is won, and asking again wins nothing."""
    ledger, twin = make_ledger(), make_ledger()
    _taken_before(ledger)
    _taken_before(twin)
    won = ledger.claim_groups(ASKED)
    assert won == [{"action:a"}, {"detected", "action:b", "detected:r2"}, {"action:c"}, set()]
    assert won == [twin.claim_all(key, subjects) for key, subjects in ASKED]
    assert ledger.claim_groups(ASKED) == [set(), set(), set(), set()]
    assert ledger.claim_groups([]) == []


def test_postgres_claims_every_group_in_one_statement(pg_templates: Templates) -> None:
    """One INSERT for every group of a poll, whatever their number (and nothing sent for none)."""
    engine = make_engine(parse_url(pg_templates.clone("3.1.2")))
    init_db(engine)
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        ledger = DbLedger(engine)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            held = ledger.on(conn)
            won = held.claim_groups([(f"group-{i}", ["detected", f"action:{i}"]) for i in range(500)])
            assert won == [{"detected", f"action:{i}"} for i in range(500)]
            held.record_decisions([(("dag", f"k{i}"), [("dag", f"d{i}")]) for i in range(500)])
            held.add_pending_many([Pending(f"group-{i}", "dag", f"d{i}") for i in range(500)])
            assert held.claim_groups([]) == []
    finally:
        event.remove(engine, "before_cursor_execute", count)
        engine.dispose()
    assert [s.split()[2] for s in sent] == ["dupguard.claims", "dupguard.claims", "dupguard.notes"]


def test_postgres_ledger_writes_of_a_poll_are_compiled_once(pg_templates: Templates) -> None:
    """The claims, roles and notes a poll writes come from SQLAlchemy's statement cache after their
    first use: PostgreSQL's INSERT ... ON CONFLICT has no cache key of its own and was compiled again
    at every execution, the largest Python cost on a duplicate pair's path to its alert."""
    engine = make_engine(parse_url(pg_templates.clone("3.1.2")))
    init_db(engine)
    hits: list[tuple[str, bool]] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        hits.append((statement.split()[2], context.cache_hit == CacheStats.CACHE_HIT))

    event.listen(engine, "after_cursor_execute", seen)
    try:
        ledger = DbLedger(engine)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            held = ledger.on(conn)
            for i in range(3):
                held.claim_groups([(f"group-{i}", ["detected", f"action:{i}"])])
                held.record_decisions([(("dag", f"k{i}"), [("dag", f"d{i}")])])
                held.add_pending_many([Pending(f"group-{i}", "dag", f"d{i}")])
                held.add_observed_many([Observed(f"group-{i}", "dag", f"d{i}", f"k{i}", datetime.now(UTC))])
    finally:
        event.remove(engine, "after_cursor_execute", seen)
        engine.dispose()
    assert len(hits) == 12
    # The first claim compiles the claims' statement (the roles reuse it), the first pending note the notes'.
    assert [hit for _, hit in hits[4:]] == [True] * 8, hits
    assert hits[1] == ("dupguard.claims", True)


def test_postgres_ledger_statements_are_built_when_the_ledger_is_made(pg_templates: Templates) -> None:
    """The claims, notes and earlier-decisions statements are compiled when the ledger is made, not by the
    first duplicate of the process: their compilation made that duplicate's alert about 7 ms later. So a
    ledger's first decisions read is already an SQLAlchemy cache hit, and its first claim compiles nothing
    more than the text of a statement."""
    for built in (ledger_module._claim_rows, ledger_module._remember_rows, ledger_module._decided_rows):
        built.cache_clear()
    engine = make_engine(parse_url(pg_templates.clone("3.1.2")))
    init_db(engine)
    try:
        DbLedger(engine)
        built_at_start = [
            f.cache_info().currsize
            for f in (ledger_module._claim_rows, ledger_module._remember_rows, ledger_module._decided_rows)
        ]
        ledger = DbLedger(engine)
        ledger.claim_groups([("group-x", ["detected"])])
        ledger.record_decisions([(("dag", "kept-run"), [("dag", "dup-run")])])
        decided = ledger.decisions([("dag", "kept-run"), ("dag", "dup-run"), ("dag", "other")])
    finally:
        engine.dispose()
    assert built_at_start == [1, 1, 1]
    assert decided == {("dag", "kept-run"): {KEPT}, ("dag", "dup-run"): {DUPLICATE}}


def test_roles_and_notes_of_several_groups_read_back(make_ledger: Callable[[], Ledger]) -> None:
    """Roles recorded at once read back per run and never change; pending remediations and dry-run
    observations added at once are listed; a note given twice keeps its last value."""
    ledger = make_ledger()
    ledger.record_decision(("dag", "r1"), [("dag", "r2")])
    ledger.record_decisions([(("dag", "r2"), [("dag", "r3")]), (("other", "k"), [("other", "d1"), ("other", "d2")])])
    ledger.record_decisions([])
    assert ledger.decisions([("dag", "r1"), ("dag", "r2"), ("dag", "r3"), ("other", "d2"), ("other", "x")]) == {
        ("dag", "r1"): {"kept"},
        ("dag", "r2"): {"duplicate", "kept"},  # both roles recorded, neither replaced: the reader decides
        ("dag", "r3"): {"duplicate"},
        ("other", "d2"): {"duplicate"},
    }
    ledger.add_pending_many([Pending("g1", "dag", "r3"), Pending("g2", "other", "d1"), Pending("g3", "dag", "r3")])
    ledger.add_pending_many([])
    assert sorted(ledger.pending(), key=lambda p: p.run_id) == [
        Pending("g2", "other", "d1"),
        Pending("g3", "dag", "r3"),  # the last of the two
    ]
    at = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    seen = [Observed("g1", "dag", "r5", "r4", at), Observed("g2", "dag", "r6", "r4", at)]
    ledger.add_observed_many(seen)
    assert sorted(ledger.observed(), key=lambda o: o.run_id) == seen
