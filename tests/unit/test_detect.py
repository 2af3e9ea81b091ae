"""The pure detection core: what is and is not a duplicate group, and which run is kept."""

from __future__ import annotations

from datetime import timedelta

from detector.core.detect import DagFilter, find_duplicates
from detector.core.model import Confidence, Kind, TaskProgress
from tests.factories import T0, run


def test_asset_pair_with_identical_events_is_confirmed() -> None:
    """Two asset runs of one DAG with equal run_after and equal events form one confirmed group."""
    a, b = run(id=10, job=1), run(id=11, job=2)
    [f] = find_duplicates([a, b], {10: frozenset({5}), 11: frozenset({5})})
    assert (f.kind, f.confidence) == (Kind.ASSET, Confidence.CONFIRMED)
    assert f.kept == a and f.duplicates == (b,)
    assert f.shared_event_ids == (5,)
    assert f.creating_job_ids == (1, 2)


def test_asset_pair_with_different_events_is_only_suspected() -> None:
    """Equal run_after but different consumed events is reported, never confirmed."""
    a, b = run(id=10), run(id=11)
    [f] = find_duplicates([a, b], {10: frozenset({5}), 11: frozenset({6})})
    assert f.confidence is Confidence.SUSPECTED
    assert f.shared_event_ids == ()


def test_asset_pair_without_events_is_not_confirmed() -> None:
    """Without consumed events there is nothing to confirm the shared trigger."""
    [f] = find_duplicates([run(id=10), run(id=11)], {})
    assert f.confidence is Confidence.SUSPECTED


def test_keep_rule_prefers_a_started_run_over_a_lower_id() -> None:
    """If only the later run has started tasks, it is kept and the earlier one is the duplicate."""
    a, b = run(id=10), run(id=11)
    events = {10: frozenset({5}), 11: frozenset({5})}
    [f] = find_duplicates([a, b], events, {11: TaskProgress(total=2, started=1)})
    assert f.kept == b and f.duplicates == (a,)


def test_keep_rule_is_independent_of_input_order() -> None:
    """Replicas may fetch rows in any order; they must agree on the kept run."""
    rows = [run(id=i) for i in (30, 12, 21)]
    events = {r.id: frozenset({1}) for r in rows}
    forward = find_duplicates(rows, events)
    backward = find_duplicates(list(reversed(rows)), events)
    assert forward == backward
    assert forward[0].kept.id == 12
    assert [d.id for d in forward[0].duplicates] == [21, 30]


def test_triple_counts_every_extra_run_as_duplicate() -> None:
    """Three schedulers can make three runs; two of them are duplicates."""
    rows = [run(id=i) for i in (1, 2, 3)]
    [f] = find_duplicates(rows, {r.id: frozenset({9}) for r in rows})
    assert len(f.duplicates) == 2


def test_successive_runs_and_fanout_are_not_flagged() -> None:
    """Different run_after values, or the same run_after in different DAGs, are ordinary runs."""
    rows = [
        run("consumer", T0, id=1),
        run("consumer", T0 + timedelta(seconds=30), id=2),
        run("other_consumer", T0, id=3),
        run("third_consumer", T0, id=4),
    ]
    events = {1: frozenset({1}), 2: frozenset({2}), 3: frozenset({1}), 4: frozenset({1})}
    assert find_duplicates(rows, events) == []


def test_non_asset_runs_are_ignored() -> None:
    """Manual, scheduled and backfill runs never join a group, even at the same moment."""
    rows = [run(id=1), run(id=2, run_type="manual"), run(id=3, run_type="scheduled"), run(id=4, run_type="backfill")]
    assert find_duplicates(rows, {i: frozenset({1}) for i in range(1, 5)}) == []


def test_premature_and_condition_run_is_not_flagged() -> None:
    """A stale-snapshot run of an AND-condition DAG has a later run_after and disjoint events."""
    rows = [run("join", T0, id=1), run("join", T0 + timedelta(milliseconds=3), id=2)]
    assert find_duplicates(rows, {1: frozenset({1, 2}), 2: frozenset({3})}) == []


