"""Stranded asset events (apache/airflow#56050) made by Airflow's OWN code, 3.0.6 to 3.3.2.

Why: an event that arrives after a DAG's queue row (asset_dag_run_queue) was written and before
the scheduler deletes that row is neither consumed by the run being created (it consumes events up
to the row's ``created_at``) nor queued again (the row is inserted with ON CONFLICT DO NOTHING), so
the consumer does not run for it until some later event arrives (docs/explanation/airflow-internals.md, the
stranded-events section). dupguard must report such events and nothing that merely looks like
them, so every row here is written by Airflow, and the ground truth is what Airflow recorded.

The interleaving: scheduler-a runs the run-creation step of its loop
(``SchedulerJobRunner._create_dagruns_for_dags``) in a thread and is held on a
``threading.Event`` inside ``_create_dag_runs_asset_triggered`` after its queue read and event
SELECT and before ``create_dagrun`` and the queue-row DELETE (we wrap ``DagRun.generate_run_id``,
which that function calls in between, in that thread only; Airflow's logic is unchanged). While
it is held the main thread registers e2 and e3 with ``AssetManager.register_asset_change`` and
commits; then a is released, commits its run, and one more scheduler loop runs: no run is made,
e2/e3 are consumed by no run and no queue row is left for them.

Run it through scripts/airflow/regen_stranded.sh (fresh migrated DB per scenario, dump, load
check). Reuses the version shims of scenarios_asset.py.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios_asset as sa

ORDERS, CUSTOMERS = sa.ORDERS, sa.CUSTOMERS
ALIAS = 'AssetAlias("orders_alias")'


def _dags(*parts: str) -> str:
    return sa.DAG_HEADER.replace("import DAG, Asset", "import DAG, Asset, AssetAlias") + "".join(parts)


def _consumer(dag_id: str, schedule: str, **kw: str) -> str:
    extra = "".join(f", {k}={v}" for k, v in kw.items())
    return sa.consumer_dag(dag_id, schedule).replace("catchup=False", f"catchup=False{extra}")


def consumed(af: sa.AF, dag_id: str) -> set[int]:
    return {e for r in af.runs(dag_id) for e in r["event_ids"]}


def queue_rows(af: sa.AF) -> list[dict[str, Any]]:
    from airflow.models.asset import AssetDagRunQueue

    with af.create_session() as session:
        return [
            {"asset_id": q.asset_id, "target_dag_id": q.target_dag_id, "created_at": q.created_at.isoformat()}
            for q in session.query(AssetDagRunQueue).order_by(AssetDagRunQueue.created_at)
        ]


def set_paused(af: sa.AF, dag_id: str, paused: bool) -> None:
    with af.create_session() as session:
        session.query(af.DagModel).filter_by(dag_id=dag_id).one().is_paused = paused


def cli(*argv: str) -> None:
    """One Airflow CLI command, in this process (its action logger writes the ``log`` row, ``cli_<name>``)."""
    from airflow.cli import cli_parser

    args = cli_parser.get_parser().parse_args(list(argv))
    args.func(args)


def emit_alias(af: sa.AF, producer: str, asset_name: str, alias: str) -> int:
    """A producer task that emits its asset event through an AssetAlias (outlet_events[alias])."""
    run_id = af.trigger(producer)
    with af.create_session() as session:
        ti = session.query(af.TaskInstance).filter_by(dag_id=producer, run_id=run_id).one()
        end = sa._utcnow()
        af.finish_ti(ti, end, end)
        session.merge(ti)
        asset = session.query(af.AssetModel).filter_by(name=asset_name).one()
        event = af.AssetManager.register_asset_change(
            task_instance=ti, asset=asset, source_alias_names=[alias], session=session
        )
        session.flush()
        return int(event.id)


def held_creation(af: sa.AF, runner: Any, during: Callable[[], object]) -> None:
    """``runner``'s run-creation step, held between its queue read and its DELETE while ``during`` runs."""
    reached, release = threading.Event(), threading.Event()
    original = af.DagRun.generate_run_id
    errors: list[BaseException] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "scheduler-a" and not reached.is_set():
            reached.set()
            if not release.wait(60):
                raise TimeoutError("never released")
        return original(*args, **kwargs)

    def run() -> None:
        try:
            af.create_runs(runner)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)
            reached.set()

    af.DagRun.generate_run_id = staticmethod(held)  # type: ignore[method-assign]
    try:
        t = threading.Thread(target=run, name="scheduler-a")
        t.start()
        if not reached.wait(60):
            raise TimeoutError("scheduler-a never reached run creation")
        try:
            if not errors:
                during()
        finally:
            release.set()
            t.join(60)
    finally:
        af.DagRun.generate_run_id = original  # type: ignore[method-assign]
    if errors:
        raise errors[0]


