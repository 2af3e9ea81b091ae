"""What is broken in the durable ledger, and what repairs it: a table missing, altered, or unwritable.

A ledger fault holds nothing back but remediation (docs/explanation/daemon.md, "The ledger"): detection
and alerts go on, a group is acted on only once its claim is recorded. ``classify`` reads the
server's SQLSTATE; ``FaultBoard`` keeps the current fault for health and the ``dupguard_ledger_fault``
gauge and logs one line when it begins or changes, one when it ends, never one per poll.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError

from detector import logs, redact
from detector.errors import LedgerFault
from detector.metrics import Metrics

log = logs.get("dupguard.ledger")
MISSING, ALTERED, UNWRITABLE = "missing", "altered", "unwritable"
KINDS = (MISSING, ALTERED, UNWRITABLE)
# SQLSTATE -> kind. Anything else (a lost connection, a timeout) is the database's trouble, not the ledger's.
_CODES = {
    "42P01": MISSING,  # undefined_table
    "3F000": MISSING,  # invalid_schema_name
    "42703": ALTERED,  # undefined_column
    "42P10": ALTERED,  # invalid_column_reference: ON CONFLICT without its primary key
    "42804": ALTERED,  # datatype_mismatch
    "23502": ALTERED,  # not_null_violation: a column added without a default
    "42501": UNWRITABLE,  # insufficient_privilege
}
CONSEQUENCE = "detection and alerts go on (alerts may repeat); remediation waits for its claims"
GRANT = "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA dupguard TO the dupguard role"


@dataclass(frozen=True)
class Fault:
    kind: str
    table: str
    detail: str  # the server's first line, e.g. 'relation "dupguard.claims" does not exist'

    @property
    def repair(self) -> str:
        if self.kind == MISSING:
            return "the leader re-creates it (as `dupguard init-db` does); if its role may not, run `dupguard init-db`"
        if self.kind == ALTERED:
            return "run `dupguard init-db` (it keeps the altered table aside and creates it afresh)"
        if self.detail.startswith("permission denied"):
            return GRANT
        return "free space on the database server (or lift what refuses the write)"

    def __str__(self) -> str:
        return f"ledger table dupguard.{self.table} {self.kind} ({self.detail}): {CONSEQUENCE}; repair: {self.repair}"

    def error(self) -> LedgerFault:
        return LedgerFault(str(self), self.kind, self.table)


def classify(exc: DBAPIError, table: str, url: URL) -> Fault | None:
    """The fault behind a failed ledger statement on ``table``; None if the ledger is not to blame."""
    orig = exc.orig
    code = getattr(orig, "pgcode", None) or getattr(orig, "sqlstate", None)
    if not isinstance(code, str):
        return None
    kind = _CODES.get(code) or (UNWRITABLE if code.startswith("53") else None)  # 53: disk full, out of memory
    if kind is None:
        return None
    detail = redact.withhold((str(orig).strip().splitlines() or [code])[0][:300], redact.url_secrets(url))
    return Fault(kind, table, detail)


class FaultBoard:
    """The ledger's current fault (None: it records). Shared by every copy of one ledger, all threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.current: Fault | None = None
        self._metrics: Metrics | None = None

    def attach(self, metrics: Metrics) -> None:
        """Publish on ``metrics`` (the daemon's), every kind at 0 until one is seen."""
        self._metrics = metrics
        for kind in KINDS:
            metrics.ledger_fault.labels(kind=kind).set(0)
        self._publish()

    def report(self, fault: Fault) -> None:
        with self._lock:
            previous, self.current = self.current, fault
            changed = previous is None or (previous.kind, previous.table) != (fault.kind, fault.table)
        if changed:
            self._publish()
            log.warning("ledger_fault", kind=fault.kind, table=fault.table, error=fault.detail, repair=fault.repair,
                        consequence=CONSEQUENCE)  # fmt: skip

    def clear(self, repaired: bool = False) -> None:
        with self._lock:
            previous, self.current = self.current, None
        if previous is not None:
            self._publish()
            log.info("ledger_repaired" if repaired else "ledger_recovered", kind=previous.kind, table=previous.table)

    def _publish(self) -> None:
        if self._metrics is None:
            return
        current = self.current
        for kind in KINDS:
            self._metrics.ledger_fault.labels(kind=kind).set(1 if current is not None and current.kind == kind else 0)
