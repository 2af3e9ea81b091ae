"""What one group claims in the ledger (``detector.app.respond_claims``): the subjects a replica must win
before it acts or alerts, and the plan they come from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from detector.app.respond_claims import planned, record
from detector.core.detect import find_duplicates
from detector.core.model import Finding, TaskProgress
from detector.core.plan import Mode, Outcome
from detector.core.ports import Observed, Pending
from detector.errors import LedgerFault
from tests.factories import T0, run


def _pair(progress: dict[int, TaskProgress] | None = None) -> Finding:
    [f] = find_duplicates([run(id=1), run(id=2)], {1: frozenset({1}), 2: frozenset({1})}, progress or {})
    return f


def test_a_decided_group_claims_its_runs_and_its_action_only() -> None:
    """A stop decided (fail): the group, each run, and the duplicate's action; no outcome subject beside
    it, which would count the decision a second time."""
    f = _pair()
    kept, dup = f.kept.run_id, f.duplicates[0].run_id
    group = planned(f, Mode.FAIL, T0, remediate_started=False)
    assert group.subjects() == ["detected", f"detected:{kept}", f"detected:{dup}", f"action:{dup}"]
    assert group.claims == {dup: f"action:{dup}"}


def test_an_undecided_outcome_is_claimed_by_its_run_and_outcome() -> None:
    """Remediation off: nothing decided, so no action claim; the outcome is claimed once per run and
    outcome, so judging the group again neither counts nor alerts it twice."""
    f = _pair()
    kept, dup = f.kept.run_id, f.duplicates[0].run_id
    group = planned(f, Mode.OFF, T0, remediate_started=False)
    assert group.subjects() == ["detected", f"detected:{kept}", f"detected:{dup}", f"{Outcome.DISABLED.value}:{dup}"]
    assert group.claims == {} and group.decided == []


def test_planning_passes_on_the_opt_in_to_stop_started_duplicates() -> None:
    """DUPGUARD_REMEDIATE_STARTED reaches the plan: a duplicate whose tasks started is stopped when it is
    on, and reported too late when it is off."""
    started = _pair({1: TaskProgress(1, 1), 2: TaskProgress(1, 1)})
    assert [a.outcome for a in planned(started, Mode.FAIL, T0, remediate_started=True).actions] == [Outcome.REMEDIATE]
    assert [a.outcome for a in planned(started, Mode.FAIL, T0, remediate_started=False).actions] == [Outcome.TOO_LATE]


@dataclass
class RecordingLedger:
    """The durable ledger's three writes ``record`` makes, recorded; ``broken`` ones raise a ledger fault
    (a table dropped or revoked under a running leader)."""

    broken: set[str] = field(default_factory=set)
    durable: bool = True
    roles: list[Any] = field(default_factory=list)
    observed: list[Observed] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)

    def _write(self, name: str, into: list[Any], items: Sequence[Any]) -> None:
        if name in self.broken:
            raise LedgerFault(f"{name} cannot be written", "missing", name)
        into.extend(items)

    def record_decisions(self, judgements: Sequence[Any]) -> None:
        self._write("roles", self.roles, judgements)

    def add_observed_many(self, items: Sequence[Observed]) -> None:
        self._write("observed", self.observed, items)

    def add_pending_many(self, items: Sequence[Pending]) -> None:
        self._write("pending", self.pending, items)


def _decided(mode: Mode, dag: str) -> tuple[Finding, list[Any]]:
    [f] = find_duplicates([run(id=1, dag_id=dag), run(id=2, dag_id=dag)], {1: frozenset({1}), 2: frozenset({1})}, {})
    return f, planned(f, mode, T0, remediate_started=False).decided


def test_a_dry_runs_observation_names_its_group() -> None:
    """What a later fail or skip leader judges again carries the group's key, the duplicate and the run
    the dry run kept."""
    f, todo = _decided(Mode.DRY_RUN, "observed_dag")
    ledger = RecordingLedger()
    assert record(ledger, [(f, todo)], T0) is None  # type: ignore[arg-type]
    dup = f.duplicates[0]
    assert ledger.observed == [Observed(f.key, "observed_dag", dup.run_id, f.kept.run_id, T0)]


def test_a_ledger_fault_on_roles_or_observations_still_leaves_the_stops_pending() -> None:
    """The roles and the dry runs' observations cannot be written (a ledger fault, reported by the ledger):
    the poll goes on, and the decided stops are still left pending for a later leader."""
    dry, stop = _decided(Mode.DRY_RUN, "dry_dag"), _decided(Mode.FAIL, "fail_dag")
    ledger = RecordingLedger(broken={"roles", "observed"})
    assert record(ledger, [dry, stop], T0) is None  # type: ignore[arg-type]
    f = stop[0]
    assert ledger.pending == [Pending(f.key, "fail_dag", f.duplicates[0].run_id)]
