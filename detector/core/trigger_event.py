"""Duplicate runs made by one message that every triggerer's copy of an asset trigger submitted.

Why (docs/explanation/airflow-internals.md, "Triggers claimed by every triggerer" and "One message, one asset
event per triggerer"): up to 3.2.1 every triggerer runs the same asset trigger, and
``Trigger.submit_event`` writes one ``asset_event`` per copy, ``extra = {"from_trigger": true,
"payload": <the event's payload>}``, naming neither the trigger nor the triggerer. When the
consumer's run is created between the copies, each copy's event makes a run: runs that share no
event and no run_after, so the ``asset`` rule (detect.py) does not link them.

The rule: runs of one DAG are linked when they consumed *different* events of one asset that are
copies of one message. Copies are proven only by a unique message id in the payload (SQS
``MessageId``, Kinesis shard and sequence number, Pub/Sub ``message_id``: the table in that last section), events
of one asset within ``window`` of each other; or by an id a custom trigger keeps where only its author knows
(a Kafka ``apply_function``'s, a custom watcher's), at the path ``message_id_paths`` names for the event's asset
(``custom_ids``). Equal payloads without an id may be two real messages
with equal bodies, and a watcher whose messages all look alike sends nothing else: they link no runs
(``copies`` still reports them, for the stranded check). A group is ``confirmed`` when one run
consumed every message and every other event of the group (the keep rule of
``detect.keep_order``): stopping the others then leaves no message unprocessed. Copies consumed by a
single run made no extra run: nothing to stop, no group.

Pure: rows in, findings out.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from detector.core.detect import ALL_DAGS, DagFilter, finding, linked_sets
from detector.core.exposure import parse_version
from detector.core.model import (
    ASSET_TRIGGERED,
    NO_DECISIONS,
    Confidence,
    Decisions,
    Finding,
    Kind,
    Run,
    TaskProgress,
)

# Trigger.get_sorted_triggers keeps an asset trigger with a live owner from 3.2.2 (apache/airflow PR
# #65792, docs/explanation/airflow-internals.md, "Triggers claimed by every triggerer"): one copy runs.
FIXED_IN = (3, 2, 2)


def copies_possible(version: str) -> bool:
    """Whether Airflow ``version`` can make new copies of a trigger's event (True when unparseable: err
    towards reading). History may hold copies from before an upgrade: ``scan`` looks whatever runs now."""
    parsed = parse_version(version)
    return parsed is None or (parsed[0], parsed[1], parsed[2] or 0) < FIXED_IN


# ``message_id_paths`` (detector.settings.message_id_paths): (asset name glob, the keys from the event's extra
# down to the id, ``*`` for every item of a list), e.g. ("orders", ("payload", "meta", "id")).
IdPaths = tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True, slots=True)
class TriggerEvent:
    """One ``asset_event`` a trigger submitted: its payload's message ids and, for equality, a digest
    of the payload (a message batch can be large; scan holds every trigger event of its window)."""

    id: int
    asset_id: int
    timestamp: datetime
    message_ids: frozenset[str]
    payload: str  # sha256 of the canonical JSON ("" when message_ids decide)
    broadcast: bool = False  # a Redis pub/sub message: every copy of the trigger receives it (``broadcast``)


@dataclass(frozen=True, slots=True)
class Copies:
    """Events of one asset that carry one message: ``proven`` by an id, or only by equal payloads."""

    event_ids: frozenset[int]
    proven: bool


def from_trigger(extra: object, source_dag_id: str | None) -> bool:
    """Whether Airflow's ``Trigger.submit_event`` wrote this event: its extra, no source task, and not
    the REST API's (which adds ``from_rest_api`` to whatever extra it is given, so a copied extra
    still differs)."""
    return (
        source_dag_id is None
        and isinstance(extra, dict)
        and extra.get("from_trigger") is True
        and "from_rest_api" not in extra
    )


def message_ids(payload: object) -> frozenset[str]:
    """The unique ids of the messages a trigger's payload carries, by the providers' shapes (in the table of
    docs/explanation/airflow-internals.md, "One message, one asset event per triggerer");
    empty when it carries none. Prefixed by shape, so ids of different brokers never meet."""
    if not isinstance(payload, dict):
        return frozenset()
    found: set[str] = set()
    batch = payload.get("message_batch")
    if isinstance(batch, list):  # SqsSensorTrigger, KinesisTrigger
        for message in batch:
            if not isinstance(message, dict):
                continue
            if isinstance(message.get("MessageId"), str):
                found.add(f"sqs:{message['MessageId']}")
            elif isinstance(message.get("ShardId"), str) and isinstance(message.get("SequenceNumber"), str):
                found.add(f"kinesis:{message['ShardId']}/{message['SequenceNumber']}")
    pulled = payload.get("message")
    if isinstance(pulled, list):  # PubsubPullTrigger: ReceivedMessage.to_dict per message
        for received in pulled:
            inner = received.get("message") if isinstance(received, dict) else None
            if isinstance(inner, dict) and isinstance(inner.get("message_id"), str) and inner["message_id"]:
                found.add(f"pubsub:{inner['message_id']}")
    return frozenset(found)


def custom_ids(extra: object, asset_name: str | None, id_paths: IdPaths) -> frozenset[str]:
    """The ids found at the paths ``id_paths`` names for the asset ``asset_name`` (every entry whose glob
    matches it), each prefixed by its path so that two paths' ids never meet. An id is a non-empty string
    or a whole number; anything else there (a float, a bool, a mapping) is none: it could not be unique."""
    if asset_name is None:
        return frozenset()
    found: set[str] = set()
    for glob, keys in id_paths:
        if fnmatch.fnmatchcase(asset_name, glob):
            found.update(f"{'.'.join(keys)}:{value}" for value in _at(extra, keys))
    return frozenset(found)


def _at(node: object, keys: tuple[str, ...]) -> list[str]:
    if not keys:
        if isinstance(node, str) and node:
            return [node]
        return [str(node)] if isinstance(node, int) and not isinstance(node, bool) else []
    key, rest = keys[0], keys[1:]
    if key == "*":
        return [v for item in node for v in _at(item, rest)] if isinstance(node, list) else []
    return _at(node[key], rest) if isinstance(node, dict) and key in node else []


def broadcast(payload: object) -> bool:
    """Whether the payload is a message every copy of its trigger receives: redis ``AwaitMessageTrigger``
    yields the pub/sub message ``{"type": "message", "pattern", "channel", "data"}`` (the table
    cited by ``message_ids``), and pub/sub
    fans each message out to every subscriber. Other id-less triggers' copies compete for a message
    (a file deleted, a Kafka group, a Service Bus lock): there an equal payload is a second message."""
    return (
        isinstance(payload, dict)
        and payload.get("type") == "message"
        and {"pattern", "channel", "data"} <= payload.keys()
    )


def trigger_event(
    event_id: int,
    asset_id: int,
    timestamp: datetime,
    extra: object,
    source_dag_id: str | None,
    asset_name: str | None = None,
    id_paths: IdPaths = (),
) -> TriggerEvent | None:
    """The event as this rule sees it, or None when no trigger submitted it. ``asset_name`` and
    ``id_paths``: a custom trigger's ids (``custom_ids``), beside the providers' own."""
    if not from_trigger(extra, source_dag_id):
        return None
    payload = extra["payload"] if isinstance(extra, dict) and "payload" in extra else None
    ids = message_ids(payload) | custom_ids(extra, asset_name, id_paths)
    if ids:  # the ids decide; the digest is only compared between events without one
        return TriggerEvent(event_id, asset_id, timestamp, ids, "")
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(canonical.encode()).hexdigest()
    return TriggerEvent(event_id, asset_id, timestamp, ids, digest, broadcast(payload))


def copies(events: Iterable[TriggerEvent], window: timedelta) -> list[Copies]:
    """Sets of two or more events of one asset carrying one message within ``window`` of each other:
    by a message id where the payload has one, else by an equal payload."""
    marks: dict[tuple[object, ...], list[TriggerEvent]] = defaultdict(list)
    for event in {e.id: e for e in events}.values():
        if event.message_ids:
            for mid in event.message_ids:
                marks[("id", event.asset_id, mid)].append(event)
        else:
            marks[("payload", event.asset_id, event.payload)].append(event)
    found: list[Copies] = []
    for mark, members in marks.items():
        chain: list[TriggerEvent] = []
        for event in sorted(members, key=lambda e: (e.timestamp, e.id)):
            if chain and event.timestamp - chain[-1].timestamp > window:
                found.extend(_copies(chain, mark[0] == "id"))
                chain = []
            chain.append(event)
        found.extend(_copies(chain, mark[0] == "id"))
    return found


def _copies(chain: Sequence[TriggerEvent], proven: bool) -> list[Copies]:
    return [Copies(frozenset(e.id for e in chain), proven)] if len(chain) > 1 else []


def find_trigger_event_duplicates(
    runs: Iterable[Run],
    events: Mapping[int, frozenset[int]],
    found_copies: Sequence[Copies],
    progress: Mapping[int, TaskProgress] | None = None,
    *,
    dag_filter: DagFilter = ALL_DAGS,
    prior: Decisions = NO_DECISIONS,
    beside: Sequence[Finding] = (),
) -> list[Finding]:
    """Groups of non-partitioned asset runs of one DAG that consumed different copies of one message.

    ``events``: run id -> the events it consumed; ``found_copies``: from ``copies``; ``beside``: the
    groups of other kinds among these runs. Their duplicates are judged there, not twice. Their kept
    run can still share a message with a run of no group: two schedulers made two runs of copy 1's
    queue row (an ``asset`` group) and triggerer 2's copy 2 made a third run (the SQS end-to-end run,
    benchmarks/results/e2e_family-3.1.2-20261202-sqs.json). So a kept run of another group is linked
    here too, as an anchor: this group may stop other runs for it, never it (``_group_finding``).
    """
    progress = progress or {}
    taken = frozenset(r.id for f in beside for r in f.duplicates)
    anchors = frozenset(f.kept.id for f in beside)
    chosen = [
        r
        for r in {r.id: r for r in runs}.values()
        if r.run_type == ASSET_TRIGGERED
        and r.partition_key is None
        and dag_filter.selects(r.dag_id)
        and r.id not in taken
    ]
    # Only an id proves a copy. Equal payloads without one link nothing: an AssetWatcher whose every
    # message has the same body (a file, a Kafka apply_function's constant) would chain every run of its
    # consumer into one group (the end-to-end run: 20 false groups). The stranded check still refuses
    # to re-queue them (``detector.checks.stranded_events.rule``).
    found_copies = [c for c in found_copies if c.proven]
    copy_of = {e: i for i, c in enumerate(found_copies) for e in c.event_ids}
    by_dag: dict[str, list[Run]] = defaultdict(list)
    for run in chosen:
        by_dag[run.dag_id].append(run)
    findings: list[Finding] = []
    for dag_runs in by_dag.values():
        marks = {r.id: {copy_of[e] for e in events.get(r.id, ()) if e in copy_of} for r in dag_runs}
        for group in linked_sets(dag_runs, marks):
            findings.append(_group_finding(group, events, found_copies, copy_of, progress, prior, anchors))
    findings.sort(key=lambda f: (f.dag_id, f.run_after, f.key))
    return findings


def _group_finding(
    group: list[Run],
    events: Mapping[int, frozenset[int]],
    found_copies: Sequence[Copies],
    copy_of: Mapping[int, int],
    progress: Mapping[int, TaskProgress],
    prior: Decisions,
    anchors: frozenset[int] = frozenset(),
) -> Finding:
    # What each run processed: a message (its copy set) or any other event by its own id.
    identities = {
        r.id: {("message", copy_of[e]) if e in copy_of else ("event", e) for e in events.get(r.id, ())} for r in group
    }
    used = {copy_of[e] for r in group for e in events.get(r.id, ()) if e in copy_of}
    # Only copy sets that reached two runs of the group link it; a set inside one run links nothing.
    linking = {i for i in used if sum(any(copy_of.get(e) == i for e in events.get(r.id, ())) for r in group) > 1}
    everything = set().union(*identities.values())
    covering = frozenset(r.id for r in group if identities[r.id] == everything)
    confirmed = bool(covering) and all(found_copies[i].proven for i in linking)
    shared = frozenset(e for r in group for e in events.get(r.id, ()) if copy_of.get(e) in linking)
    first = min(group, key=lambda r: r.id)
    # A kept run of another group must stay kept here too, or the two groups together would stop
    # every run of that one. So it is the run this group keeps, when it covers the group; otherwise,
    # or with two such runs, the group is only suspected: reported, never remediated.
    anchored = frozenset(r.id for r in group if r.id in anchors)
    if anchored:
        covering = covering & anchored if len(anchored) == 1 and anchored <= covering else covering
    found = finding(
        key=f"trigger_event|{first.dag_id}|{first.run_after.isoformat()}",
        kind=Kind.TRIGGER_EVENT,
        confidence=Confidence.CONFIRMED if confirmed else Confidence.SUSPECTED,
        group=group,
        shared=shared,
        progress=progress,
        prior=prior,
        preferred=covering,
    )
    if anchored and anchored != {found.kept.id}:
        return dataclasses.replace(found, confidence=Confidence.SUSPECTED)
    return found
