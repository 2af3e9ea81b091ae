"""The stranded_events check's repair step (``DUPGUARD_REPAIR_STRANDED``): decide, claim, write, verify.

Per stranded set (one ``Observation`` of ``stranded_events``), on the leader only:

* ``off``: nothing. ``dry-run`` (default): the plan is read and logged once per set
  (``stranded_repair_planned`` with the INSERT it would make, or the refusal); nothing is written.
* ``requeue``: without INSERT on ``asset_dag_run_queue`` it logs ``stranded_repair_not_permitted``
  once and retries each run quietly (no claim taken); without a valid fence (standing by, waiting
  after a takeover) it waits for a later run. Otherwise it claims ``<key>|repair`` in the ledger (the
  durable ledger keeps it across restarts and replicas: never a second repair of one set), then
  ``detector.checks.stranded_events.requeue`` writes, fenced, after a re-read under the same transaction.
* Follow-up: each later run looks for the DAG's asset run with ``run_after`` = T that consumed exactly
  the set: ``stranded_repaired`` with its run id, or ``stranded_repair_unverified`` (error) once
  ``stranded_repair_deadline`` (15 min) has passed on the database clock. Kept in memory: a restart
  forgets what it was waiting for (the claim stays; no second write).

Every outcome is a log line, ``dupguard_stranded_repairs_total{outcome}`` and one notice on every
alert channel (kind ``stranded_repair``, key ``<key>|repair|<outcome>``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy.exc import SQLAlchemyError

from detector import logs
from detector.actions.alerts.notice import observation_notice
from detector.checks.base import RepairContext
from detector.checks.stranded_events import statements
from detector.checks.stranded_events.metrics import StrandedMetrics
from detector.checks.stranded_events.requeue import RequeueWriter, plan_now
from detector.checks.stranded_events.rule import KIND, StrandedSet
from detector.checks.stranded_events.rule_repair import REPAIR_KIND, Refusal, Requeue, verify
from detector.core.checks import Observation, Severity
from detector.core.fence import LeadershipLost
from detector.errors import DupguardError
from detector.metadb import catalog
from detector.metadb.engine import connect
from detector.metrics import Metrics

log = logs.get("dupguard.checks")
Mode = Literal["off", "dry-run", "requeue"]
SEVERITY: dict[str, Severity] = {
    "planned": "info",
    "requeued": "info",
    "repaired": "info",
    "skipped": "info",
    "refused": "warning",
    "failed": "error",
    "repair_unverified": "error",
}
BY_HAND = "Create one asset event of the DAG's asset by hand (REST API POST /api/v2/assets/events)."
UNDO = "To undo before the run appears: DELETE FROM asset_dag_run_queue WHERE target_dag_id = the DAG."


@dataclass
class Waiting:
    obs: Observation
    plan: Requeue
    deadline: datetime  # database clock


class StrandedRepairer:
    def __init__(self, mode: str, deadline: timedelta, metrics: Metrics) -> None:
        self.mode, self.deadline = mode, deadline
        self.own = metrics.of_kind(KIND, StrandedMetrics)
        self.waiting: dict[str, Waiting] = {}
        self.denied = False  # INSERT on asset_dag_run_queue missing (logged once)

    def repair(self, found: list[Observation], rc: RepairContext) -> None:
        if self.mode == "off":
            return
        self._follow_up(rc)
        for obs in found:
            if isinstance(obs.subject, StrandedSet) and obs.key not in self.waiting:
                self._one(obs, obs.subject, rc)

    def _one(self, obs: Observation, s: StrandedSet, rc: RepairContext) -> None:
        claim = f"{obs.key}|repair"
        if self.mode == "dry-run":
            if rc.ledger.claim(claim, "dry-run"):
                with connect(rc.db.engine) as conn:
                    plan = plan_now(conn, rc.db.tables, s)
                if isinstance(plan, Refusal):
                    self._report(obs, plan.outcome, plan.reason, rc)
                else:
                    self._report(obs, "planned", f"would write: {plan.describe()}", rc)
            return
        if not self._permitted(rc) or rc.fence() is None:
            return  # retried next run; nothing claimed
        if not rc.ledger.claim(claim, "requeue"):
            return  # this set was repaired (or tried) before, here or on another replica
        try:
            written = RequeueWriter(rc.db.engine, rc.db.tables, fence=rc.fence).write(s)
        except LeadershipLost as exc:
            self._report(obs, "failed", f"{exc}. {BY_HAND}", rc)
            return
        except (SQLAlchemyError, DupguardError) as exc:  # rolled back; the claim stays: said loudly, once
            self._report(obs, "failed", f"not written ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}). "
                         f"{BY_HAND}", rc)  # fmt: skip
            return
        self._report(obs, written.outcome, written.detail, rc)
        if written.plan is not None:
            self.waiting[obs.key] = Waiting(obs, written.plan, rc.db_now + self.deadline)

    def _permitted(self, rc: RepairContext) -> bool:
        with connect(rc.db.engine) as conn:
            (held,) = catalog.table_privileges(conn, [("asset_dag_run_queue", "INSERT")])
        if not held and not self.denied:
            self.own.repairs.labels(outcome="not_permitted").inc()
            log.warning(
                "stranded_repair_not_permitted",
                detail="DUPGUARD_REPAIR_STRANDED=requeue needs GRANT INSERT ON asset_dag_run_queue; nothing written, "
                "retried every run",
            )
        if held and self.denied:
            log.info("stranded_repair_permitted")
        self.denied = not held
        return held

    def _follow_up(self, rc: RepairContext) -> None:
        if not self.waiting:
            return
        with connect(rc.db.engine) as conn:
            for key, w in list(self.waiting.items()):
                run = verify(w.plan, statements.asset_runs_at(conn, rc.db.tables, w.plan.dag_id, w.plan.created_at))
                if run is not None:
                    self._report(w.obs, "repaired", f"run {run.run_id} consumed events {list(run.event_ids)}", rc,
                                 run_id=run.run_id)  # fmt: skip
                elif rc.db_now >= w.deadline:
                    self._report(w.obs, "repair_unverified", f"no run of {w.plan.dag_id} consumed events "
                                 f"{list(w.plan.event_ids)} within {self.deadline}. {UNDO} {BY_HAND}", rc)  # fmt: skip
                else:
                    continue
                del self.waiting[key]

    def _report(
        self, obs: Observation, outcome: str, detail: str, rc: RepairContext, run_id: str | None = None
    ) -> None:
        s = obs.subject
        assert isinstance(s, StrandedSet)
        self.own.repairs.labels(outcome=outcome).inc()
        facts = {"outcome": outcome, "detail": detail, "mode": self.mode, "stranded_key": obs.key,
                 "dag_id": s.dag_id, "event_ids": list(s.event_ids), "run_id": run_id}  # fmt: skip
        getattr(log, SEVERITY[outcome])(f"stranded_repair_{outcome}", **facts)  # error / warning / info
        advice = UNDO if outcome == "requeued" else BY_HAND if outcome in ("refused", "failed") else ""
        notice = Observation(
            kind=REPAIR_KIND,
            key=f"{obs.key}|repair|{outcome}",
            confidence="confirmed",
            severity=SEVERITY[outcome],
            dag_ids=(s.dag_id,),
            title=f"stranded events of DAG {s.dag_id}: repair {outcome.replace('_', ' ')}",
            lines=(detail,),
            advice=advice or "Nothing to do.",
            facts=facts,
            seen_at=rc.db_now,
        )
        rc.notify(observation_notice(notice, rc.cluster, rc.now))
