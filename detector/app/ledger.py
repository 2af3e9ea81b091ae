"""What was already handled, so nothing is alerted or remediated twice (restarts, replicas, overlaps).

``DbLedger`` keeps it in a dupguard-owned schema ``dupguard`` beside Airflow's tables, created only by
``dupguard init-db`` (or at start with ``DUPGUARD_LEDGER=on``). A claim is an INSERT … ON CONFLICT DO
NOTHING: exactly one replica wins it, even if two briefly believe they lead. ``MemoryLedger`` serves
read-only database users: it forgets on restart, so a restarted replica (or one elected before it saw
a live leader, ``detector.sources.database.resume``) may alert again about groups from the last
``startup_lookback`` (remediation stays safe: a stopped run is
recognised as already stopped, and the note on it names the kept run, ``detector.core.decisions``).

Besides claims the ledger keeps, per run, the role an earlier judgement gave it (``decision|<dag>|<run>``
claims, subject ``kept`` or ``duplicate``: a decision is final, so no later poll reverses it), the remediations
not finished yet (notes ``pending|<dag>|<run>``), which a new leader picks up and finishes, and the
duplicates a dry run would have stopped (notes ``observed|<dag>|<run>``: an observation, not a decision),
which a leader in mode fail or skip judges again.
"""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Engine,
    MetaData,
    String,
    Table,
    Text,
    TextClause,
    any_,
    bindparam,
    delete,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement, Executable

from detector import logs
from detector.app.ledger_fault import Fault, FaultBoard, classify
from detector.app.ledger_memory import (
    DUPLICATE,
    KEPT,
    WATERMARK,
    RunNotes,
    decision_key,
    decision_rows,
    unique_claims,
    won_by_group,
)
from detector.app.ledger_memory import MemoryLedger as MemoryLedger
from detector.errors import ConfigError, DatabaseError, DupguardError
from detector.metadb.engine import connect, describe_error

SCHEMA = "dupguard"
_md = MetaData(schema=SCHEMA)
claims = Table(
    "claims",
    _md,
    Column("group_key", String(600), primary_key=True),
    Column("subject", String(300), primary_key=True),
    Column("claimed_at", DateTime(timezone=True), nullable=False),
    Column("owner", String(300), nullable=False),
)
notes = Table(
    "notes",
    _md,
    Column("group_key", String(600), primary_key=True),
    Column("name", String(100), primary_key=True),
    Column("value", Text, nullable=False),
)
state = Table(
    "state",
    _md,
    Column("name", String(100), primary_key=True),
    Column("value", Text, nullable=False),
)
log = logs.get("dupguard.ledger")


_NAMED_PARAMETERS = PGDialect(paramstyle="named")  # type: ignore[no-untyped-call]  # text() binds are :name


def _compiled_once(stmt: ClauseElement) -> TextClause:
    """``stmt`` as PostgreSQL text, with its parameters' types: a statement SQLAlchemy caches. Its
    PostgreSQL INSERT (the one with ON CONFLICT) has no cache key, so it was compiled anew at every
    execution: three compilations on the detection path of every duplicate pair."""
    compiled = stmt.compile(dialect=_NAMED_PARAMETERS)
    binds = compiled.binds if isinstance(compiled, SQLCompiler) else {}
    return text(str(compiled)).bindparams(*(bindparam(n, type_=b.type) for n, b in binds.items()))


@functools.cache
def _claim_rows() -> Executable:
    """INSERT ... SELECT FROM unnest(keys, subjects) ... ON CONFLICT DO NOTHING RETURNING: the claims
    this statement won, however many groups it carries (one shape, compiled once)."""
    asked = (
        func.unnest(bindparam("group_keys", type_=ARRAY(String)), bindparam("subjects", type_=ARRAY(String)))
        .table_valued("group_key", "subject")
        .render_derived(name="asked")
    )
    given = select(
        asked.c.group_key,
        asked.c.subject,
        bindparam("claimed_at", type_=DateTime(timezone=True)),
        bindparam("owner", type_=String()),
    )
    insert = pg_insert(claims).from_select(["group_key", "subject", "claimed_at", "owner"], given)
    return _compiled_once(insert.on_conflict_do_nothing().returning(claims.c.group_key, claims.c.subject))


@functools.cache
def _decided_rows() -> Executable:
    """The roles (``subjects``: kept, duplicate) of the asked runs' decision keys. The keys as one array:
    one statement shape (a storm's poll asks for thousands), built once: building it and its cache key
    at every judged pair cost about as much as sending it."""
    return _compiled_once(
        select(claims.c.group_key, claims.c.subject).where(
            claims.c.group_key == any_(bindparam("keys", type_=ARRAY(String))),
            claims.c.subject == any_(bindparam("subjects", type_=ARRAY(String))),
        )
    )


