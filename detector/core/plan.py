"""Pure planning: findings and policy in, the actions to take out. Executors carry them out.

Safety rules live here, in one place (issue: never touch a run that is not a confirmed duplicate):
only ``confirmed`` groups are remediated, only their ``duplicates`` (never ``kept``), never a run an
earlier judgement kept (a decision is final), and a duplicate whose tasks already
started is left alone unless the operator opted in.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from detector.core.decisions import REMEDIATION_NOTE_PREFIX
from detector.core.model import NO_PROGRESS, Confidence, Finding, Kind, Run

NOTE_LIMIT = 1000  # Airflow's dag_run_note.content is varchar(1000)


class Mode(enum.StrEnum):
    OFF = "off"
    DRY_RUN = "dry-run"
    FAIL = "fail"
    SKIP = "skip"


class Outcome(enum.StrEnum):
    """Why a duplicate is (not) being acted on."""

    REMEDIATE = "remediate"
    WOULD_REMEDIATE = "would_remediate"  # dry-run
    PREVENTED = "prevented"  # the in-scheduler guard created it with every task skipped (its note)
    TOO_LATE = "too_late"  # its tasks started: both runs executed
    NOT_CONFIRMED = "not_confirmed"
    DISABLED = "disabled"  # remediation off
    STOPPED_BEFORE = "stopped_before"  # its note says dupguard (or the guard) already stopped it
    KEPT_BEFORE = "kept_before"  # an earlier judgement kept it: never remediated


# Outcomes that take no decision, hence claim nothing: a later verdict on the group may still act.
UNDECIDED = frozenset({Outcome.NOT_CONFIRMED, Outcome.DISABLED, Outcome.KEPT_BEFORE})


@dataclass(frozen=True, slots=True)
class Action:
    """What to do about one duplicate run of one finding."""

    finding_key: str
    dag_id: str
    run: Run
    kept_run_id: str
    outcome: Outcome
    mode: Mode
    note: str

    @property
    def writes(self) -> bool:
        return self.outcome is Outcome.REMEDIATE


_WHY = {  # which Airflow bug made such a duplicate: the link an operator follows from the run page
    Kind.ASSET: "same asset trigger, HA scheduler race; see apache/airflow#54491",
    Kind.PARTITIONED: "same partition key, partitioned asset race; see apache/airflow#68045 and #71070",
    Kind.TRIGGER_EVENT: "one message, one asset event per triggerer running its trigger; see apache/airflow#65792",
}


def note_for(finding: Finding, run: Run, now: datetime) -> str:
    """What an operator reads on the run page in the UI; never longer than Airflow accepts."""
    events = ", ".join(map(str, finding.shared_event_ids)) or "none"
    text = (
        f"{REMEDIATION_NOTE_PREFIX}{finding.kept.run_id} "
        f"({_WHY[finding.kind]}). "
        f"Shared asset events: {events}. At {now.isoformat(timespec='seconds')}."
    )
    if len(text) <= NOTE_LIMIT:
        return text
    return text[: NOTE_LIMIT - 1] + "…"


def plan(findings: Iterable[Finding], mode: Mode, *, now: datetime, remediate_started: bool = False) -> list[Action]:
    """One action per duplicate run of every finding."""
    actions: list[Action] = []
    for finding in findings:
        for run in finding.duplicates:
            progress = finding.progress.get(run.id, NO_PROGRESS)
            if run.id in finding.prior.kept:
                outcome = Outcome.KEPT_BEFORE
            elif finding.confidence is not Confidence.CONFIRMED:
                outcome = Outcome.NOT_CONFIRMED
            elif progress.guarded:  # by the guard's note: a run skipped by hand is not "prevented"
                outcome = Outcome.PREVENTED
            elif run.id in finding.prior.stopped:
                outcome = Outcome.STOPPED_BEFORE  # before TOO_LATE: stopping it may have failed a task
            elif mode is Mode.OFF:
                outcome = Outcome.DISABLED
            elif progress.any_started and not remediate_started:
                outcome = Outcome.TOO_LATE
            elif mode is Mode.DRY_RUN:
                outcome = Outcome.WOULD_REMEDIATE
            else:
                outcome = Outcome.REMEDIATE
            actions.append(
                Action(
                    finding_key=finding.key,
                    dag_id=finding.dag_id,
                    run=run,
                    kept_run_id=finding.kept.run_id,
                    outcome=outcome,
                    mode=mode,
                    note=note_for(finding, run, now),
                )
            )
    return actions
