"""What a periodic check finds, in one shape for every kind (the rest of the HA family: docs/explanation/checks.md).

Duplicate run groups have their own pipeline (``core.detect`` -> ``core.plan`` -> remediation), fed by the
poll of new runs (every 5 ms while a race is possible, 250 ms at rest, by default). Everything else dupguard
watches for is a *state* read on a slower cadence (a split partition key, a trigger claimed by two triggerers,
events no run consumed, a try bumped twice): a periodic check reads its rows, a pure rule judges them, and
what it finds is an ``Observation``.
Alerts, the scan document, logs and metrics are built from these fields alone, so a new kind needs no
code in the daemon loop, the alert dispatcher or the renderers (like node_exporter's collectors:
one package per kind behind one small interface, ``detector.checks``).

Pure: no clock, no I/O; ``db_now`` and ``now`` are passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from detector.core.detect import ALL_DAGS, DagFilter

# Copies of one message a trigger run on two triggerers submitted (docs/explanation/airflow-internals.md, "One
# message, one asset event per triggerer"), found by
# the stranded_events check (copies one run consumed) or trigger_flapping's (copies_without_id): not
# stranded events nor a flap, so their own alert and runbook section.
TRIGGER_COPIES_ALERT = "DupguardTriggerCopies"

Confidence = Literal["confirmed", "suspected", "exposure"]  # exposure: a risk inferred, not a thing seen
Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class CheckContext:
    """One run of one check."""

    db_now: datetime  # the database's clock: ages of Airflow's timestamps are judged on it, not on a skewed host clock
    now: datetime  # this host's clock: dates alerts and reports only
    dag_filter: DagFilter = ALL_DAGS
    live: bool = True  # `dupguard run` (the check runs again and again) or one look (`dupguard scan`)
    since: datetime | None = None  # scan --since, on the database's clock (None: all history)


@dataclass(frozen=True)
class Observation:
    """One thing a periodic check found.

    ``key`` is stable for the thing's lifetime and starts with ``kind``: the ledger claims it once, so
    it is alerted once across restarts and replicas. ``facts`` is JSON-able (the scan document's
    entry, the webhook payload's ``observation``, log fields). ``subject`` is the kind's own typed
    record, for a formatter that says more than the generic one; it never leaves the process.
    """

    kind: str
    key: str
    confidence: Confidence
    severity: Severity
    dag_ids: tuple[str, ...]
    title: str  # one line, plain text
    lines: tuple[str, ...]  # the evidence, one fact per line
    advice: str  # what on-call should do first
    facts: Mapping[str, Any]
    seen_at: datetime  # database clock
    subject: object = field(default=None, compare=False, repr=False)
    # the alert's name (Alertmanager's alertname, every channel's runbook anchor) when the kind's would
    # misname what was found: copies of one trigger message reported by another kind's check
    alertname: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The scan document's entry: the kind's facts under the common fields (which win)."""
        return dict(self.facts) | {
            "key": self.key,
            "kind": self.kind,
            "confidence": self.confidence,
            "severity": self.severity,
            "dag_ids": list(self.dag_ids),
            "title": self.title,
            "lines": list(self.lines),
            "advice": self.advice,
            "seen_at": self.seen_at.isoformat(),
        }
