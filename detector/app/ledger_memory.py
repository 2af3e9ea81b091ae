"""The ledger's keys and rows, and ``MemoryLedger``: the ledger kept in this process.

``detector.app.ledger`` keeps the same in PostgreSQL (``DbLedger``) and ``detector.app.ledger_file``
in a JSON file; the per-run notes (pending remediations, dry-run observations) and the claims of several
groups at once are read and written the same way by all three."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from datetime import datetime

from detector.core.ports import Observed, Pending

WATERMARK = "watermark"
KEPT, DUPLICATE = "kept", "duplicate"
PENDING = "pending-remediation"
OBSERVED = "dry-run-observation"


def decision_key(dag_id: str, run_id: str) -> str:
    return f"decision|{dag_id}|{run_id}"


def pending_key(dag_id: str, run_id: str) -> str:
    return f"pending|{dag_id}|{run_id}"


def observed_key(dag_id: str, run_id: str) -> str:
    return f"observed|{dag_id}|{run_id}"


def decision_rows(kept: tuple[str, str], duplicates: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(decision_key(*kept), KEPT), *((decision_key(*d), DUPLICATE) for d in duplicates)]


class RunNotes:
    """The per-run notes every ledger keeps the same way, on its own ``remember``/``_forget``/``_named``."""

    def remember(self, group_key: str, name: str, value: str) -> None:
        raise NotImplementedError

    def remember_many(self, rows: Sequence[tuple[str, str, str]]) -> None:
        """``remember`` of several (group_key, name, value) rows; a ledger that can, in one round trip."""
        for group_key, name, value in rows:
            self.remember(group_key, name, value)

    def _forget(self, group_key: str, name: str) -> None:
        raise NotImplementedError

    def _named(self, name: str) -> list[tuple[str, str]]:
        raise NotImplementedError

    def add_pending(self, item: Pending) -> None:
        self.remember(pending_key(item.dag_id, item.run_id), PENDING, item.finding_key)

    def add_pending_many(self, items: Sequence[Pending]) -> None:
        self.remember_many([(pending_key(i.dag_id, i.run_id), PENDING, i.finding_key) for i in items])

    def drop_pending(self, dag_id: str, run_id: str) -> None:
        """Forget a run whose action is done."""
        self._forget(pending_key(dag_id, run_id), PENDING)

    def pending(self) -> list[Pending]:
        """The actions still due: every pending note."""
        return [_pending(k, v) for k, v in self._named(PENDING)]

    def add_observed(self, item: Observed) -> None:
        self.remember(observed_key(item.dag_id, item.run_id), OBSERVED, _observed_value(item))

    def add_observed_many(self, items: Sequence[Observed]) -> None:
        self.remember_many([(observed_key(i.dag_id, i.run_id), OBSERVED, _observed_value(i)) for i in items])

    def drop_observed(self, dag_id: str, run_id: str) -> None:
        """Forget a dry run's observation once it was judged again."""
        self._forget(observed_key(dag_id, run_id), OBSERVED)

    def observed(self) -> list[Observed]:
        """The duplicates dry runs found, not judged again yet."""
        return [_observed(k, v) for k, v in self._named(OBSERVED)]


class MemoryLedger(RunNotes):
    """In-process ledger (read-only users, SQLite, tests). Thread-safe.

    Bounded for weeks of running: the oldest entries are forgotten past ``max_entries``. A group is
    only re-judged while a sibling can still appear (seconds to minutes), so an entry that old is
    never consulted again.
    """

    durable = False

    def __init__(self, max_entries: int = 100_000) -> None:
        self._claims: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._notes: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._watermark: int | None = None
        self._max = max_entries
        self._lock = threading.Lock()

    def claim(self, group_key: str, subject: str) -> bool:
        with self._lock:
            if (group_key, subject) in self._claims:
                return False
            self._claims[(group_key, subject)] = None
            if len(self._claims) > self._max:
                self._claims.popitem(last=False)
            return True

    def claim_all(self, group_key: str, subjects: list[str]) -> set[str]:
        return {subject for subject in subjects if self.claim(group_key, subject)}

    def claim_groups(self, claims: Sequence[tuple[str, Sequence[str]]]) -> list[set[str]]:
        return [self.claim_all(group_key, list(subjects)) for group_key, subjects in claims]

    def remember(self, group_key: str, name: str, value: str) -> None:
        with self._lock:
            self._notes[(group_key, name)] = value
            if len(self._notes) > self._max:
                self._notes.popitem(last=False)

    def recall(self, group_key: str, name: str) -> str | None:
        with self._lock:
            return self._notes.get((group_key, name))

    def watermark(self) -> int | None:
        return self._watermark

    def save_watermark(self, high: int) -> None:
        self._watermark = high

    def record_decision(self, kept: tuple[str, str], duplicates: Iterable[tuple[str, str]]) -> None:
        for group_key, subject in decision_rows(kept, duplicates):
            self.claim(group_key, subject)

    def record_decisions(self, judgements: Sequence[tuple[tuple[str, str], Sequence[tuple[str, str]]]]) -> None:
        for kept, duplicates in judgements:
            self.record_decision(kept, duplicates)

    def decisions(self, runs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], set[str]]:
        with self._lock:
            found: dict[tuple[str, str], set[str]] = {}
            for dag_id, run_id in runs:
                roles = {r for r in (KEPT, DUPLICATE) if (decision_key(dag_id, run_id), r) in self._claims}
                if roles:
                    found[(dag_id, run_id)] = roles
            return found

    def _forget(self, group_key: str, name: str) -> None:
        with self._lock:
            self._notes.pop((group_key, name), None)

    def _named(self, name: str) -> list[tuple[str, str]]:
        with self._lock:
            return [(k, v) for (k, n), v in self._notes.items() if n == name]

    def on(self, conn: object) -> MemoryLedger:
        return self


def unique_claims(asked: Iterable[tuple[str, Sequence[str]]]) -> list[tuple[str, str]]:
    """The (group, subject) rows of several groups' claims, each once, in the order first asked."""
    return list(dict.fromkeys((group_key, subject) for group_key, subjects in asked for subject in subjects))


def won_by_group(asked: Sequence[tuple[str, Sequence[str]]], won: set[tuple[str, str]]) -> list[set[str]]:
    """The subjects each group won, when ``won`` are the rows one statement took: a row asked by two
    groups is the first asker's, as if the groups had claimed one after the other."""
    left = set(won)
    result: list[set[str]] = []
    for group_key, subjects in asked:
        mine = {s for s in subjects if (group_key, s) in left}
        left.difference_update((group_key, s) for s in mine)
        result.append(mine)
    return result


def _pending(group_key: str, finding_key: str) -> Pending:
    _, dag_id, run_id = group_key.split("|", 2)
    return Pending(finding_key=finding_key, dag_id=dag_id, run_id=run_id)


def _observed_value(item: Observed) -> str:
    return json.dumps({"finding_key": item.finding_key, "kept_run_id": item.kept_run_id, "at": item.at.isoformat()})


def _observed(group_key: str, value: str) -> Observed:
    _, dag_id, run_id = group_key.split("|", 2)
    data = json.loads(value)
    at = datetime.fromisoformat(data["at"])
    return Observed(data["finding_key"], dag_id, run_id, data["kept_run_id"], at)
