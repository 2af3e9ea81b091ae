"""The REST API source as the daemon sees it (``core.ports.RunSource``).

The window is every asset run whose ``run_after`` is at least the highest ``run_after`` seen minus
``TAIL_OVERLAP`` (``GET /dags/~/dagRuns``, served by ``idx_dag_run_run_after``). The cursor is
Airflow's own clock (the runs' ``run_after``), never dupguard's, so a skew between the two clocks
changes nothing; the overlap absorbs the skew between schedulers, commit lag and a run_after older
than its creation (the newest queue row of a non-partitioned run).

**An idle poll is one request that serialises no run**: ``limit=0`` returns only the count of the
window; equal to the runs already read, nothing is new. Otherwise the newest runs by id are read
until every new one is found. After a poll that found new runs the next one skips the count and
reads the newest page at once (its ``total_entries`` is the count): under a steady stream of runs
that is one request a poll instead of two. The whole window is read at the first poll, after a
deletion and every ``FULL_READ_EVERY``. A new run the list clears (``judge.suspect``: no other run of
its DAG with its run_after, none out of order with it) costs nothing more; only suspects are judged
(events, siblings, task instances, in one round trip).

A run committed with a ``run_after`` already below the window (the schedulers catching up on old
queue rows after an outage or an unpause: both may race on them) is found by the **late sweep**:
every ``LATE_SWEEP_EVERY`` one request for the asset runs that are running, started since the last
sweep and have a ``run_after`` below the window (``state=running`` is served by Airflow's partial
index on running runs, so its cost follows the running runs, not the history). Such runs are always
judged. A late run is judged once it has started, which is also when its events become readable.

A run Airflow has not started cannot be judged yet: its consumed events are unreadable until then
(apache/airflow#71360, ``reader``). It waits and is read again at every poll for its first
``WAITING_FAST``, then every ``WAITING_RETRY``, for at most ``WAITING_HORIZON`` (then logged and
counted like an abandoned gap). Airflow starts a new run in the scheduler loop that made it unless
``max_active_runs`` holds it, and schedules its tasks only after that, so the first poll after the
start still comes before them more often than not.

Progress becomes permanent only in ``commit`` (after the daemon claimed the poll's findings); a
failed poll leaves the cursor, the runs read and the waiting runs as they were. The cursor is kept in
the ledger (``remember``), so with the file ledger (``DUPGUARD_STATE_FILE``) a restart resumes where
the last poll ended instead of re-reading the look-back.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from detector import logs
from detector.airflowapi.client import Gone, Transient
from detector.config import Config
from detector.core.detect import DagFilter
from detector.core.model import Finding
from detector.core.ports import Ledger, Polled
from detector.core.trigger_event import copies_possible
from detector.errors import AirflowUnreachable, DupguardError
from detector.metadb.versions import family_of_version
from detector.metrics import Metrics
from detector.sources.api.judge import Judge, RunKey
from detector.sources.api.reader import ApiRun, Reader, parse_time

log = logs.get("dupguard.source.api")
TAIL_OVERLAP = timedelta(seconds=60)
FULL_READ_EVERY = timedelta(minutes=10)
PAGE_LIMIT = 100
LATE_SWEEP_EVERY = timedelta(seconds=30)
LATE_SKEW = timedelta(seconds=10)  # schedulers' clocks may be this far apart
SEEN_KEEP = timedelta(minutes=10)  # runs that left the window are remembered this long (by run_after)
WAITING_FAST = timedelta(seconds=10)  # a waiting run is read again at every poll this long
WAITING_RETRY = timedelta(seconds=5)  # then this often
WAITING_HORIZON = timedelta(hours=1)
MAX_WAITING = 10_000
CURSOR_KEY, CURSOR_NAME = "dupguard|api-source", "cursor"
PING_FRESH = 5.0  # seconds: a successful call this recent answers a ping without a request


@dataclass
class _Waiting:
    run: ApiRun
    since: datetime
    tried: datetime


@dataclass
class _Tail:
    cursor: datetime  # highest run_after seen (Airflow's clock); the window starts TAIL_OVERLAP below
    seen: dict[RunKey, ApiRun] = field(default_factory=dict)  # every asset run of the window read so far
    waiting: dict[RunKey, _Waiting] = field(default_factory=dict)
    full_read_at: datetime | None = None
    late_at: datetime | None = None  # dupguard's clock: when the late sweep last ran
    late_from: datetime | None = None  # Airflow's clock: the next sweep looks at runs started from here
    late_seen: dict[RunKey, datetime] = field(default_factory=dict)  # swept runs -> their start_date

    def copy(self) -> _Tail:
        return dataclasses.replace(
            self, seen=dict(self.seen), waiting=dict(self.waiting), late_seen=dict(self.late_seen)
        )


def _full_read_due(tail: _Tail, now: datetime) -> bool:
    return tail.full_read_at is None or now - tail.full_read_at >= FULL_READ_EVERY


class ApiSource:
    name = "api"
    coverage_gap: str | None = None  # one replica, never a new term within a process: nothing to resume

    def __init__(self, config: Config, reader: Reader, ledger: Ledger, metrics: Metrics, *, version: str) -> None:
        self.config = config
        self.reader = reader
        self.ledger = ledger
        self.metrics = metrics
        self.version = version
        self.family = family_of_version(version).value
        self.judge = Judge(
            reader,
            dag_filter=DagFilter(config.dags, config.exclude_dags),
            suspect_window=config.suspect_window,
            roles=ledger.decisions,
            copies=copies_possible(version),
        )
        self.tail: _Tail | None = None
        self._next: _Tail | None = None
        self._busy = 0  # new runs found by the last poll: the next one reads a page that size at once
        # Runs that left the window (key -> run_after), kept for SEEN_KEEP outside the copied tail so a
        # poll does not copy them: the late sweep must not take a run the tail listed for a late one.
        self._retired: dict[RunKey, datetime] = {}
        self._retiring: dict[RunKey, datetime] = {}
        self._last_ok = 0.0
        self.abandoned = 0

    @property
    def watching(self) -> bool:
        return self.tail is not None

    def ping(self) -> str | None:
        """Reachable if a call succeeded in the last few seconds; else one ``GET /api/v2/version``."""
        if time.monotonic() - self._last_ok < PING_FRESH:
            return None
        try:
            self.reader.version()
        except DupguardError as exc:
            return str(exc)
        except Exception as exc:  # noqa: BLE001 - Transient and the like: one line, never a traceback
            return (str(exc).splitlines() or [type(exc).__name__])[0]
        self._last_ok = time.monotonic()
        return None

    def start(self, now: datetime) -> None:
        saved = parse_time(self.ledger.recall(CURSOR_KEY, CURSOR_NAME)) if self.ledger.durable else None
        cursor = (
            saved if saved is not None else self.reader.server_now(now) - self.config.startup_lookback + TAIL_OVERLAP
        )
        self.tail = _Tail(cursor=cursor)
        log.info(
            "watching",
            source="api",
            from_run_after=cursor.isoformat(),
            resumed=saved is not None,
            durable_state=self.ledger.durable,
        )

    def end(self) -> None:
        self.tail = None
        self._next = None

    def stood_by(self, live_leader: bool) -> None:
        """Never called: ``--source api`` takes no lock (one replica, ``AlwaysLeader``)."""

    def poll(self, now: datetime) -> Polled:
        try:
            return self._poll(now)
        except (Transient, Gone) as exc:  # the tail itself failed: the whole poll is retried
            raise AirflowUnreachable(str(exc)) from None

    def _poll(self, now: datetime) -> Polled:
        assert self.tail is not None, "start() opens a term before the first poll"
        tail = self.tail.copy()
        low = tail.cursor - TAIL_OVERLAP
        window = {k: r for k, r in tail.seen.items() if r.run_after >= low}
        read_all = _full_read_due(tail, now)
        listed = self._read_window(tail, low, window, now)
        self._last_ok = time.monotonic()
        known = window | {r.key: r for r in listed}
        new = [r for r in listed if r.key not in tail.seen]
        self._busy = 0 if read_all else len(new)  # the look-back's runs say nothing of the next poll
        retry = self._due(tail, now) + self._sweep(tail, low, now)
        order = {r.key: i for i, r in enumerate(listed)}
        verdict = self.judge.judge([*new, *retry], now, known=known, known_from=low, order=order)
        for run in [*new, *retry]:
            tail.seen[run.key] = run
            tail.waiting.pop(run.key, None)
        for run in verdict.waiting:
            held = self.tail.waiting.get(run.key)
            tail.waiting[run.key] = _Waiting(run, held.since if held else now, now)
        for run in verdict.gone:
            tail.waiting.pop(run.key, None)
        self._expire(tail, now)
        if listed:
            tail.cursor = max(tail.cursor, max(r.run_after for r in listed))
        floor = tail.cursor - TAIL_OVERLAP
        self._retiring = {k: r.run_after for k, r in tail.seen.items() if r.run_after < floor}
        tail.seen = {k: r for k, r in tail.seen.items() if r.run_after >= floor}
        self._next = tail
        waiting_new = [r for r in verdict.waiting if r.key not in self.tail.waiting]
        if waiting_new:
            log.info(
                "runs_waiting_for_airflow",
                runs=[f"{r.dag_id}/{r.run_id}" for r in waiting_new[:20]],
                detail="their consumed events are unreadable until Airflow starts them (apache/airflow#71360)",
            )
        return Polled(new_runs=len(new), findings=verdict.findings)

    def _read_window(self, tail: _Tail, low: datetime, window: dict[RunKey, ApiRun], now: datetime) -> list[ApiRun]:
        """The runs of the window not read yet, in id order (lowest first). Usually one ``limit=0``
        request (its count equals the runs already read: nothing new); else the newest runs by id
        until the new ones are all found. Right after a poll that found some, the count is skipped:
        the first page's ``total_entries`` gives it. The whole window is read at the first poll, when
        the count went down (a run was deleted) and every ``FULL_READ_EVERY`` (a deletion and a
        creation within one poll would balance the count)."""
        if _full_read_due(tail, now):
            tail.full_read_at = now
            return self.reader.asset_runs(run_after_gte=low)
        if self._busy:
            limit = min(PAGE_LIMIT, self._busy)
        else:
            total = self.reader.count_asset_runs(run_after_gte=low)
            if total == len(window):
                return []
            if total < len(window):
                tail.full_read_at = now
                return self.reader.asset_runs(run_after_gte=low)
            limit = min(PAGE_LIMIT, total - len(window))
        listed: list[ApiRun] = []
        keys: set[RunKey] = set()
        offset = found = 0
        goal: int | None = None
        while True:
            page, total = self.reader.newest_asset_runs(run_after_gte=low, offset=offset, limit=limit)
            if total < len(window):
                tail.full_read_at = now
                return self.reader.asset_runs(run_after_gte=low)
            # The poll looks for the new runs its first page counted. Runs committed while it pages
            # are the next poll's: chasing them down the pages read the whole window under a stream.
            goal = total - len(window) if goal is None else goal
            offset += len(page)  # the offset moves by what came back: a server may cap the page
            # A run committed between two pages pushes the older ones down: one may come twice.
            fresh = [r for r in page if r.key not in keys]
            keys.update(r.key for r in fresh)
            listed.extend(fresh)
            found += sum(1 for r in fresh if r.key not in window)
            if found >= goal or not page or offset >= total:
                return listed[::-1]
            # More new runs than the page held: the next page asks for what is missing (plus one).
            # Missing still after that, a run took its id before older ones committed: read on, doubling.
            short = goal - found
            limit = min(PAGE_LIMIT, short + 1 if offset == len(page) else max(2 * limit, short))

    def _due(self, tail: _Tail, now: datetime) -> list[ApiRun]:
        """Waiting runs worth another try (every poll at first, then every ``WAITING_RETRY``), read
        afresh: started by now?"""
        due = []
        for key, item in list(tail.waiting.items()):
            if now - item.since >= WAITING_FAST and now - item.tried < WAITING_RETRY:
                continue
            fresh = self.reader.run(*key)
            if fresh is None:  # deleted meanwhile
                tail.waiting.pop(key)
                continue
            item.tried = now
            due.append(fresh)
        return due

    def _sweep(self, tail: _Tail, low: datetime, now: datetime) -> list[ApiRun]:
        """Running asset runs started since the last sweep whose run_after lies below the window
        (one request every ``LATE_SWEEP_EVERY``), minus the runs the tail listed (a run that waited
        in the queue for ``max_active_runs`` starts long after its run_after)."""
        if tail.late_at is not None and now - tail.late_at < LATE_SWEEP_EVERY:
            return []
        started_from = low if tail.late_from is None else tail.late_from
        runs = self.reader.late_runs(run_after_lte=low, started_gte=started_from)
        # A run started after this sweep has a start_date past Airflow's clock now, which the newest
        # run_after seen does not exceed (give or take the schedulers' clock skew): the next sweep
        # starts there, so it returns few runs the tail already listed.
        tail.late_at, tail.late_from = now, tail.cursor - LATE_SKEW
        tail.late_seen = {k: at for k, at in tail.late_seen.items() if at >= started_from}
        keep_from = tail.cursor - SEEN_KEEP
        self._retired = {k: at for k, at in self._retired.items() if at >= keep_from}
        fresh = [
            r for r in runs if r.key not in tail.late_seen and r.key not in tail.seen and r.key not in self._retired
        ]
        for run in runs:
            tail.late_seen[run.key] = run.start_date or started_from
        if fresh:
            log.info(
                "late_runs",
                runs=[f"{r.dag_id}/{r.run_id}" for r in fresh[:20]],
                detail="committed with a run_after below the window (old queue rows): judged now",
            )
        return fresh

    def _expire(self, tail: _Tail, now: datetime) -> None:
        old = [k for k, w in tail.waiting.items() if now - w.since > WAITING_HORIZON]
        overflow = max(0, len(tail.waiting) - len(old) - MAX_WAITING)
        if overflow:
            old += sorted((k for k in tail.waiting if k not in old), key=lambda k: tail.waiting[k].since)[:overflow]
        for key in old:
            item = tail.waiting.pop(key)
            self.abandoned += 1
            self.metrics.gaps_abandoned.inc()
            log.warning(
                "run_not_judged",
                dag_id=item.run.dag_id,
                run_id=item.run.run_id,
                waited_seconds=round((now - item.since).total_seconds()),
                detail="Airflow never served its consumed events (not started, or the endpoint fails)",
            )

    def commit(self) -> None:
        if self._next is None:
            return
        moved = self.tail is None or self._next.cursor != self.tail.cursor
        self.tail, self._next = self._next, None
        self._retired.update(self._retiring)
        self._retiring = {}
        if moved and self.ledger.durable:
            self.ledger.remember(CURSOR_KEY, CURSOR_NAME, self.tail.cursor.isoformat())

    def failed(self, exc: BaseException) -> str:
        self._next = None
        self._retiring = {}
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

    def rejudge(self, dag_id: str, run_id: str, now: datetime) -> list[Finding] | None:
        try:
            return self._rejudge(dag_id, run_id, now)
        except Transient as exc:
            raise AirflowUnreachable(str(exc)) from None

    def _rejudge(self, dag_id: str, run_id: str, now: datetime) -> list[Finding] | None:
        run = self.reader.run(dag_id, run_id)
        if run is None:
            return None
        verdict = self.judge.judge([run], now)
        return verdict.findings

    def summary(self) -> dict[str, object]:
        tail = self.tail
        return {
            "cursor": tail.cursor.isoformat() if tail else None,
            "waiting_runs": len(tail.waiting) if tail else 0,
            "api_requests": self.reader.requests,
        }

    def close(self) -> None:
        self.reader.http.close()