def held_emit(af: sa.AF, producer: str, asset_name: str, *, before_queue: bool) -> Callable[[], int]:
    """A producer's success in its own transaction, held open: the event is flushed (its timestamp set
    by the column default) and, with ``before_queue``, held before ``AssetManager._queue_dagruns``
    (the queue insert), else after it; the returned ``finish`` lets it queue (if held before) and
    commit, as the execution API's request does at its end (docs/explanation/airflow-internals.md, "Committed late")."""
    run_id = af.trigger(producer)
    reached, release = threading.Event(), threading.Event()
    original = af.AssetManager._queue_dagruns
    ids: list[int] = []
    errors: list[BaseException] = []

    def queue(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "producer-late" and before_queue:
            reached.set()
            if not release.wait(60):
                raise TimeoutError("never released")
        return original(*args, **kwargs)

    def run() -> None:
        try:
            with af.create_session() as session:
                ti = session.query(af.TaskInstance).filter_by(dag_id=producer, run_id=run_id).one()
                end = sa._utcnow()
                af.finish_ti(ti, end, end)
                session.merge(ti)
                asset = session.query(af.AssetModel).filter_by(name=asset_name).one()
                event = af.AssetManager.register_asset_change(task_instance=ti, asset=asset, session=session)
                ids.append(int(event.id))
                if not before_queue:
                    reached.set()
                    if not release.wait(60):
                        raise TimeoutError("never released")
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)
            reached.set()

    af.AssetManager._queue_dagruns = classmethod(queue)  # type: ignore[method-assign,assignment]
    t = threading.Thread(target=run, name="producer-late")
    t.start()
    if not reached.wait(60):
        raise TimeoutError("the producer never reached its hold")

    def finish() -> int:
        release.set()
        t.join(60)
        af.AssetManager._queue_dagruns = original  # type: ignore[method-assign]
        if errors:
            raise errors[0]
        return ids[0]

    if errors:
        finish()
    return finish


def event_times(af: sa.AF, ids: list[int]) -> dict[int, str]:
    from airflow.models.asset import AssetEvent

    with af.create_session() as session:
        rows = session.query(AssetEvent).filter(AssetEvent.id.in_(ids))
        return {int(e.id): e.timestamp.isoformat() for e in rows}


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


Truth = dict[str, Any]  # expected_stranded, notes
Scenario = tuple[str, str, Callable[[sa.AF], Truth]]


def sc_stranded_race() -> Scenario:
    files = _dags(sa.producer_dag("orders_producer", ORDERS), sa.consumer_dag("orders_consumer", f"[{ORDERS}]"))

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)  # an ordinary earlier run
        time.sleep(0.05)
        e1 = af.emit("orders_producer", "orders")
        late: list[int] = []
        held_creation(af, a, lambda: late.extend(af.emit("orders_producer", "orders") for _ in range(2)))
        time.sleep(0.05)
        af.create_runs(a)  # the next scheduler loop: nothing queued, no run
        runs = af.runs("orders_consumer")
        check(len(runs) == 2 and runs[1]["event_ids"] == [e1], f"the held run consumed e1 only: {runs}")
        check(not set(late) & consumed(af, "orders_consumer"), f"e2/e3 consumed: {runs}")
        check(not queue_rows(af), f"a queue row was left: {queue_rows(af)}")
        return {
            "expected_stranded": [
                {"dag_id": "orders_consumer", "event_ids": sorted(late), "stranding_run_id": runs[1]["run_id"]}
            ]
        }

    return (
        "One scheduler; e1 queued orders_consumer; e2 and e3 were registered while the scheduler was "
        "creating the run (held after its queue read, before its DELETE); the run consumed e1 only, the "
        "row was deleted, the next loop made no run: e2/e3 stranded.",
        files,
        body,
    )


