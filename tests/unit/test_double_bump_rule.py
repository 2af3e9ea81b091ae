"""The double_bump rule on rows shaped as Airflow writes them (docs/explanation/airflow-internals.md,
"Task attempts bumped twice").

The same rule runs on the Airflow-made fixtures in tests/integration/test_double_bump.py; here every
look-alike the issue names gets a row of its own.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from detector.checks.double_bump.rule import (
    SCHEDULING_ALLOWANCE,
    Evidence,
    OrphanTiming,
    SchedulerJob,
    TiRow,
    find_double_bumps,
    observe,
)
from detector.core.detect import DagFilter

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
RUNNING_B = SchedulerJob(2, "running", T0 + timedelta(seconds=30), "scheduler-b")
RUNNING_A = SchedulerJob(1, "running", T0 + timedelta(seconds=30), "scheduler-a")
JOBS = {1: RUNNING_A, 2: RUNNING_B}


def ti(try_number: int, state: str | None = "running", **kw: object) -> TiRow:
    base = TiRow(
        id="ti-1",
        dag_id="etl",
        task_id="load",
        run_id="manual__1",
        map_index=-1,
        try_number=try_number,
        state=state,
        hostname="worker-2",
        queued_by_job_id=1,
        scheduled_dttm=T0 + timedelta(seconds=10),
        dag_version_id="v1",
        run_queued_at=T0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


EARLIER = ti(1, "running", hostname="worker-1", queued_by_job_id=2, scheduled_dttm=T0 + timedelta(seconds=5))


def evidence(history: dict[tuple[str, str, str, int], frozenset[int]] | None = None, **kw: object) -> Evidence:
    return Evidence(history=history or {}, jobs=kw.pop("jobs", JOBS), **kw)  # type: ignore[arg-type]


def test_same_id_try_up_by_one_from_in_flight_with_no_history_is_confirmed() -> None:
    """The race: the previous pass saw try 1 running on worker-1, now try 2 on the same id, no history row."""
    [bump] = find_double_bumps([ti(2)], evidence(), memory={"ti-1": EARLIER})
    assert (bump.confidence, bump.tries, bump.earlier) == ("confirmed", (1, 2), EARLIER)
    assert bump.schedulers == ("scheduler-b", "scheduler-a")
    obs = observe(bump, T0)
    assert obs.key == "double_bump:ti-1:1" and obs.severity == "error" and obs.confidence == "confirmed"
    assert obs.facts["hosts"] == ["worker-1", "worker-2"] and obs.facts["tries"] == [1, 2]
    assert "worker-1" in obs.advice and "etl.load" in obs.title


def test_without_memory_the_same_shape_is_suspected() -> None:
    """scan (or a bump no pass saw in flight): Airflow keeps no earlier id, so it cannot be proven."""
    [bump] = find_double_bumps([ti(2)], evidence())
    assert bump.confidence == "suspected" and observe(bump, T0).severity == "warning"


def test_earlier_try_seen_not_in_flight_is_not_confirmed() -> None:
    """A removed task restored: the previous state was not an attempt in flight."""
    [bump] = find_double_bumps([ti(2)], evidence(), memory={"ti-1": replace(EARLIER, state="removed")})
    assert bump.confidence == "suspected" and bump.earlier is None


def test_a_retry_or_a_clear_has_a_history_row_and_is_not_flagged() -> None:
    hist = {("etl", "load", "manual__1", -1): frozenset({1})}
    assert find_double_bumps([ti(2)], evidence(hist), memory={"ti-1": EARLIER}) == []
    # A later bump after a real retry: try 3 with history for 1 only is the 2 -> 3 bump.
    [bump] = find_double_bumps([ti(3)], evidence(hist))
    assert bump.tries == (2, 3)


def test_first_try_and_reschedules_and_deferrals_never_qualify() -> None:
    """Try 1 (first scheduling), a reschedule or a deferral resumption (try unchanged) is no bump."""
    resumed = ti(1, "scheduled")
    assert find_double_bumps([resumed], evidence(), memory={"ti-1": replace(EARLIER, state="deferred")}) == []
    hist = {("etl", "load", "manual__1", -1): frozenset({1})}
    sensor = ti(2, "scheduled")  # up_for_reschedule keeps try 2 (after a retry of try 1)
    memory = {"ti-1": replace(sensor, state="up_for_reschedule")}
    assert find_double_bumps([sensor], evidence(hist), memory=memory) == []


def test_orphan_reset_live_is_told_apart_by_the_dead_queuer() -> None:
    """3.0/3.1 orphan reset: the previous attempt's scheduler was declared dead before try 2 was scheduled."""
    dead_b = SchedulerJob(2, "failed", T0 - timedelta(seconds=40), "scheduler-b")  # try 2 at T0 + 10 s
    assert find_double_bumps([ti(2)], evidence(jobs={1: RUNNING_A, 2: dead_b}), memory={"ti-1": EARLIER}) == []


def test_a_scheduler_that_died_after_the_bump_does_not_hide_it() -> None:
    """Its last heartbeat is after the new try was scheduled: no reset can have caused the bump."""
    late = SchedulerJob(2, "failed", T0 + timedelta(minutes=5), "scheduler-b")
    [bump] = find_double_bumps([ti(2)], evidence(jobs={1: RUNNING_A, 2: late}), memory={"ti-1": EARLIER})
    assert bump.confidence == "confirmed"


def test_orphan_reset_after_the_fact_is_a_dead_scheduler_shortly_before() -> None:
    dead = SchedulerJob(7, "failed", T0 - timedelta(seconds=40), "scheduler-c")
    assert find_double_bumps([ti(2)], evidence(jobs={1: RUNNING_A, 7: dead})) == []
    long_ago = SchedulerJob(7, "failed", T0 - timedelta(hours=2), "scheduler-c")
    assert len(find_double_bumps([ti(2)], evidence(jobs={1: RUNNING_A, 7: long_ago}))) == 1


