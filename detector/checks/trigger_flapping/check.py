"""Triggers claimed by every triggerer: ``detector.checks.trigger_flapping.rule`` has the rule.

Airflow keeps no history of a trigger's owners, so ``dupguard run`` sees the flapping live: this
instance remembers the owner of each trigger (and that owner's heartbeat) from its previous run.
Every ``trigger_flapping_interval`` (10 s): the owner flips at every loop of the triggerers (about
1 s), so a look sees another owner than the last about every other time with two triggerers; and
two looks must be closer than ``triggerer_health_check_threshold`` minus a heartbeat period (30 - 5 s
by default) to prove the previous owner never went stale in between. One trigger is alerted once
(its key: id and creation time). ``dupguard scan`` looks once, so it reports the exposure instead,
and says that it is one. Nothing is ever remediated.

The consequence without a message id (``detector.checks.trigger_flapping.rule_copies``): runs of a consumer made by
asset events with equal broadcast payloads, while two triggerers were alive, of an asset trigger
``run`` saw flapping (from the look before its first flap, less the suspect window) or ``scan``
found exposed on a release known to lack the filter: one ``suspected`` observation per set (key:
its DAG and first event), alerted once, never remediated and never linked into a duplicate group.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection

from detector.checks.base import CheckBase
from detector.checks.trigger_flapping import statements
from detector.checks.trigger_flapping.rule import (
    ASSET,
    UNPROTECTED,
    Exposure,
    Flap,
    Owner,
    TriggererJob,
    TriggerRow,
    alive_at,
    exposure,
    judge_owners,
)
from detector.checks.trigger_flapping.rule_copies import SuspectedCopies, suspected_copies
from detector.checks.trigger_flapping.statements import trigger_tables
from detector.config import Config
from detector.core.checks import TRIGGER_COPIES_ALERT, CheckContext, Observation
from detector.core.trigger_event import copies
from detector.metadb import catalog, consumption, dag_runs
from detector.metadb.engine import AirflowDb, connect
from detector.metrics import Metrics

KIND = "trigger_flapping"
ADVICE = {
    ASSET: "Run one triggerer until Airflow 3.2.2+ (PR #65792), or expect one asset event per triggerer "
    "and one consumer run per event: check the consumers of these assets for extra runs.",
    "callback": "Run one triggerer until the fix (apache/airflow PR #72848) is released: the deadline "
    "callback can run once per triggerer.",
}
COPIES_ADVICE = (
    "Check whether these runs processed one message twice (a Redis pub/sub message reaches every copy of "
    "the trigger); nothing was stopped: without a message id two real messages with equal bodies look the "
    "same. Run one triggerer until Airflow 3.2.2+ (PR #65792)."
)
# How far back a live look reads a flapping trigger's events: older sets were seen by earlier looks
# (every 10 s); a set still growing after this long is alerted again under its new first event.
COPIES_LOOKBACK = timedelta(hours=1)


class TriggerFlappingCheck(CheckBase):
    kind = KIND

    def __init__(self, config: Config, metrics: Metrics) -> None:
        super().__init__(config, metrics)
        self.memory: dict[tuple[int, datetime], Owner] = {}  # the owners seen by the previous run
        self.flapping: dict[tuple[int, datetime], datetime] = {}  # asset triggers seen flapping: since when

    def applies(self, db: AirflowDb) -> bool:
        """Airflow 3 (2.x has no asset or callback triggers), with every table the check reads: a
        database made without Airflow's migrations (dupguard's own SQLite demo) may lack them."""
        if db.info.family.value not in UNPROTECTED:
            return False
        tt = trigger_tables(db.info.family)
        tables = (tt.trigger, tt.asset_link, tt.asset, tt.consumer_ref, tt.job, tt.dag_run, tt.deadline, tt.callback)
        names = {t.name for t in tables if t is not None}
        with connect(db.engine) as conn:
            return catalog.existing_tables(conn, names) == names

    def interval(self) -> timedelta:
        return self.config.trigger_flapping_interval

    def collect(self, conn: Connection, db: AirflowDb, ctx: CheckContext) -> list[Observation]:
        tt = trigger_tables(db.info.family)
        triggers = [
            t
            for t in statements.flapping_candidates(conn, tt)
            if not t.dag_ids or any(map(ctx.dag_filter.selects, t.dag_ids))
        ]
        threshold = self.config.triggerer_health_check_threshold
        if not ctx.live:
            jobs = statements.triggerer_jobs_since(conn, tt, ctx.since)
            unprotected = UNPROTECTED[db.info.family.value]
            exposures = exposure(triggers, jobs, unprotected, ctx.since)
            exposed = [e.trigger for e in exposures if e.trigger.kind == ASSET and e.certain_version]
            copied = self._copies(conn, db, exposed, ctx.since, jobs, ctx)
            return [_exposure(e, ctx.db_now) for e in exposures] + copied
        owners = {t.triggerer_id for t in triggers if t.triggerer_id is not None} | {
            o.job_id for o in self.memory.values()
        }
        jobs = statements.triggerer_jobs_by_id(conn, tt, owners)
        flaps, self.memory = judge_owners(triggers, jobs, self.memory, ctx.db_now, threshold)
        for f in flaps:  # a set whose first copy came just before the look before the flap is read whole
            if f.trigger.kind == ASSET:
                self.flapping.setdefault(f.trigger.identity, f.previous_seen_at - self.config.suspect_window)
        alive = {t.identity for t in triggers}
        self.flapping = {i: at for i, at in self.flapping.items() if i in alive}
        found = [_flap(f, threshold) for f in flaps]
        if not self.flapping:
            return found
        start = max(min(self.flapping.values()), ctx.db_now - COPIES_LOOKBACK)
        flapping = [t for t in triggers if t.identity in self.flapping]
        every_job = statements.triggerer_jobs_since(conn, tt, start - threshold)
        return found + self._copies(conn, db, flapping, start, every_job, ctx)

    def _copies(
        self,
        conn: Connection,
        db: AirflowDb,
        triggers: Sequence[TriggerRow],
        since: datetime | None,
        jobs: Sequence[TriggererJob],
        ctx: CheckContext,
    ) -> list[Observation]:
        """The suspected copies of ``triggers``' id-less broadcast messages since ``since``."""
        of_asset = {a: t for t in triggers for a in t.asset_ids}
        if not of_asset:
            return []
        t, window = db.tables, self.config.suspect_window
        id_paths = self.config.message_id_paths  # an event with an id of its own is no id-less copy
        read = dag_runs.trigger_events_since(conn, t, since, window, of_asset, id_paths=id_paths)
        events = [e for e in read if e.broadcast]
        # Only events with an equal one within the window can be copies: their consumers alone are read.
        chained = {e for c in copies(events, window) for e in c.event_ids}
        events = [e for e in events if e.id in chained]
        if not events:
            return []
        runs = dag_runs.runs_consuming(conn, t, chained)
        consumed = consumption.consumed_events(conn, t, [r.id for r in runs])
        threshold = self.config.triggerer_health_check_threshold

        def two_alive(at: datetime) -> bool:
            return alive_at(jobs, at, threshold) >= 2

        found = suspected_copies(events, window, consumed, runs, two_alive, ctx.dag_filter)
        return [_suspected(s, of_asset[s.asset_id], ctx, window) for s in found]