@functools.cache
def _remember_rows() -> Executable:
    """INSERT ... SELECT FROM unnest(keys, names, values) ... ON CONFLICT DO UPDATE: several notes, one shape."""
    given = (
        func.unnest(
            bindparam("group_keys", type_=ARRAY(String)),
            bindparam("names", type_=ARRAY(String)),
            bindparam("values", type_=ARRAY(Text)),
        )
        .table_valued("group_key", "name", "value")
        .render_derived(name="given")
    )
    insert = pg_insert(notes).from_select(["group_key", "name", "value"], select(*given.c))
    return _compiled_once(
        insert.on_conflict_do_update(
            index_elements=[notes.c.group_key, notes.c.name], set_={"value": insert.excluded.value}
        )
    )


class DbLedger(RunNotes):
    """The durable ledger in PostgreSQL schema ``dupguard``.

    Every method is one statement. By default each checks a connection out of the engine's pool (a
    ``pool_pre_ping`` round trip, BEGIN, the statement, COMMIT). ``on(conn)`` gives the same ledger on
    a connection its caller's thread already holds: the daemon's autocommit poll connection, where
    one statement is its own transaction. That takes three round trips per call off the detection
    path; its writes are refused on a connection that is not in autocommit mode, where
    they would be rolled back with the caller's transaction.
    """

    durable = True

    def __init__(
        self,
        engine: Engine,
        owner: str | None = None,
        conn: Connection | None = None,
        faults: FaultBoard | None = None,
    ) -> None:
        self.engine = engine
        self.owner = owner or socket.gethostname()
        self._bound = conn
        self.faults = faults or FaultBoard()  # shared by every ``on`` copy: what is broken, for health
        # Compiled here, once per process: the first duplicate paid about 7 ms for these compilations.
        _claim_rows(), _remember_rows(), _decided_rows()

    def on(self, conn: Connection) -> DbLedger:
        """This ledger on ``conn``, a connection to the same database held by the calling thread."""
        return DbLedger(self.engine, self.owner, conn, self.faults)

    @contextlib.contextmanager
    def _session(self, table: Table, *, write: bool) -> Iterator[Connection]:
        """The connection one statement on ``table`` runs on, in a transaction of its own when it writes."""
        if self._bound is None:
            with connect(self.engine) as conn, self._faults_of(table):
                if write:
                    with conn.begin():
                        yield conn
                else:
                    yield conn
            return
        if write and self._bound.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            raise RuntimeError("ledger writes on a bound connection need autocommit")  # a bug, not an outage
        try:
            with self._faults_of(table):
                yield self._bound
        except SQLAlchemyError as exc:
            raise DatabaseError(describe_error(exc, self.engine.url)) from None

    @contextlib.contextmanager
    def _faults_of(self, table: Table) -> Iterator[None]:
        """A statement failing because the ledger is broken raises ``LedgerFault`` and is reported."""
        try:
            yield
        except DBAPIError as exc:
            fault = classify(exc, table.name, self.engine.url)
            if fault is None:
                raise
            self.faults.report(fault)
            raise fault.error() from None

    def probe(self) -> Fault | None:
        """What is broken now, found by the ledger's own statements on each table, rolled back: a
        table missing, a column gone or renamed, a privilege revoked, a write refused (a full disk)."""
        now = datetime.now(UTC)
        probe = "dupguard-probe"
        statements: dict[Table, list[Executable]] = {
            claims: [
                pg_insert(claims)
                .values(group_key=probe, subject=probe, claimed_at=now, owner=self.owner)
                .on_conflict_do_nothing(index_elements=[claims.c.group_key, claims.c.subject])
                .returning(claims.c.group_key)
            ],
            notes: [
                pg_insert(notes)
                .values(group_key=probe, name=probe, value=probe)
                .on_conflict_do_update(index_elements=[notes.c.group_key, notes.c.name], set_={"value": probe}),
                delete(notes).where(notes.c.group_key == probe),
            ],
            state: [
                pg_insert(state)
                .values(name=probe, value=probe)
                .on_conflict_do_update(index_elements=[state.c.name], set_={"value": probe})
            ],
        }
        with connect(self.engine) as conn:
            for table, stmts in statements.items():
                try:
                    with conn.begin() as trans:
                        for stmt in stmts:
                            conn.execute(stmt)
                        trans.rollback()
                except DBAPIError as exc:
                    fault = classify(exc, table.name, self.engine.url)
                    if fault is None:
                        raise
                    return fault
        return None

    def repair(self) -> bool:
        """Re-create what ``init-db`` creates and is missing (schema, tables); False if this role may not."""
        try:
            init_db(self.engine, set_aside=False)
        except DupguardError as exc:
            log.warning("ledger_not_repaired", error=str(exc), repair="run `dupguard init-db`")
            return False
        return True

    def claim(self, group_key: str, subject: str) -> bool:
        """Claim ``subject`` of ``group_key`` for this replica (claims pkey): True when no one had."""
        stmt = (
            pg_insert(claims)
            .values(group_key=group_key, subject=subject, claimed_at=datetime.now(UTC), owner=self.owner)
            .on_conflict_do_nothing()
            .returning(claims.c.group_key)
        )
        with self._session(claims, write=True) as conn:
            return conn.execute(stmt).first() is not None

    def claim_all(self, group_key: str, subjects: list[str]) -> set[str]:
        """Several claims in one round trip: the ones this call won."""
        return self.claim_groups([(group_key, subjects)])[0]

    def claim_groups(self, asked: Sequence[tuple[str, Sequence[str]]]) -> list[set[str]]:
        """The claims of several groups in one statement (claims pkey): the subjects each group won.

        The rows go as two arrays, so the statement has one shape and SQLAlchemy compiles it once: a
        storm's poll claimed its groups one INSERT each, compiled anew (a thousand round trips,
        benchmarks/results/storm-detection-profile-5ffee71.txt)."""
        rows = unique_claims(asked)
        if not rows:
            return [set() for _ in asked]
        params = {
            "group_keys": [k for k, _ in rows],
            "subjects": [s for _, s in rows],
            "claimed_at": datetime.now(UTC),
            "owner": self.owner,
        }
        with self._session(claims, write=True) as conn:
            won = {(row.group_key, row.subject) for row in conn.execute(_claim_rows(), params)}
        return won_by_group(asked, won)

    def remember(self, group_key: str, name: str, value: str) -> None:
        """Store one named value of a group (notes pkey), replacing the old one."""
        stmt = pg_insert(notes).values(group_key=group_key, name=name, value=value)
        stmt = stmt.on_conflict_do_update(index_elements=[notes.c.group_key, notes.c.name], set_={"value": value})
        with self._session(notes, write=True) as conn:
            conn.execute(stmt)

    def remember_many(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """Several named values in one statement (notes pkey), each replacing the old one; a row given
        twice keeps its last value, as ``remember`` one after the other would."""
        last = {(k, n): v for k, n, v in rows}
        if not last:
            return
        params = {"group_keys": [k for k, _ in last], "names": [n for _, n in last], "values": list(last.values())}
        with self._session(notes, write=True) as conn:
            conn.execute(_remember_rows(), params)

    def recall(self, group_key: str, name: str) -> str | None:
        """One named value of a group (notes pkey), or None."""
        query = select(notes.c.value).where(notes.c.group_key == group_key, notes.c.name == name)
        with self._session(notes, write=False) as conn:
            return conn.execute(query).scalar_one_or_none()

    def watermark(self) -> int | None:
        """The highest dag_run id judged, as saved (state pkey), or None."""
        with self._session(state, write=False) as conn:
            value = conn.execute(select(state.c.value).where(state.c.name == WATERMARK)).scalar_one_or_none()
        return None if value is None else int(value)

    def save_watermark(self, high: int) -> None:
        """Save the highest dag_run id judged (state pkey): a restart resumes above it."""
        stmt = pg_insert(state).values(name=WATERMARK, value=str(high))
        stmt = stmt.on_conflict_do_update(index_elements=[state.c.name], set_={"value": str(high)})
        with self._session(state, write=True) as conn:
            conn.execute(stmt)

    def record_decision(self, kept: tuple[str, str], duplicates: Iterable[tuple[str, str]]) -> None:
        """The roles of one judgement, in one round trip; an existing role is never changed."""
        now = datetime.now(UTC)
        rows = [
            {"group_key": k, "subject": s, "claimed_at": now, "owner": self.owner}
            for k, s in decision_rows(kept, duplicates)
        ]
        with self._session(claims, write=True) as conn:
            conn.execute(pg_insert(claims).values(rows).on_conflict_do_nothing())

    def record_decisions(self, judgements: Sequence[tuple[tuple[str, str], Sequence[tuple[str, str]]]]) -> None:
        """The roles of several judgements in one statement (the claims' own); an existing role is never changed."""
        rows = list(dict.fromkeys(row for kept, dups in judgements for row in decision_rows(kept, dups)))
        if not rows:
            return
        params = {
            "group_keys": [k for k, _ in rows],
            "subjects": [s for _, s in rows],
            "claimed_at": datetime.now(UTC),
            "owner": self.owner,
        }
        with self._session(claims, write=True) as conn:
            conn.execute(_claim_rows(), params)

    def decisions(self, runs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], set[str]]:
        """(dag_id, run_id) -> the roles earlier judgements gave it (claims pkey)."""
        keys = {decision_key(dag_id, run_id): (dag_id, run_id) for dag_id, run_id in runs}
        if not keys:
            return {}
        found: dict[tuple[str, str], set[str]] = {}
        with self._session(claims, write=False) as conn:
            for row in conn.execute(_decided_rows(), {"keys": sorted(keys), "subjects": [KEPT, DUPLICATE]}):
                found.setdefault(keys[row.group_key], set()).add(row.subject)
        return found

    def _forget(self, group_key: str, name: str) -> None:
        """Delete one named note of a group (notes pkey): a remediation done, a dry run's finding judged again."""
        stmt = delete(notes).where(notes.c.group_key == group_key, notes.c.name == name)
        with self._session(notes, write=True) as conn:
            conn.execute(stmt)

    def _named(self, name: str) -> list[tuple[str, str]]:
        """Every note of one name (notes, by name): the pending remediations, or the dry runs' findings."""
        with self._session(notes, write=False) as conn:
            rows = conn.execute(select(notes.c.group_key, notes.c.value).where(notes.c.name == name)).all()
        return [(r.group_key, r.value) for r in rows]