def test_history_purged_by_db_clean_after_the_run_started_is_not_flagged() -> None:
    assert find_double_bumps([ti(2)], evidence(purges=(T0 + timedelta(days=1),))) == []
    assert len(find_double_bumps([ti(2)], evidence(purges=(T0 - timedelta(days=1),)))) == 1


def test_rows_older_than_the_history_table_are_not_flagged() -> None:
    """Written by Airflow 2 (no dag_version_id): their earlier tries were never recorded."""
    assert find_double_bumps([ti(2, dag_version_id=None)], evidence()) == []


def test_dag_filter_applies() -> None:
    assert find_double_bumps([ti(2)], evidence(), dag_filter=DagFilter(exclude=("etl",))) == []


# The orphan-reset window (Airflow's defaults: threshold 30 s, orphan check every 300 s). Try 2 is
# scheduled at AT; a dead scheduler's heartbeat HB before it.
AT = T0 + timedelta(seconds=10)
TIMING = OrphanTiming()
EPS = timedelta(microseconds=1)


def _bumps_with_dead(job: SchedulerJob, *others: SchedulerJob, memory: bool = False) -> int:
    jobs = {1: RUNNING_A, job.id: job, **{o.id: o for o in others}}
    mem = {"ti-1": replace(EARLIER, queued_by_job_id=job.id)} if memory else None
    return len(find_double_bumps([ti(2, scheduled_dttm=AT)], evidence(jobs=jobs), memory=mem))


def _declared_dead(hb: datetime) -> SchedulerJob:
    return SchedulerJob(7, "failed", hb, "scheduler-c")  # no end_date: an orphan check marked it failed


def test_a_bump_two_seconds_after_a_scheduler_stopped_heartbeating_is_reported() -> None:
    """No orphan check can declare it dead before the threshold has passed: not a reset."""
    assert _bumps_with_dead(_declared_dead(AT - timedelta(seconds=2))) == 1
    assert _bumps_with_dead(_declared_dead(AT - timedelta(seconds=2)), memory=True) == 1


def test_threshold_boundary_of_a_declared_dead_scheduler() -> None:
    """Airflow marks it failed when ``latest_heartbeat < now - threshold``: strictly after, never at."""
    at_threshold = AT - TIMING.health_check_threshold
    assert _bumps_with_dead(_declared_dead(at_threshold)) == 1  # exactly at the threshold: reported
    assert _bumps_with_dead(_declared_dead(at_threshold - EPS)) == 0  # just past it: maybe a reset
    assert _bumps_with_dead(_declared_dead(at_threshold + EPS)) == 1  # just short of it: reported
    assert _bumps_with_dead(_declared_dead(at_threshold - EPS), memory=True) == 0  # the queuer itself


def test_orphan_check_boundary_closes_the_window() -> None:
    """The reset comes at the first orphan check after the threshold, then one scheduling loop."""
    latest = AT - TIMING.health_check_threshold - TIMING.check_interval - SCHEDULING_ALLOWANCE
    assert _bumps_with_dead(_declared_dead(latest)) == 0  # exactly at the end: maybe a reset
    assert _bumps_with_dead(_declared_dead(latest + EPS)) == 0  # inside
    assert _bumps_with_dead(_declared_dead(latest - EPS)) == 1  # outside: reported


def test_a_scheduler_started_since_ran_an_orphan_check_at_its_start() -> None:
    """After an outage the first scheduler's start resets the orphans: the window reopens there."""
    dead = _declared_dead(AT - timedelta(minutes=30))
    assert _bumps_with_dead(dead) == 1
    started = SchedulerJob(9, "running", AT, "scheduler-d", start_date=AT - SCHEDULING_ALLOWANCE)
    assert _bumps_with_dead(dead, started) == 0  # started exactly one allowance before the bump
    early = replace(started, start_date=AT - SCHEDULING_ALLOWANCE - EPS)
    assert _bumps_with_dead(dead, early) == 1
    old = replace(started, start_date=AT - timedelta(minutes=40))  # started before the job could be reset
    assert _bumps_with_dead(dead, old) == 1


def test_a_scheduler_that_ended_itself_is_resettable_from_its_end() -> None:
    """A graceful stop (rolling deploy) sets end_date and state success: no threshold to wait."""
    ended = SchedulerJob(7, "success", AT - timedelta(seconds=2), "scheduler-c", end_date=AT - timedelta(seconds=2))
    assert _bumps_with_dead(ended) == 0
    assert _bumps_with_dead(replace(ended, end_date=AT)) == 1  # ended at the bump's very time
    assert _bumps_with_dead(replace(ended, end_date=AT - EPS)) == 0


def test_a_running_scheduler_never_explains_a_bump() -> None:
    assert _bumps_with_dead(SchedulerJob(7, "running", AT - timedelta(minutes=2), "scheduler-c")) == 1


def test_thresholds_are_the_settings_values() -> None:
    """A deployment with a 5 s threshold: 6 s after the heartbeat can be a reset, 4 s cannot."""
    timing = OrphanTiming(health_check_threshold=timedelta(seconds=5))
    jobs = {1: RUNNING_A, 7: _declared_dead(AT - timedelta(seconds=6))}
    assert find_double_bumps([ti(2, scheduled_dttm=AT)], evidence(jobs=jobs, timing=timing)) == []
    jobs = {1: RUNNING_A, 7: _declared_dead(AT - timedelta(seconds=4))}
    assert len(find_double_bumps([ti(2, scheduled_dttm=AT)], evidence(jobs=jobs, timing=timing))) == 1