CHECK = TriggerFlappingCheck  # what detector.checks.enabled registers for this kind


def _job(job: TriggererJob | None) -> dict[str, Any] | None:
    if job is None:
        return None
    beat = job.latest_heartbeat.isoformat() if job.latest_heartbeat else None
    return {"job_id": job.id, "hostname": job.hostname, "state": job.state, "latest_heartbeat": beat}


def _trigger(t: TriggerRow) -> dict[str, Any]:
    return {
        "trigger_id": t.id,
        "trigger_created": t.created_date.isoformat(),
        "trigger_kind": t.kind,
        "assets": list(t.assets),
    }


def _key(t: TriggerRow, prefix: str = "") -> str:
    return f"{KIND}:{prefix}{t.id}:{t.created_date.isoformat()}"


def _feeds(t: TriggerRow) -> str:
    what = f"asset {', '.join(t.assets)}" if t.kind == ASSET else "a deadline callback"
    return f"{what} -> DAGs {', '.join(t.dag_ids) or '(none)'}"


def _host(job: TriggererJob | None) -> str:
    return "(job gone)" if job is None else f"job {job.id} ({job.hostname or '?'})"


def _flap(f: Flap, threshold: timedelta) -> Observation:
    t = f.trigger
    beat = f.previous.latest_heartbeat.isoformat() if f.previous.latest_heartbeat else "?"
    return Observation(
        kind=KIND,
        key=_key(t),
        confidence="confirmed",
        severity="error",
        dag_ids=t.dag_ids,
        title=f"Trigger {t.id} ({t.kind}) moved between two live triggerers: each one runs it",
        lines=(
            f"trigger {t.id}: {_feeds(t)}",
            f"owner {_host(f.previous)} at {f.previous_seen_at.isoformat()}, "
            f"{_host(f.current)} at {f.seen_at.isoformat()}",
            f"{_host(f.previous)} still alive: state {f.previous.state}, last heartbeat {beat} "
            f"(threshold {threshold.total_seconds():g} s, database clock)",
        ),
        advice=ADVICE[t.kind],
        facts=_trigger(t)
        | {
            "previous_owner": _job(f.previous),
            "new_owner": _job(f.current),
            "previous_seen_at": f.previous_seen_at.isoformat(),
            "threshold_seconds": threshold.total_seconds(),
        },
        seen_at=f.seen_at,
        subject=f,
    )


