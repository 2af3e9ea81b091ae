"""Duplicate asset events of one message, one per triggerer copy, made by Airflow's OWN code (the trigger_event
check).

Why: up to 3.2.1 every triggerer claims and runs the same asset trigger (docs/explanation/airflow-internals.md,
"Triggers claimed by every triggerer"), and ``Trigger.submit_event`` checks no owner, so one message becomes one
``asset_event`` per copy (same doc, "One message, one asset event per triggerer"). When the consumer's run is made
between the two, the second event makes a second run:
a duplicate run today's ``asset`` rule does not link (the runs share no event). dupguard links them
by the message id in the payload, and must leave alone what merely looks like it.

Every row is written by Airflow: the DAG parsed by its DAG-processing code (which creates the
trigger and its ``asset_trigger``/``asset_watcher`` row), two ``TriggererJob`` rows whose loops are
the database part of ``load_triggers`` (``scenarios_triggers.claim``'s steps:
``Trigger.assign_unassigned`` then ``Trigger.ids_for_triggerer``), the trigger run as the triggerer
runs it (class from the row's classpath, kwargs from the row, first event of ``run()``) by each
triggerer whose ``ids_for_triggerer`` returned it, its event submitted with
``Trigger.submit_event``, the consumer's runs made by ``SchedulerJobRunner._create_dagruns_for_dags``,
a REST event by the route function ``create_asset_event``. The trigger is
``queue_triggers.QueueFileTrigger`` (a payload of a real provider's shape, see that module), or for
``trigger_event_file_alike`` the standard provider's own ``FileDeleteTrigger`` (the end-to-end watcher).

The ground truth is what Airflow recorded: which triggerer's copy submitted which event, of which
message (we delivered it), and which run consumed each event. ``expected_groups``: a message whose
events (with an id in the payload) were consumed by two runs; ``suspected_groups``: the same where
the payload carries no id (dupguard cannot prove it); ``duplicate_events``: every message that
became more than one event; ``expected_stranded``: copies consumed by no run (see ``stranded``).

Run through scripts/airflow/regen_trigger_event.sh (fresh migrated DB per scenario, dump, load check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios_asset as sa
import scenarios_triggers as st  # sets the triggerer environment before Airflow is imported

QUEUE = Path(os.environ["AIRFLOW_HOME"]) / "queue.json"  # af.sh sets it (stable per scenario)
DROP = Path(os.environ["AIRFLOW_HOME"]) / "orders.ready"  # the file FileDeleteTrigger waits for
DAG_FILE = """\
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.triggers.file import FileDeleteTrigger
from airflow.sdk import DAG, Asset, AssetWatcher
from queue_triggers import QueueFileTrigger

orders = Asset(name="orders", uri="sqs://orders", watchers=[{watchers}])
with DAG("orders_consumer", schedule=[orders], catchup=False):
    EmptyOperator(task_id="load")
"""
# trigger_event_no_id_absorbed: a second asset with its own watcher, so that one run can consume a copy
# of orders' message and a new customers message (a run consumes the events up to its DAG's latest queue
# row, and a copy of one asset arriving after that asset's row waits for the next run).
DAG_FILE_TWO_ASSETS = DAG_FILE.replace(
    'with DAG("orders_consumer", schedule=[orders], catchup=False):',
    """customers = Asset(name="customers", uri="redis://customers", watchers=[CUSTOMERS_WATCHER])
