"""``DbLedger.on(conn)``: the ledger's statements on a connection the caller holds (the daemon's poll
connection) keep the ledger's guarantees: a claim is won exactly once, whichever connection
asks, and a write is durable at once; a write on a connection with an open transaction is refused
(it would vanish with that transaction's rollback)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine

from detector.app.ledger import DbLedger, init_db
from detector.metadb.engine import make_engine, parse_url
from tests.pg import Templates

pytestmark = pytest.mark.integration


@pytest.fixture
def engine(pg_templates: Templates) -> Iterator[Engine]:
    engine = make_engine(parse_url(pg_templates.clone("3.1.2")))
    init_db(engine)
    yield engine
    engine.dispose()


def test_claims_on_a_held_connection_are_won_once_and_durable(engine: Engine) -> None:
    pooled = DbLedger(engine, owner="a")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        held = pooled.on(conn)
        assert held.claim_all("g1", ["detected", "action:r2"]) == {"detected", "action:r2"}
        assert held.claim_all("g1", ["detected"]) == set(), "the same connection cannot win it twice"
        held.record_decision(("dag", "r1"), [("dag", "r2")])
        held.save_watermark(42)
        # Seen at once through the pool, i.e. committed, while the held connection stays open.
        assert pooled.claim("g1", "action:r2") is False
        assert pooled.decisions([("dag", "r1"), ("dag", "r2")]) == {
            ("dag", "r1"): {"kept"},
            ("dag", "r2"): {"duplicate"},
        }
        assert pooled.watermark() == 42
    assert pooled.claim("g2", "detected") is True
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        assert pooled.on(conn).claim_all("g2", ["detected"]) == set(), "won through the pool first"


def test_a_write_on_a_connection_in_a_transaction_is_refused(engine: Engine) -> None:
    with engine.connect() as conn:
        held = DbLedger(engine).on(conn)
        with pytest.raises(RuntimeError, match="autocommit"):
            held.claim_all("g", ["detected"])
        assert held.decisions([("dag", "r")]) == {}, "reads are fine in any transaction"
    assert DbLedger(engine).claim("g", "detected") is True, "nothing was written"