def sc_stranded_max_active() -> Scenario:
    files = _dags(
        sa.producer_dag("orders_producer", ORDERS),
        _consumer("orders_consumer", f"[{ORDERS}]", max_active_runs="1"),
    )

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        (first,) = af.runs("orders_consumer")
        e1 = af.emit("orders_producer", "orders")  # while the first run is active: queued, no run
        late = [af.emit("orders_producer", "orders") for _ in range(2)]
        af.create_runs(a)
        check(len(af.runs("orders_consumer")) == 1, "max_active_runs=1 held the second run back")
        sa.set_run_outcome(af, "orders_consumer", first["run_id"], {"extract": 1, "load": 1}, True)
        af.create_runs(a)
        runs = af.runs("orders_consumer")
        check(len(runs) == 2 and runs[1]["event_ids"] == [e1], f"the second run consumed e1 only: {runs}")
        check(not set(late) & consumed(af, "orders_consumer") and not queue_rows(af), f"{runs}")
        return {
            "expected_stranded": [
                {"dag_id": "orders_consumer", "event_ids": sorted(late), "stranding_run_id": runs[1]["run_id"]}
            ]
        }

    return (
        "No hold needed: orders_consumer has max_active_runs=1; e1, e2, e3 arrived while its first run "
        "was active (one queue row, created at e1); when the run finished the next run consumed e1 only: "
        "e2/e3 stranded (the window is a whole run).",
        files,
        body,
    )


def sc_stranded_paused() -> Scenario:
    files = _dags(sa.producer_dag("orders_producer", ORDERS), sa.consumer_dag("orders_consumer", f"[{ORDERS}]"))

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        set_paused(af, "orders_consumer", True)
        paused = [af.emit("orders_producer", "orders") for _ in range(2)]
        check(not queue_rows(af), "a paused DAG is not queued")
        set_paused(af, "orders_consumer", False)
        af.create_runs(a)
        check(len(af.runs("orders_consumer")) == 1 and not set(paused) & consumed(af, "orders_consumer"), "")
        return {"expected_stranded": [], "notes": {"events_while_paused": paused}}

    return (
        "Two events arrived while orders_consumer was paused (Airflow queues no row for a paused DAG); "
        "it was unpaused and no run followed: not stranded (no run was created after them).",
        files,
        body,
    )


def sc_stranded_paused_run() -> Scenario:
    files = _dags(sa.producer_dag("orders_producer", ORDERS), sa.consumer_dag("orders_consumer", f"[{ORDERS}]"))

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)  # an ordinary earlier run
        time.sleep(0.05)
        e1 = af.emit("orders_producer", "orders")  # queued: the row's created_at is e1's time
        cli("dags", "pause", "orders_consumer")  # log: cli_dag_pause
        paused = [af.emit("orders_producer", "orders") for _ in range(2)]
        cli("dags", "unpause", "orders_consumer")  # log: cli_dag_unpause
        af.create_runs(a)  # the run from e1's row, created after e2 and e3
        runs = af.runs("orders_consumer")
        check(len(runs) == 2 and runs[1]["event_ids"] == [e1], f"the run consumed e1 only: {runs}")
        check(not set(paused) & consumed(af, "orders_consumer") and not queue_rows(af), f"{runs}")
        with af.create_session() as session:
            from airflow.models.log import Log

            logged = [
                {"event": r.event, "dag_id": r.dag_id, "dttm": r.dttm.isoformat()}
                for r in session.query(Log).filter(Log.event.in_(["cli_dag_pause", "cli_dag_unpause"])).order_by(Log.id)
            ]
        check([r["event"] for r in logged] == ["cli_dag_pause", "cli_dag_unpause"], f"log rows: {logged}")
        return {"expected_stranded": [], "notes": {"events_while_paused": paused, "pause_log": logged}}

    return (
        "e1 queued orders_consumer; `airflow dags pause`; e2 and e3 arrived while it was paused (no queue "
        "row: Airflow queues nothing for a paused DAG); `airflow dags unpause`; the scheduler made the run "
        "of e1's row (it consumed e1 only, created after e2 and e3). Not stranded: e2 and e3 were "
        "registered while the DAG was paused (the log's cli_dag_pause / cli_dag_unpause rows say so).",
        files,
        body,
    )


def sc_stranded_alias() -> Scenario:
    producer = sa.producer_dag("alias_producer", ALIAS)
    files = _dags(
        sa.producer_dag("orders_producer", ORDERS),
        producer,
        sa.consumer_dag("alias_consumer", f"[{ALIAS}]"),
    )

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        ev = [emit_alias(af, "alias_producer", "orders", "orders_alias") for _ in range(2)]
        af.create_runs(a)
        time.sleep(0.05)
        ev.append(emit_alias(af, "alias_producer", "orders", "orders_alias"))
        af.create_runs(a)
        return {
            "expected_stranded": [],
            "notes": {"alias_events": ev, "consumed": sorted(consumed(af, "alias_consumer"))},
        }

    return (
        "alias_consumer is scheduled on an AssetAlias; a producer emits orders events through the alias "
        "(3.0.6 runs consume only events of directly scheduled assets, so alias events stay unconsumed "
        "there): not stranded events of a scheduled asset.",
        files,
        body,
    )