with DAG("orders_consumer", schedule=(orders | customers), catchup=False):""",
)
BODY = '{"order": 42}'
CUSTOMERS_QUEUE = Path(os.environ["AIRFLOW_HOME"]) / "customers.json"
# Where a custom watcher's payload keeps its id: the value the tests give dupguard's message_id_paths.
MESSAGE_ID_PATHS = "orders=payload.meta.id"


def sqs_message(message_id: str, receipt: str) -> dict[str, Any]:
    import hashlib

    return {
        "MessageId": message_id,
        "ReceiptHandle": receipt,  # SQS gives each receive of a message a new receipt handle
        "MD5OfBody": hashlib.md5(BODY.encode()).hexdigest(),  # noqa: S324 - SQS's own checksum
        "Body": BODY,
    }


REDIS_MESSAGE = {"channel": "orders", "data": BODY}
CUSTOM_MESSAGE = {"meta": {"id": "ord-7f3c2a91", "source": "orders-service"}, "body": {"order": 42}}

SCENARIOS = {
    "trigger_event_two_runs": (
        "sqs",
        "Two alive triggerers run the orders AssetWatcher (SQS-shaped payload). Triggerer-a's copy "
        "receives message M1 and submits its event; the scheduler makes orders_consumer's run; "
        "triggerer-b's copy receives M1 again (same MessageId, new ReceiptHandle) and submits; the "
        "scheduler makes a second run. Up to 3.2.1 both copies run: a duplicate run; 3.2.2+ only "
        "triggerer-a runs the trigger: one event, one run.",
    ),
    "trigger_event_one_run": (
        "sqs",
        "Both copies submit M1 before the scheduler's next loop: one run, which consumes the first copy "
        "only (the queue row keeps the first copy's time); the second copy is consumed by no run and "
        "no queue row is left for it (stranded: an event that triggers nothing): no duplicate run, nothing to stop.",
    ),
    "trigger_event_distinct_ids": (
        "sqs",
        "Look-alike: triggerer-a's copy receives M1, a run follows; triggerer-b's copy receives M2, "
        "another message with an equal body and its own MessageId; a second run. Two real messages.",
    ),
    "trigger_event_no_id": (
        "redis",
        "Both copies receive the same Redis pub/sub message (the payload has no id) and each event "
        "makes a run: one message twice, which only the payload's equality shows (suspected).",
    ),
    "trigger_event_no_id_absorbed": (
        "redis",
        "Both triggerers run the orders watcher (Redis pub/sub payload, no id); triggerer-a's copy submits "
        "M1, a run follows; triggerer-b's copy submits M1 again, then a new, different message M2 arrives "
        "on customers (its own watcher, schedule orders | customers); one run consumes both: the copy was "
        "absorbed by a run that M2 needed anyway, no extra run.",
    ),
    "trigger_event_custom_id": (
        "custom",
        "Both triggerers run the orders watcher, a custom trigger whose payload keeps the message's own id "
        "at meta.id; triggerer-a's copy submits M1, a run follows; triggerer-b's copy submits M1 again (same "
        "id), a second run: an extra run that only the id, named by message_id_paths, proves.",
    ),
    "trigger_event_file_alike": (
        "file",
        "Look-alike, the end-to-end run's watcher: both triggerers run the orders AssetWatcher, a real "
        "FileDeleteTrigger (payload true). Triggerer-a's copy finds file 1, deletes it and submits; a run "
        "follows; file 1 is gone for triggerer-b's copy, which finds file 2 (a second real message, the "
        "same payload) and submits; a second run. The copies compete for a file: no message twice.",
    ),
    "trigger_event_no_id_one_triggerer": (
        "redis",
        "Look-alike: one triggerer only; two Redis pub/sub messages with equal bodies are published, "
        "each becomes one event and one run. No copy: no second triggerer ran the trigger.",
    ),
    "trigger_event_manual": (
        "sqs",
        "Look-alike: triggerer-a's copy submits M1, a run follows; then an operator posts an asset "
        "event with the same extra through the REST API (Airflow adds from_rest_api); a second run.",
    ),
}


def write_queue(message: dict[str, Any]) -> None:
    QUEUE.write_text(json.dumps(message))


def last_event_id() -> int:
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return int(session.scalar(select(func.max(AssetEvent.id))) or 0)


def deliver(owned: list[int], trigger_id: int) -> int | None:
    """The copy of a triggerer whose ``ids_for_triggerer`` returned the trigger runs it and submits
    its first event (``TriggerRunner.create_triggers`` inflates the class from the row); None if
    this triggerer does not run it."""
    import importlib

    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    if trigger_id not in owned:
        return None
    with create_session() as session:
        row = session.get(Trigger, trigger_id)
        classpath, kwargs = row.classpath, dict(row.kwargs)
    module, _, name = classpath.rpartition(".")  # what import_string does (it moved in 3.2)
    trigger = getattr(importlib.import_module(module), name)(**kwargs)

    async def first() -> Any:
        async for event in trigger.run():
            return event

    before = last_event_id()
    Trigger.submit_event(trigger_id, asyncio.run(first()))
    after = last_event_id()
    return after if after > before else None


def rest_event(extra: dict[str, Any]) -> int:
    """An operator's POST /api/v2/assets/events, through the route's own function and body model."""
    from airflow.api_fastapi.core_api.datamodels.assets import CreateAssetEventsBody
    from airflow.api_fastapi.core_api.routes.public.assets import create_asset_event
    from airflow.models.asset import AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        asset_id = session.scalar(select(AssetModel.id).where(AssetModel.name == "orders"))
        return int(create_asset_event(CreateAssetEventsBody(asset_id=asset_id, extra=extra), session).id)


def event_extra(event_id: int) -> dict[str, Any]:
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    with create_session() as session:
        return dict(session.get(AssetEvent, event_id).extra)


def body(name: str, af: sa.AF) -> dict[str, Any]:
    """Returns the message each event carried (our delivery) and the runs Airflow made."""
    shape = SCENARIOS[name][0]
    st.WATCHER = f"AssetWatcher(name='orders_watcher', trigger=QueueFileTrigger(path='{QUEUE}', shape='{shape}'))"
    if shape == "file":
        st.WATCHER = (
            f"AssetWatcher(name='orders_watcher', trigger=FileDeleteTrigger(filepath='{DROP}', poke_interval=0.1))"
        )
    st.DAG_FILE, st.CONSUMERS = DAG_FILE, ["orders_consumer"]
    first = sqs_message("5fea7756-0ea4-451a-a703-a558b933e274", "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a-1")
    write_queue({"sqs": first, "custom": CUSTOM_MESSAGE}.get(shape, REDIS_MESSAGE))
    if name == "trigger_event_no_id_absorbed":
        trigger = f"QueueFileTrigger(path='{CUSTOMERS_QUEUE}', shape='redis')"
        customers = f"AssetWatcher(name='customers_watcher', trigger={trigger})"
        st.DAG_FILE = DAG_FILE_TWO_ASSETS.replace("CUSTOMERS_WATCHER", customers)
    st.write_dags(with_watcher=True)
    triggers = _trigger_ids()
    trigger_id = triggers[str(QUEUE)]
    sched = af.new_scheduler("scheduler-a")
    a = st.new_triggerer("triggerer-a")
    b = None if name == "trigger_event_no_id_one_triggerer" else st.new_triggerer("triggerer-b")
    st.heartbeat(a)
    owned_a = st.load_triggers(a)
    owned_b: list[int] = []
    if b is not None:
        st.heartbeat(b)
        owned_b = st.load_triggers(b)
    messages: dict[int, str] = {}  # event id -> the message it carried (what we delivered)
    message_id = {"sqs": first["MessageId"], "redis": "redis-1", "file": "file-1", "custom": "custom-1"}[shape]
    if shape == "file":
        DROP.write_text("1")  # file 1: the message

    def copy(owned: list[int], mid: str, trigger: int = trigger_id) -> None:
        event = deliver(owned, trigger)
        if event is not None:
            messages[event] = mid

    copy(owned_a, message_id)
    if name != "trigger_event_one_run":
        af.create_runs(sched)
        time.sleep(0.05)
    file_1_left = DROP.exists()  # what triggerer-b's copy could still find of file 1
    if name == "trigger_event_file_alike":
        DROP.write_text("2")  # file 2: another message, the same payload (true)
        copy(owned_b, "file-2")
    elif name == "trigger_event_no_id_one_triggerer":
        copy(owned_a, "redis-2")  # a second message published with an equal body
    elif name == "trigger_event_distinct_ids":
        write_queue(sqs_message("9b1c8f4e-2f0a-4c55-8d7e-0e6b1d9a7c31", "AQEBzT0pQm4n7Vx2L9sR-2"))
        copy(owned_b, "9b1c8f4e-2f0a-4c55-8d7e-0e6b1d9a7c31")
    elif name == "trigger_event_no_id_absorbed":
        copy(owned_b, message_id)  # M1 again: it queues the run
        CUSTOMERS_QUEUE.write_text(json.dumps({"channel": "customers", "data": '{"customer": 7}'}))
        copy(owned_a, "redis-2", triggers[str(CUSTOMERS_QUEUE)])  # M2, a new message: the same run takes it
    elif name == "trigger_event_manual":
        (event,) = messages
        messages[rest_event(event_extra(event))] = "rest"
    else:
        if shape == "sqs":
            write_queue(sqs_message(message_id, "AQEBkX3vN8pLq2Ty5Rw-2"))  # M1 received again
        copy(owned_b, message_id)
    af.create_runs(sched)
    return {
        "trigger_id": trigger_id,
        "ids_for_triggerer": {"triggerer-a": owned_a, "triggerer-b": owned_b},
        "messages": messages,
        "shape": shape,
        "file_1_left_for_triggerer_b": file_1_left if shape == "file" else None,
    }


def _trigger_ids() -> dict[str, int]:
    """The triggers the DAG parse created, by the queue file each reads."""
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(Trigger)).all()
        found = {str(row.kwargs.get("path") or row.kwargs.get("filepath")): row.id for row in rows}
    if str(DROP) in found:  # the file watcher stands for the orders queue
        found[str(QUEUE)] = found.pop(str(DROP))
    return found


def truth(af: sa.AF, done: dict[str, Any]) -> dict[str, Any]:
    """Groups from Airflow's records: the runs that consumed the events of one delivered message.

    A run is extra only when every event it consumed carries a message an earlier run (by id) had
    already consumed through another event: a run that also consumed a new message was needed anyway
    (it absorbed the copy). ``extra_run_ids`` names those; a set of copies without one is no group."""
    runs = sorted((r for r in af.runs("orders_consumer") if r["run_type"] == "asset_triggered"), key=lambda r: r["id"])
    message_of = {event: mid for event, mid in done["messages"].items() if mid != "rest"}
    by_message: dict[str, list[int]] = {}
    for event, mid in message_of.items():
        by_message.setdefault(mid, []).append(event)
    seen: set[str] = set()  # the messages earlier runs consumed
    extra: set[str] = set()
    for r in runs:
        carried = [message_of.get(e) for e in r["event_ids"]]
        if carried and all(m is not None and m in seen for m in carried):
            extra.add(r["run_id"])
        seen.update(m for m in carried if m is not None)
    expected, suspected, custom, duplicates = [], [], [], []
    for mid, events in sorted(by_message.items()):
        if len(events) < 2:
            continue
        duplicates.append({"message": mid, "event_ids": sorted(events)})
        consumers = [r for r in runs if set(r["event_ids"]) & set(events)]
        if len(consumers) < 2:
            continue
        group = {
            "dag_id": "orders_consumer",
            "run_ids": [r["run_id"] for r in consumers],
            "first_run_id": consumers[0]["run_id"],
            "extra_run_ids": [r["run_id"] for r in consumers if r["run_id"] in extra],
            "shared_event_ids": sorted(events),
            "run_after": consumers[0]["run_after"],
            "creating_job_ids": [r["creating_job_id"] for r in consumers],
        }
        if done["shape"] == "sqs":
            expected.append({**group, "kind": "trigger_event", "confidence": "confirmed"})
        elif done["shape"] == "custom":  # proven only with dupguard's message_id_paths naming meta.id
            custom.append({**group, "kind": "trigger_event", "confidence": "confirmed"})
        elif group["extra_run_ids"]:
            suspected.append({**group, "kind": "trigger_event", "confidence": "suspected"})
    return {
        "expected_groups": expected,
        "suspected_groups": suspected,
        **(
            {"message_id_paths": MESSAGE_ID_PATHS, "expected_groups_with_message_id_paths": custom}
            if done["shape"] == "custom"
            else {}
        ),
        "duplicate_events": duplicates,
        "expected_stranded": stranded(af, sorted(done["messages"]), runs),
    }


def stranded(af: sa.AF, event_ids: list[int], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events consumed by no run, with no queue row left and a run created after them: a copy that
    came after the first copy queued the consumer and before its run (the queue row keeps the first
    copy's time, docs/explanation/airflow-internals.md, "Asset events that trigger nothing"), what scenarios_stranded.py
    records as stranded."""
    from airflow.models.asset import AssetDagRunQueue, AssetEvent
    from sqlalchemy import func, select

    with af.create_session() as session:
        if session.scalar(select(func.count()).select_from(AssetDagRunQueue)):
            return []
        stamps = dict(session.execute(select(AssetEvent.id, AssetEvent.timestamp)).all())
        queued = dict(session.execute(select(af.DagRun.run_id, af.DagRun.queued_at)).all())
    consumed = {e for r in runs for e in r["event_ids"]}
    left = [e for e in event_ids if e not in consumed]
    after = [r for r in runs if left and queued[r["run_id"]] > max(stamps[e] for e in left)]
    if not after:
        return []
    return [{"dag_id": "orders_consumer", "event_ids": left, "stranding_run_id": after[0]["run_id"]}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--out-json", required=True)
    args = ap.parse_args()
    af = sa.AF()
    done = body(args.scenario, af)
    found = truth(af, done)
    runs = af.runs()
    doc = {
        "scenario": args.scenario,
        "airflow_version": af.version,
        "description": SCENARIOS[args.scenario][1],
        **found,
        "trigger_id": done["trigger_id"],
        "ids_for_triggerer": done["ids_for_triggerer"],
        "file_1_left_for_triggerer_b": done["file_1_left_for_triggerer_b"],
        "event_messages": {str(k): v for k, v in sorted(done["messages"].items())},
        "all_run_ids": [r["run_id"] for r in runs],
        "runs": runs,
        "generator": "scripts/airflow/scenarios_trigger_event.py",
    }
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{args.scenario}: {len(runs)} runs, {json.dumps(found)}", file=sys.stderr)


if __name__ == "__main__":
    main()
