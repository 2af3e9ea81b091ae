"""Where earlier keep decisions are read from before a group is judged: a decision is final.

Two sources, because either may be missing: the ledger's recorded roles (durable across restarts
with ``dupguard init-db``, in memory otherwise) and the notes dupguard and its guard write on every
run they stop (in Airflow's ``dag_run_note``: present whatever the ledger, one indexed SELECT).
The keep rule itself stays in the pure core (``detect.keep_order``), which takes the result as data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from sqlalchemy import Connection
from sqlalchemy.exc import ProgrammingError

from detector.core.decisions import decisions_from_notes, decisions_from_roles
from detector.core.model import Decisions, Run, TaskProgress
from detector.core.ports import Ledger
from detector.errors import DatabaseError, LedgerFault
from detector.metadb.schema import AirflowTables
from detector.sources.disputes import report_disputed

MISSING_GRANT = (
    "permission denied for table dag_run_note: GRANT SELECT ON dag_run_note TO the dupguard role "
    "(the notes on stopped runs keep earlier keep decisions final; no group is judged without them)"
)


@contextmanager
def notes_readable() -> Iterator[None]:
    """Around every read of ``dag_run_note`` (earlier decisions' notes and the guard's, read with the task
    progress in ``consumption.progress_and_notes``).

    Judging without the notes could keep a run dupguard stopped and stop the kept one, so the poll
    fails instead (loudly, naming the grant; rewound and retried, nothing lost)."""
    try:
        yield
    except ProgrammingError as exc:
        if "permission denied" in str(exc.orig):
            raise DatabaseError(MISSING_GRANT) from None
        raise


class PriorDecisions:
    """``read(conn, runs)``: every earlier decision about ``runs``, from notes and the ledger."""

    def __init__(self, tables: AirflowTables, ledger: Ledger) -> None:
        self.tables = tables
        self.ledger = ledger

    def __call__(
        self, conn: Connection, runs: Sequence[Run], progress: Mapping[int, TaskProgress], notes: Mapping[int, str]
    ) -> Decisions:
        """``notes``: the runs' notes, read with their task progress (``consumption.progress_and_notes``)."""
        try:
            roles = self.ledger.on(conn).decisions([(r.dag_id, r.run_id) for r in runs])  # on the caller's connection
        except LedgerFault:
            # A broken ledger (reported, shown in health) holds no detection back: judged on the notes,
            # as with the in-memory ledger; nothing is acted on until the group's claims are recorded.
            roles = {}
        recorded = decisions_from_roles(runs, roles)
        prior = decisions_from_notes(runs, notes, progress, ledger_kept=recorded.kept) | recorded
        report_disputed(prior, runs, notes)
        return prior