def sc_stranded_catchup_floor() -> Scenario:
    only_producer = _dags(sa.producer_dag("orders_producer", ORDERS))
    files = _dags(sa.producer_dag("orders_producer", ORDERS), sa.consumer_dag("orders_consumer", f"[{ORDERS}]"))

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        folder = Path(af.settings.DAGS_FOLDER)
        (folder / "fixture_dags.py").write_text(only_producer)
        af.sync_dags(folder)
        early = [af.emit("orders_producer", "orders") for _ in range(2)]  # before the consumer exists
        time.sleep(0.05)
        (folder / "fixture_dags.py").write_text(files)
        af.sync_dags(folder)
        time.sleep(0.05)
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        return {
            "expected_stranded": [],
            "notes": {"events_before_consumer": early, "consumed": sorted(consumed(af, "orders_consumer"))},
        }

    return (
        "Two orders events before orders_consumer was deployed, then one after and its run. With catchup "
        "off, 3.3 floors the first run's events at the DAG's asset reference (its backlog is skipped on "
        "purpose); earlier versions consume the backlog. Not stranded.",
        only_producer,
        body,
    )


def sc_stranded_and_waiting() -> Scenario:
    files = _dags(
        sa.producer_dag("orders_producer", ORDERS),
        sa.producer_dag("customers_producer", CUSTOMERS),
        sa.consumer_dag("orders_x_customers", f"({ORDERS} & {CUSTOMERS})"),
    )

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.emit("customers_producer", "customers")
        af.create_runs(a)
        time.sleep(0.05)
        waiting = [af.emit("orders_producer", "orders") for _ in range(2)]
        af.create_runs(a)  # orders queued, customers not: condition not satisfied, no run
        af.trigger("orders_x_customers")  # a manual run after them (not asset-triggered)
        check(len(queue_rows(af)) == 1, f"{queue_rows(af)}")
        return {"expected_stranded": [], "notes": {"waiting_for_customers": waiting}}

    return (
        "orders_x_customers (orders & customers) had a run; two orders events came, customers did not: "
        "the orders queue row waits for the condition; a manual run came after. Not stranded.",
        files,
        body,
    )


def sc_stranded_cleared() -> Scenario:
    files = _dags(sa.producer_dag("orders_producer", ORDERS), sa.consumer_dag("orders_consumer", f"[{ORDERS}]"))

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        (run,) = af.runs("orders_consumer")
        sa.set_run_outcome(af, "orders_consumer", run["run_id"], {"extract": 1, "load": 1}, True)
        set_paused(af, "orders_consumer", True)
        paused = af.emit("orders_producer", "orders")
        set_paused(af, "orders_consumer", False)
        time.sleep(0.05)
        with af.create_session() as session:
            tis = session.query(af.TaskInstance).filter_by(dag_id="orders_consumer", run_id=run["run_id"]).all()
            af.clear_task_instances(tis, session)
        (after,) = af.runs("orders_consumer")
        check(after["clear_number"] == 1, f"{after}")
        return {"expected_stranded": [], "notes": {"event_before_clear": paused}}

    return (
        "orders_consumer's asset run succeeded; an event came while the DAG was paused (no queue row); "
        "then the old run was cleared (queued again, queued_at now later than the event). A cleared run "
        "is not a run created after the event: not stranded.",
        files,
        body,
    )


def sc_stranded_late_commit() -> Scenario:
    files = _dags(sa.producer_dag("orders_producer", ORDERS), sa.consumer_dag("orders_consumer", f"[{ORDERS}]"))

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)  # an ordinary earlier run
        time.sleep(0.05)
        finish = held_emit(af, "orders_producer", "orders", before_queue=True)
        time.sleep(0.05)
        e2 = af.emit("orders_producer", "orders")  # committed, queued: row created after late's timestamp
        af.create_runs(a)  # the run: late is in its window by timestamp, but not committed yet
        late = finish()  # late's own queue row (the old one was deleted), then its commit
        af.create_runs(a)  # the next loop: a run from late's row, whose window starts after late
        runs = af.runs("orders_consumer")
        check(len(runs) == 3 and runs[1]["event_ids"] == [e2], f"the run consumed e2 only: {runs}")
        check(runs[2]["event_ids"] == [], f"late's own row made a run that consumed nothing: {runs}")
        check(late not in consumed(af, "orders_consumer") and not queue_rows(af), f"{runs} {queue_rows(af)}")
        times = event_times(af, [late, e2])
        check(times[late] <= runs[1]["run_after"], f"late is inside the run's window: {times} {runs}")
        return {
            "expected_stranded": [],
            "expected_committed_late": [
                {"dag_id": "orders_consumer", "event_ids": [late], "window_run_id": runs[1]["run_id"]}
            ],
            "notes": {"late_event": late, "timestamps": times},
        }

    return (
        "One scheduler; a producer's transaction flushed event late (timestamp set) and was held before "
        "its queue insert; e2 was registered and committed meanwhile (its row created after late's "
        "timestamp) and the scheduler made the run: it consumed e2 only (late not committed yet). The "
        "producer then queued its own row and committed; the next loop made a run from that row whose "
        "window starts at the first run's run_after: it consumed nothing. late is lost for good.",
        files,
        body,
    )


