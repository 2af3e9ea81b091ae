"""The trigger events the REST source judges for the ``trigger_event`` kind (detector.core.trigger_event).

The same reads as ``sources/database/copies.py``, through the API: a run's consumed events come with
their ``extra``, ``source_dag_id``, ``asset_id`` and ``timestamp`` (``upstreamAssetEvents``), so no
request tells a trigger's event from a task's. Only a trigger's event with a message id (the only
proof of a copy) leads to one ``GET /assets/events`` per asset, filtered by ``asset_id`` and the
``timestamp`` range of ``window`` around its events; each event there names the runs that consumed
it (``created_dagruns``). docs/explanation/airflow-internals.md, "Through the REST API".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from detector.core.trigger_event import Copies, TriggerEvent, copies
from detector.sources.api.reader import Reader

RunKey = tuple[str, str]


@dataclass
class Near:
    """What one judgement learnt of its runs' trigger events: the copy sets found, the runs that
    consumed each copy, and which events were looked up already (each asset's range is read once)."""

    window: timedelta
    found: dict[frozenset[int], Copies] = field(default_factory=dict)
    consumers: dict[int, frozenset[RunKey]] = field(default_factory=dict)
    asked: set[int] = field(default_factory=set)

    def read(self, reader: Reader, triggers: Iterable[TriggerEvent]) -> bool:
        """Look up the copies of ``triggers`` not asked yet; False while Airflow cannot serve a range
        (apache/airflow#71360: a consumer not started)."""
        # Only an id links runs (core.trigger_event): an event without one needs no range read.
        mine = {e.id: e for e in triggers if e.message_ids and e.id not in self.asked}
        if not mine:
            return True
        by_asset: dict[int, list[TriggerEvent]] = defaultdict(list)
        for event in mine.values():
            by_asset[event.asset_id].append(event)
        near: list[TriggerEvent] = []
        for asset_id, events in sorted(by_asset.items()):
            low = min(e.timestamp for e in events) - self.window
            high = max(e.timestamp for e in events) + self.window
            answer = reader.trigger_events_near(asset_id, low, high)
            if answer is None:
                return False
            near += answer.triggers
            self.consumers.update(answer.consumers)
        self.asked |= mine.keys()
        for found in copies(near, self.window):
            if found.proven and found.event_ids & mine.keys():
                self.found[found.event_ids] = found
        return True

    def runs_of(self, dag_id: str) -> set[RunKey]:
        """The runs of ``dag_id`` that consumed a copy of a set found."""
        return {c for s in self.found for e in s for c in self.consumers.get(e, ()) if c[0] == dag_id}

    def copies(self) -> list[Copies]:
        return list(self.found.values())


def proven_sets(
    triggers: Iterable[TriggerEvent], consumers: Mapping[int, frozenset[RunKey]], window: timedelta
) -> list[set[RunKey]]:
    """Scan: per copy set proven by a message id among ``triggers``, per DAG, the runs that consumed
    one of its copies (candidates to judge together)."""
    linked: list[set[RunKey]] = []
    for found in copies(triggers, window):
        if not found.proven:
            continue
        per_dag: dict[str, set[RunKey]] = defaultdict(set)
        for event in found.event_ids:
            for key in consumers.get(event, ()):
                per_dag[key[0]].add(key)
        linked += [keys for keys in per_dag.values() if len(keys) > 1]
    return linked