def test_dag_filters_apply_include_then_exclude() -> None:
    """Only DAGs matching an include glob and no exclude glob are judged."""
    rows = [run(d, T0, id=i) for i, d in enumerate(["etl_a", "etl_a", "etl_b", "etl_b", "ml_c", "ml_c"], 1)]
    events = {r.id: frozenset({1}) for r in rows}
    found = find_duplicates(rows, events, dag_filter=DagFilter(include=("etl_*",), exclude=("*_b",)))
    assert [f.dag_id for f in found] == ["etl_a"]


def test_partitioned_pair_with_same_events_is_confirmed_despite_run_after_gap() -> None:
    """3.2 partitioned duplicates stamp their own utcnow(): run_after differs by milliseconds."""
    a = run(id=1, partition_key="2026-03-12", run_after=T0)
    b = run(id=2, partition_key="2026-03-12", run_after=T0 + timedelta(milliseconds=3))
    [f] = find_duplicates([a, b], {1: frozenset({7, 8}), 2: frozenset({7, 8})})
    assert (f.kind, f.confidence, f.partition_key) == (Kind.PARTITIONED, Confidence.CONFIRMED, "2026-03-12")
    assert f.kept == a and f.shared_event_ids == (7, 8)


def test_partition_rerun_with_new_events_is_suspected_only_within_window() -> None:
    """A partition re-run for new data is suspected when close in time, ignored when far apart."""
    a = run(id=1, partition_key="p", run_after=T0)
    b = run(id=2, partition_key="p", run_after=T0 + timedelta(seconds=20))
    c = run(id=3, partition_key="p", run_after=T0 + timedelta(hours=2))
    events = {1: frozenset({1}), 2: frozenset({2}), 3: frozenset({3})}
    [f] = find_duplicates([a, b, c], events, suspect_window=timedelta(seconds=60))
    assert f.confidence is Confidence.SUSPECTED
    assert {r.id for r in f.runs} == {1, 2}


def test_partitioned_fanout_to_several_keys_is_not_flagged() -> None:
    """One event mapped to several target partition keys makes one run per key."""
    rows = [run(id=i, partition_key=k) for i, k in enumerate(["a", "b", "c"], 1)]
    assert find_duplicates(rows, {i: frozenset({1}) for i in (1, 2, 3)}) == []


def test_confirmed_partition_group_and_a_rerun_do_not_repeat_runs() -> None:
    """A confirmed pair plus a close re-run yields the confirmed group and one suspected group of two."""
    a = run(id=1, partition_key="p", run_after=T0)
    b = run(id=2, partition_key="p", run_after=T0 + timedelta(milliseconds=2))
    c = run(id=3, partition_key="p", run_after=T0 + timedelta(seconds=10))
    found = find_duplicates([a, b, c], {1: frozenset({1}), 2: frozenset({1}), 3: frozenset({2})})
    by_conf = {f.confidence: f for f in found}
    assert {r.id for r in by_conf[Confidence.CONFIRMED].runs} == {1, 2}
    assert {r.id for r in by_conf[Confidence.SUSPECTED].runs} == {1, 3}


def test_impact_sums_task_seconds_of_duplicates_only() -> None:
    """The impact of a group is what its duplicates ran, not the kept run."""
    a, b = run(id=1), run(id=2)
    progress = {1: TaskProgress(total=1, started=1, task_seconds=30.0), 2: TaskProgress(1, 1, 0, 12.5)}
    [f] = find_duplicates([a, b], {1: frozenset({1}), 2: frozenset({1})}, progress)
    assert f.duplicate_task_seconds == 12.5


def test_group_key_is_stable_as_the_group_grows() -> None:
    """A third run joining later keeps the key, so nothing is alerted twice."""
    a, b, c = run(id=1), run(id=2), run(id=3)
    events = {i: frozenset({4}) for i in (1, 2, 3)}
    [before] = find_duplicates([a, b], events)
    [after] = find_duplicates([a, b, c], events)
    assert before.key == after.key


