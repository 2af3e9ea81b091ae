"""What one poll's groups claim and record in the ledger: every group at once.

``Responder.handle`` (``detector.app.respond``) plans each group here, claims every group's subjects
in one call, then records the roles, the dry runs' observations and the pending remediations of what
it won, one call each: a storm's poll of 1,000 groups sent a statement per group and per write
(benchmarks/results/storm-detection-profile-5ffee71.txt)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import datetime

from detector.actions.remediation.guarded import passive_result
from detector.core.model import Finding
from detector.core.plan import UNDECIDED, Action, Mode, Outcome, plan
from detector.core.ports import Ledger, Observed, Pending
from detector.errors import LedgerFault


def claim_of(action: Action) -> str:
    """The ledger claim of a decided action. A dry run's "would" is an observation, not a decision:
    its own claim (counted and alerted once), so a later mode fail or skip still decides the run."""
    if action.outcome is Outcome.WOULD_REMEDIATE:
        return f"{Outcome.WOULD_REMEDIATE.value}:{action.run.run_id}"
    return f"action:{action.run.run_id}"


@dataclass(frozen=True)
class Planned:
    """One group's actions and the ledger subjects they claim."""

    finding: Finding
    actions: list[Action]
    decided: list[Action]  # undecided actions claim nothing: a later verdict on the group may still act
    claims: dict[str, str]  # run_id -> the claim of its decided action

    def subjects(self) -> list[str]:
        # Every run of the group, the kept one too: a run that joins and takes the keep (it consumed
        # every event) is the news, not the old kept run that became a duplicate.
        seen = [f"detected:{r.run_id}" for r in self.finding.runs]
        # An undecided outcome is counted once per run and outcome, however often the group is judged.
        left = [f"{a.outcome.value}:{a.run.run_id}" for a in self.actions if a.outcome in UNDECIDED]
        return ["detected", *seen, *self.claims.values(), *left]

    def todo(self, won: set[str]) -> list[Action]:
        """The decided actions whose claim this replica won: only these are acted on."""
        return [a for a in self.decided if self.claims[a.run.run_id] in won]


def planned(finding: Finding, mode: Mode, now: datetime, remediate_started: bool) -> Planned:
    actions = plan([finding], mode, now=now, remediate_started=remediate_started)
    decided = [a for a in actions if a.outcome not in UNDECIDED]
    return Planned(finding, actions, decided, {a.run.run_id: claim_of(a) for a in decided})


def record(ledger: Ledger, judged: list[tuple[Finding, list[Action]]], now: datetime) -> Exception | None:
    """The roles, observations and pending remediations of the groups' won actions, one call each.

    Returns the pending list's failure other than a ledger fault (the poll fails after the alerts and is
    retried); a ledger fault is reported by the ledger, and only what reads these later misses them."""
    with contextlib.suppress(LedgerFault):  # claimed, so acted on; the notes on stopped runs keep it
        ledger.record_decisions(
            [((f.dag_id, f.kept.run_id), [(a.dag_id, a.run.run_id) for a in todo]) for f, todo in judged]
        )
    if not ledger.durable:
        return None
    observed = [  # what a later leader in mode fail or skip judges again
        Observed(f.key, a.dag_id, a.run.run_id, a.kept_run_id, now)
        for f, todo in judged
        for a in todo
        if a.outcome is Outcome.WOULD_REMEDIATE
    ]
    if observed:
        with contextlib.suppress(LedgerFault):  # reported; only a later re-judgement misses it
            ledger.add_observed_many(observed)
    pending = [
        Pending(f.key, a.dag_id, a.run.run_id)
        for f, todo in judged
        for a in todo
        if passive_result(a) is None and a.writes
    ]
    if pending:
        try:
            ledger.add_pending_many(pending)
        except LedgerFault:
            pass  # reported as a ledger fault: only a later leader's pick-up misses it
        except Exception as exc:  # noqa: BLE001 - the caller raises it, once every group is alerted
            return exc
    return None