def init_db(engine: Engine, *, set_aside: bool = True) -> None:
    """Create schema ``dupguard`` and its three small tables (idempotent). Touches nothing of Airflow's.

    ``set_aside``: a ledger table whose columns or primary key are not the ones it was created with
    (altered by hand) is renamed ``<table>_altered_<UTC time>``, kept for inspection, and created afresh.
    Its claims are lost with it, as with a dropped table: the notes on stopped runs keep earlier keep
    decisions final (``detector.sources.database.prior``), and alerts about recent groups may repeat."""
    if engine.url.get_backend_name() != "postgresql":
        raise ConfigError(["the durable ledger needs PostgreSQL; SQLite deployments use the in-memory ledger"])
    with connect(engine) as conn, conn.begin():
        # CREATE SCHEMA IF NOT EXISTS checks CREATE on the database before it looks for the schema:
        # a role given a pre-created schema (docs/how-to/deploy-kubernetes.md, "Database role") has no such grant.
        if not inspect(conn).has_schema(SCHEMA):
            conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        if set_aside:
            _set_altered_aside(conn)
        _md.create_all(conn)


def _set_altered_aside(conn: Connection) -> None:
    """Rename a ledger table whose columns or primary key were altered (and its key's index) out of the way."""
    found = inspect(conn)
    stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    for table in _md.tables.values():
        if not found.has_table(table.name, schema=SCHEMA):
            continue
        columns = {c["name"] for c in found.get_columns(table.name, schema=SCHEMA)}
        key = found.get_pk_constraint(table.name, schema=SCHEMA)
        if columns == set(table.c.keys()) and key["constrained_columns"] == [c.name for c in table.primary_key]:
            continue
        aside = f"{table.name}_altered_{stamp}"
        conn.execute(text(f'ALTER TABLE {SCHEMA}."{table.name}" RENAME TO "{aside}"'))
        if key.get("name"):  # index names are per schema: the new table's primary key takes the old name
            conn.execute(text(f'ALTER INDEX {SCHEMA}."{key["name"]}" RENAME TO "{aside}_pkey"'))
        log.warning("ledger_table_set_aside", table=table.name, kept_as=f"{SCHEMA}.{aside}",
                    reason="its columns or primary key were altered; created afresh")  # fmt: skip


def drop_db(engine: Engine) -> None:
    """Remove schema ``dupguard`` and everything in it; Airflow's tables are never touched."""
    with connect(engine) as conn, conn.begin():
        conn.execute(text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))


def ledger_exists(engine: Engine) -> bool:
    if engine.url.get_backend_name() != "postgresql":
        return False
    with connect(engine) as conn:
        return bool(inspect(conn).has_table("claims", schema=SCHEMA))


def open_ledger(mode: str, engine: Engine) -> MemoryLedger | DbLedger:
    """The ledger ``mode`` (auto | on | off) asks for; DatabaseError if ``on`` cannot create it."""
    if mode == "off":
        return MemoryLedger()
    if mode == "on":
        init_db(engine)
        return DbLedger(engine)
    if ledger_exists(engine):
        return DbLedger(engine)
    log.warning(
        "ledger_in_memory",
        reason="schema dupguard not found; run `dupguard init-db` for a durable ledger",
        consequence="a restart or failover may alert again about recent groups",
    )
    return MemoryLedger()