# --- the overlap race: shared events, different run_after -----------------------------------------
# scheduler-b read the queue when only asset 1's row existed (run_after t1); scheduler-a read both
# rows and created run_after t2 > t1 with {e1, e2} first (lower id); b then created t1 with {e1}.
T1, T2 = T0, T0 + timedelta(milliseconds=180)


def test_runs_sharing_an_event_with_different_run_after_are_one_confirmed_group() -> None:
    """The overlap pair is one group; the run that consumed every event is kept."""
    a, b = run(id=5, run_after=T2, job=1), run(id=6, run_after=T1, job=2)
    [f] = find_duplicates([a, b], {5: frozenset({1, 2}), 6: frozenset({1})})
    assert (f.kind, f.confidence) == (Kind.ASSET, Confidence.CONFIRMED)
    assert f.kept == a and f.duplicates == (b,)
    assert f.shared_event_ids == (1,)
    assert f.run_after == T1
    assert f.key == f"asset|consumer|{T2.isoformat()}"  # the first run's run_after, as for exact pairs


def test_the_run_covering_every_event_is_kept_even_if_the_other_started() -> None:
    """Stopping the run with both events would leave e2 unprocessed: it is kept, whatever started."""
    a, b = run(id=5, run_after=T2), run(id=6, run_after=T1)
    progress = {6: TaskProgress(total=2, started=1)}
    [f] = find_duplicates([b, a], {5: frozenset({1, 2}), 6: frozenset({1})}, progress)
    assert f.kept == a and f.duplicates == (b,)
    # also when the covering run has the higher id
    c, d = run(id=7, run_after=T1), run(id=8, run_after=T2)
    [g] = find_duplicates([c, d], {7: frozenset({3}), 8: frozenset({3, 4})})
    assert g.kept == d and g.confidence is Confidence.CONFIRMED


def test_a_partial_overlap_is_only_suspected() -> None:
    """{1, 2} and {2, 3}: no run covers the group, so stopping either would lose an event."""
    a, b = run(id=5, run_after=T2), run(id=6, run_after=T1)
    [f] = find_duplicates([a, b], {5: frozenset({1, 2}), 6: frozenset({2, 3})})
    assert f.confidence is Confidence.SUSPECTED
    assert f.shared_event_ids == (2,)


def test_same_run_after_with_a_subset_of_events_is_confirmed_keeping_the_superset() -> None:
    """Equal run_after, one run missing an event: a race; the run with every event is kept."""
    a, b = run(id=5), run(id=6)
    [f] = find_duplicates([a, b], {5: frozenset({1}), 6: frozenset({1, 2})})
    assert f.confidence is Confidence.CONFIRMED
    assert f.kept == b and f.duplicates == (a,)


def test_overlap_group_key_is_stable_as_it_grows_and_chains_are_one_group() -> None:
    """A third run linked only through the second (a chain) joins the same group under the same key."""
    a = run(id=5, run_after=T2)
    b = run(id=6, run_after=T1)
    c = run(id=7, run_after=T1 + timedelta(milliseconds=1))
    events = {5: frozenset({1, 2}), 6: frozenset({1}), 7: frozenset({2})}
    [before] = find_duplicates([a, b], events)
    [after] = find_duplicates([a, b, c], events)
    assert before.key == after.key
    assert {r.id for r in after.runs} == {5, 6, 7} and after.kept == a


def test_events_link_runs_of_one_dag_only_and_never_partitioned_runs() -> None:
    """Fan-out (one event, several DAGs) and one event mapped to several partition keys are legitimate."""
    rows = [run("d1", T1, id=1), run("d2", T2, id=2), run("p", T1, id=3, partition_key="k1")]
    rows.append(run("p", T2, id=4, partition_key="k2"))
    assert find_duplicates(rows, {i: frozenset({9}) for i in (1, 2, 3, 4)}) == []
