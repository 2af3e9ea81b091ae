"""Where earlier keep decisions are read from before a group is judged (issue 11 §1).

Two sources, because either may be missing: the ledger's recorded roles (durable across restarts
with ``dupguard init-db``, in memory otherwise) and the notes dupguard and its guard write on every
run they stop (in Airflow's ``dag_run_note``: present whatever the ledger, one indexed SELECT).
The keep rule itself stays in the pure core (``detect.keep_order``), which takes the result as data.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import Connection
from sqlalchemy.exc import ProgrammingError

from detector import logs, queries
from detector.decisions import decisions_from_notes, decisions_from_roles
from detector.model import Decisions, Run
from detector.ports import Ledger
from detector.schema import AirflowTables

log = logs.get("dupguard.prior")
WARN_EVERY = 300.0  # seconds between repeats of the missing-grant error


class PriorDecisions:
    """``read(conn, runs)``: every earlier decision about ``runs``, from notes and the ledger."""

    def __init__(self, tables: AirflowTables, ledger: Ledger) -> None:
        self.tables = tables
        self.ledger = ledger
        self._warned_at = -WARN_EVERY

    def __call__(self, conn: Connection, runs: Sequence[Run]) -> Decisions:
        roles = self.ledger.decisions([(r.dag_id, r.run_id) for r in runs])
        found = decisions_from_roles(runs, roles)
        try:
            notes = queries.run_notes(conn, self.tables, [r.id for r in runs])
        except ProgrammingError as exc:  # e.g. a role granted before dag_run_note was needed
            # Detection must go on (the poll connection is autocommit, so nothing is left aborted);
            # the operator is told, loudly and repeatedly, what is missing and what it costs.
            if time.monotonic() - self._warned_at >= WARN_EVERY:
                self._warned_at = time.monotonic()
                log.error(
                    "run_notes_unreadable",
                    error=str(exc.orig).splitlines()[0] if exc.orig else type(exc).__name__,
                    fix="GRANT SELECT ON dag_run_note TO <dupguard role>",
                    consequence="earlier keep decisions are known only from the ledger; without the durable "
                    "ledger a restart may keep a run dupguard stopped",
                )
            return found
        return decisions_from_notes(runs, notes) | found
