"""The exceptions dupguard raises on purpose. Every message is meant for the operator and never holds a secret.

DupguardError
├── ConfigError               bad settings; start-up stops with exit code 2 listing every problem
├── DatabaseError             the metadata database cannot be reached or queried (exit code 3)
│   └── UnsupportedSchema     the database is not an Airflow metadata DB dupguard can read
├── AirflowApiError           the Airflow REST API refused or failed a call
│   ├── AirflowAuthError      wrong credentials or token; not retried
│   └── AirflowUnreachable    the REST API does not answer (``--source api``: exit code 3, like the database)
├── AlertDeliveryError        Slack or the webhook could not take an alert
└── LedgerError               the ledger cannot record (e.g. its state file's volume is full); the cause is kept
    └── LedgerFault           the durable ledger is broken: a table missing, altered or unwritable
"""

from __future__ import annotations


class DupguardError(Exception):
    """Base of every error dupguard raises deliberately."""


class ConfigError(DupguardError):
    """One or more settings are invalid. ``problems`` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid configuration:\n" + "\n".join(f"  - {p}" for p in self.problems))


class DatabaseError(DupguardError):
    """The metadata database is unreachable or a query failed."""


class UnsupportedSchema(DatabaseError):
    """The database holds no Airflow schema dupguard understands."""


class AirflowApiError(DupguardError):
    """A call to Airflow's REST API failed."""


class AirflowAuthError(AirflowApiError):
    """Airflow rejected the credentials; retrying would only lock the account."""


class AirflowUnreachable(AirflowApiError):
    """The REST API does not answer (refused, timed out, 5xx)."""


class AlertDeliveryError(DupguardError):
    """An alert could not be delivered."""


class LedgerError(DupguardError):
    """The ledger could not record a claim or note; the message names the cause (e.g. no space left)."""


class LedgerFault(LedgerError):
    """The durable ledger is broken: a table ``missing``, ``altered`` or ``unwritable`` (``kind``).
    Detection and alerts go on; only remediation waits for its claims (``detector.app.ledger_fault``)."""

    def __init__(self, message: str, kind: str, table: str) -> None:
        self.kind, self.table = kind, table
        super().__init__(message)