def sc_stranded_late_next_window() -> Scenario:
    files = _dags(sa.producer_dag("orders_producer", ORDERS), sa.consumer_dag("orders_consumer", f"[{ORDERS}]"))

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        time.sleep(0.05)
        e2 = af.emit("orders_producer", "orders")
        time.sleep(0.05)
        finish = held_emit(af, "orders_producer", "orders", before_queue=True)  # after e2's row
        af.create_runs(a)
        late = finish()
        af.create_runs(a)
        runs = af.runs("orders_consumer")
        check(len(runs) == 3 and runs[1]["event_ids"] == [e2], f"{runs}")
        check(runs[2]["event_ids"] == [late], f"the next run consumed late: {runs}")
        return {"expected_stranded": [], "expected_committed_late": [], "notes": {"late_event": late}}

    return (
        "As stranded_late_commit, but late was flushed after e2's queue row was written: late's timestamp "
        "is after the run's run_after, so the run its own row makes consumes it. Committed late, not lost.",
        files,
        body,
    )


def sc_stranded_late_own_row() -> Scenario:
    files = _dags(
        sa.producer_dag("orders_producer", ORDERS),
        sa.producer_dag("customers_producer", CUSTOMERS),
        sa.consumer_dag("orders_or_customers", f"({ORDERS} | {CUSTOMERS})"),
    )

    def body(af: sa.AF) -> Truth:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        time.sleep(0.05)
        finish = held_emit(af, "orders_producer", "orders", before_queue=False)  # row written, held
        time.sleep(0.05)
        ec = af.emit("customers_producer", "customers")  # another asset's row: no conflict with late's
        af.create_runs(a)  # sees the customers row only, deletes what it saw
        late = finish()  # late's orders row (created before that run's run_after) is still there
        af.create_runs(a)
        runs = af.runs("orders_or_customers")
        check(len(runs) == 3 and runs[1]["event_ids"] == [ec], f"{runs}")
        check(late in consumed(af, "orders_or_customers"), f"late's own row made a run reaching back: {runs}")
        return {"expected_stranded": [], "expected_committed_late": [], "notes": {"late_event": late}}

    return (
        "orders_or_customers (orders | customers): a producer's transaction wrote late and its orders "
        "queue row and was held; customers's event was committed and the scheduler made a run from its "
        "row (late not visible; its row not deleted). After the commit late's row, older than that run's "
        "run_after, made a run whose window reaches back over late: consumed, not lost.",
        files,
        body,
    )


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "stranded_late_commit": sc_stranded_late_commit,
    "stranded_late_next_window": sc_stranded_late_next_window,
    "stranded_late_own_row": sc_stranded_late_own_row,
    "stranded_race": sc_stranded_race,
    "stranded_max_active": sc_stranded_max_active,
    "stranded_paused": sc_stranded_paused,
    "stranded_paused_run": sc_stranded_paused_run,
    "stranded_alias": sc_stranded_alias,
    "stranded_catchup_floor": sc_stranded_catchup_floor,
    "stranded_and_waiting": sc_stranded_and_waiting,
    "stranded_cleared": sc_stranded_cleared,
}


def main() -> None:
    sa.SCENARIOS.clear()
    for name, make in SCENARIOS.items():

        def adapt(make: Callable[[], Scenario] = make) -> sa.Scenario:
            description, files, body = make()
            truth: dict[str, Any] = {}

            def run(af: sa.AF) -> list[dict[str, Any]]:
                truth.update(body(af))
                truth["queue_rows"] = queue_rows(af)
                return []  # no duplicate groups in any of these

            sa.EXTRA_TRUTH = truth
            return description, files, run

        sa.SCENARIOS[name] = adapt
    sa.main()


if __name__ == "__main__":
    main()