def _exposure(e: Exposure, db_now: datetime) -> Observation:
    t, (a, b) = e.trigger, e.jobs
    release = (
        "this Airflow release does not keep such triggers with a live owner"
        if e.certain_version
        else "Airflow 3.2.0 and 3.2.1 do not keep asset triggers with a live owner "
        "(3.2.2 does; the schema cannot tell them apart)"
    )
    return Observation(
        kind=KIND,
        key=_key(t, "exposure:"),
        confidence="exposure",
        severity="warning" if e.certain_version else "info",
        dag_ids=t.dag_ids,
        title=f"Trigger {t.id} ({t.kind}) may run on every triggerer (exposure: a scan cannot see owner changes)",
        lines=(
            f"trigger {t.id}: {_feeds(t)}",
            release,
            f"{_host(a)} and {_host(b)} alive at the same time from {e.overlap_start.isoformat()} "
            f"to {e.overlap_end.isoformat()} (their own timestamps)",
            "Airflow records no previous owners: `dupguard run` sees the flapping itself",
        ),
        advice=ADVICE[t.kind],
        facts=_trigger(t)
        | {
            "triggerer_jobs": [_job(a), _job(b)],
            "overlap": [e.overlap_start.isoformat(), e.overlap_end.isoformat()],
            "certain_version": e.certain_version,
        },
        seen_at=db_now,
        subject=e,
    )


def _suspected(s: SuspectedCopies, t: TriggerRow, ctx: CheckContext, window: timedelta) -> Observation:
    how = (
        "this instance saw the trigger move between two live triggerers"
        if ctx.live
        else "the release lacks the filter and two triggerer jobs were alive at each event (their own "
        "timestamps); `dupguard run` sees the flapping itself"
    )
    run_ids = [r.run_id for r in s.runs]
    extra = [r.run_id for r in s.extra_runs]
    absorbed = [r.run_id for r in s.runs[1:] if r not in s.extra_runs]
    return Observation(
        kind=KIND,
        key=f"{KIND}:copies:{s.dag_id}:{s.event_ids[0]}",
        confidence="suspected",
        severity="warning",
        dag_ids=(s.dag_id,),
        title=f"DAG {s.dag_id} ran {len(extra)} extra time(s) after run {s.first_run.run_id} for equal messages of "
        f"trigger {t.id} while it ran on two triggerers: possibly one message, no message id to prove it",
        lines=(
            f"trigger {t.id}: {_feeds(t)}",
            f"asset events {', '.join(map(str, s.event_ids))} from {s.first.isoformat()} to {s.last.isoformat()}: "
            f"equal Redis pub/sub payloads within {window.total_seconds():g} s of each other",
            f"first run {s.first_run.run_id}; extra: {', '.join(extra)} (they consumed nothing but copies)",
            *(
                [f"not extra: {', '.join(absorbed)} (also consumed other events: the copy rode along)"]
                if absorbed
                else []
            ),
            how,
        ),
        advice=COPIES_ADVICE,
        facts=_trigger(t)
        | {
            "reason": "copies_without_id",
            "event_ids": list(s.event_ids),
            "run_ids": run_ids,
            "first_run_id": s.first_run.run_id,
            "extra_run_ids": extra,
            "first_event_at": s.first.isoformat(),
            "last_event_at": s.last.isoformat(),
        },
        seen_at=ctx.db_now,
        subject=s,
        alertname=TRIGGER_COPIES_ALERT,  # extra runs of one message, maybe: not the flap itself
    )
