"""The read calls of the API source, and their answers as frozen objects.

Airflow 3's public API v2 (routes in ``airflow/api_fastapi/core_api/routes/public/``):

- ``GET /api/v2/dags/~/dagRuns`` (``get_dag_runs``, 3.1.2 dag_run.py L307): ``~`` is every DAG;
  filters ``run_type``, ``run_after_gte``/``_lte`` (``idx_dag_run_run_after``, docs/explanation/airflow-internals.md,
  "Indexes the detection queries use"), ``order_by=id`` (the keep rule's order; the id itself is not in the answer).
  Each page also runs a ``count(*)`` of the filtered rows, so every list here is bounded by a ``run_after`` range.
- ``GET …/dagRuns/{run_id}/upstreamAssetEvents`` (L218): the run's consumed events; each names the
  runs that consumed it (``created_dagruns``).
- ``GET …/dagRuns/{run_id}/taskInstances``: task states for the keep rule and the remediation guard.

Pages: ``limit`` is capped by the server's ``[api] maximum_page_limit`` (default 100), so pages are
followed by ``total_entries``, never by the page's length.

A run's consumed events cannot be read while it, or any run that consumed one of its events, has
not started: ``DagRunAssetReference.start_date`` is a required datetime in 3.0.6 to 3.3.2, so the
answer fails validation and Airflow returns HTTP 500 (apache/airflow#71360, fixed by #71379).
``events`` reports that as ``None`` ("not readable yet") rather than as a fault when the run itself
has not started.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol
from urllib.parse import quote

from detector import logs
from detector.airflowapi.client import Gone, Transient
from detector.core.model import TaskProgress, ti_started
from detector.core.plan import Action
from detector.core.trigger_event import IdPaths, TriggerEvent, trigger_event
from detector.errors import AirflowApiError
from detector.metadb.run_state import KeptRun, RunState, TaskState

# What a 403 on each call lacks (the minimum permissions, docs/explanation/api-source.md).
READ_RUNS = "read access to DAG Runs (FAB: 'can read on DAG Runs', e.g. role Viewer; simple auth manager: viewer)"
READ_EVENTS = (
    "read access to DAG Runs and Assets (FAB: 'can read on DAG Runs' and 'can read on Assets', e.g. role "
    "Viewer; simple auth manager: viewer)"
)
READ_TASKS = (
    "read access to Task Instances (FAB: 'can read on Task Instances', e.g. role Viewer; simple auth manager: viewer)"
)
PAGE = 100
MAX_PAGES = 1000  # a runaway list (100,000 runs) is an error, never an endless loop
ASSET_TRIGGERED = "asset_triggered"

log = logs.get("dupguard.source.api")


class Http(Protocol):
    """``detector.airflowapi.session.Session``: one authenticated JSON call, failures classified."""

    def request(
        self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None, needs: str
    ) -> dict[str, Any]: ...

    def close(self) -> None: ...

    @property
    def clock_offset(self) -> float | None:
        """The server's clock minus this host's (seconds), from its last answer; None if unknown."""


@dataclass(frozen=True, slots=True)
class ApiRun:
    """One DAG run as the API shows it (no ``dag_run.id``, no ``creating_job_id``: not exposed)."""

    dag_id: str
    run_id: str
    run_type: str
    run_after: datetime
    state: str | None
    queued_at: datetime | None
    start_date: datetime | None
    note: str | None
    partition_key: str | None

    @property
    def key(self) -> tuple[str, str]:
        return (self.dag_id, self.run_id)


@dataclass(frozen=True, slots=True)
class ConsumedEvents:
    """The events a run consumed, and every run (dag_id, run_id) that consumed any of them."""

    event_ids: frozenset[int]
    consumers: frozenset[tuple[str, str]]
    assets: frozenset[tuple[str, str]] = frozenset()  # (name, uri) of the events' assets: what alerts name
    triggers: tuple[TriggerEvent, ...] = ()  # the events a trigger submitted (``core.trigger_event``)


@dataclass(frozen=True, slots=True)
class NearEvents:
    """The trigger events of one asset in a timestamp range, and the runs that consumed each event."""

    triggers: tuple[TriggerEvent, ...]
    consumers: Mapping[int, frozenset[tuple[str, str]]]


def _trigger(event: Mapping[str, Any], id_paths: IdPaths) -> TriggerEvent | None:
    """The event as the trigger_event rule sees it (None when no trigger wrote it): the API serves the
    columns the database source reads (``extra`` with secrets masked, ``source_dag_id``, ``asset_id``,
    ``timestamp``, the asset's ``name``), docs/explanation/airflow-internals.md, "Through the REST API"."""
    at = parse_time(event.get("timestamp"))
    if at is None or not isinstance(event.get("asset_id"), int):
        return None
    name = event.get("name") if isinstance(event.get("name"), str) else None
    extra, source = event.get("extra"), event.get("source_dag_id")
    return trigger_event(int(event["id"]), event["asset_id"], at, extra, source, name, id_paths)


def _created(event: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    return frozenset((str(c["dag_id"]), str(c["run_id"])) for c in event.get("created_dagruns") or [])


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _run(item: Mapping[str, Any]) -> ApiRun:
    run_after = parse_time(item.get("run_after"))
    if run_after is None:
        raise AirflowApiError(f"a DAG run without run_after in the API answer: {item.get('dag_run_id')!r}")
    return ApiRun(
        dag_id=str(item["dag_id"]),
        run_id=str(item["dag_run_id"]),
        run_type=str(item.get("run_type") or ""),
        run_after=run_after,
        state=item.get("state"),
        queued_at=parse_time(item.get("queued_at")),
        start_date=parse_time(item.get("start_date")),
        note=item.get("note"),
        partition_key=item.get("partition_key"),
    )


def _iso(value: datetime) -> str:
    return value.isoformat()


def _path(*parts: str) -> str:
    return "/api/v2/" + "/".join(quote(p, safe="~") for p in parts)


class Reader:
    """The API source's read calls over one ``Http`` session."""

    def __init__(self, http: Http, *, page: int = PAGE, id_paths: IdPaths = ()) -> None:
        self.http = http
        self.page = page
        self.id_paths = id_paths  # message_id_paths: where custom triggers keep their messages' ids
        self.requests = 0  # calls sent (benchmarks, tests)
        self._count_lock = threading.Lock()
        self._triggers: list[TriggerEvent] | None = None  # event_consumers' trigger events, while it lists

    def _get(self, path: str, query: Mapping[str, Any] | None, needs: str) -> dict[str, Any]:
        with self._count_lock:
            self.requests += 1
        return self.http.request("GET", path, query=query, needs=needs)

    def server_now(self, now: datetime) -> datetime:
        """``now`` (this host's clock) on the API server's clock: the Date of its last answer, or of a
        ``GET /api/v2/version`` when none came yet. The host's clock, said once, if it sends none."""
        if self.http.clock_offset is None:
            self.version()
        offset = self.http.clock_offset
        if offset is None:
            log.warning(
                "server_clock_unknown", reason="the Airflow API sent no Date header: ages use this host's clock"
            )
            return now
        return now + timedelta(seconds=offset)

    def version(self) -> str:
        """Airflow's version (``GET /api/v2/version``); a 404 means no API v2 (Airflow 2 or not Airflow)."""
        try:
            answer = self._get("/api/v2/version", None, READ_RUNS)
        except Gone:
            raise AirflowApiError(
                "GET /api/v2/version answered 404: this is not an Airflow 3 API server (the API source needs "
                "Airflow 3's REST API v2; check DUPGUARD_AIRFLOW_API_URL)"
            ) from None
        version = answer.get("version")
        if not isinstance(version, str) or not version:
            raise AirflowApiError("GET /api/v2/version: no version in the answer (is this an Airflow API server?)")
        return version

    def asset_runs(
        self,
        *,
        dag_id: str = "~",
        run_after_gte: datetime | None = None,
        run_after_lte: datetime | None = None,
    ) -> list[ApiRun]:
        """Asset-triggered runs in the ``run_after`` range, in ``dag_run.id`` order, every page."""
        query: dict[str, Any] = {"run_type": ASSET_TRIGGERED, "order_by": "id", "limit": self.page}
        if run_after_gte is not None:
            query["run_after_gte"] = _iso(run_after_gte)
        if run_after_lte is not None:
            query["run_after_lte"] = _iso(run_after_lte)
        return self._pages(_path("dags", dag_id, "dagRuns"), query)

    def _pages(self, path: str, query: Mapping[str, Any]) -> list[ApiRun]:
        runs: list[ApiRun] = []
        for _ in range(MAX_PAGES):
            # The offset moves by what came back: a server whose maximum_page_limit is below the
            # limit asked for answers shorter pages.
            answer = self._get(path, {**query, "offset": len(runs)}, READ_RUNS)
            items = answer.get("dag_runs") or []
            runs.extend(_run(i) for i in items)
            total = answer.get("total_entries")
            if not items or not isinstance(total, int) or len(runs) >= total:
                return runs
        raise AirflowApiError(f"GET {path}: more than {MAX_PAGES} pages; narrow the range (--since)")

    def late_runs(self, *, run_after_lte: datetime, started_gte: datetime) -> list[ApiRun]:
        """Running asset runs started from ``started_gte`` whose ``run_after`` is at most
        ``run_after_lte``, in id order (every page). ``state=running`` lets Airflow's database use its
        partial index on running runs; ``start_date`` has no index of its own."""
        query: dict[str, Any] = {
            "run_type": ASSET_TRIGGERED,
            "state": "running",
            "run_after_lte": _iso(run_after_lte),
            "start_date_gte": _iso(started_gte),
            "order_by": "id",
            "limit": self.page,
        }
        return self._pages(_path("dags", "~", "dagRuns"), query)

    def count_asset_runs(self, *, run_after_gte: datetime) -> int:
        """How many asset runs have ``run_after`` >= the bound: ``limit=0``, so Airflow runs only its
        ``count(*)`` (an index range of ``idx_dag_run_run_after``) and serialises no run."""
        query = {"run_type": ASSET_TRIGGERED, "run_after_gte": _iso(run_after_gte), "limit": 0}
        total = self._get(_path("dags", "~", "dagRuns"), query, READ_RUNS).get("total_entries")
        if not isinstance(total, int):
            raise AirflowApiError("GET /api/v2/dags/~/dagRuns: no total_entries in the answer")
        return total

    def newest_asset_runs(self, *, run_after_gte: datetime, offset: int, limit: int) -> tuple[list[ApiRun], int]:
        """One page of asset runs with ``run_after`` >= the bound, newest ``dag_run.id`` first, and
        how many runs the bound holds in all."""
        query = {
            "run_type": ASSET_TRIGGERED,
            "run_after_gte": _iso(run_after_gte),
            "order_by": "-id",
            "limit": limit,
            "offset": offset,
        }
        answer = self._get(_path("dags", "~", "dagRuns"), query, READ_RUNS)
        total = answer.get("total_entries")
        if not isinstance(total, int):
            raise AirflowApiError("GET /api/v2/dags/~/dagRuns: no total_entries in the answer")
        return [_run(i) for i in answer.get("dag_runs") or []], total

    def run(self, dag_id: str, run_id: str) -> ApiRun | None:
        """One run, or None when it does not exist (any more)."""
        try:
            return _run(self._get(_path("dags", dag_id, "dagRuns", run_id), None, READ_RUNS))
        except Gone:
            return None

    def events(self, run: ApiRun) -> ConsumedEvents | None:
        """What ``run`` consumed; None while Airflow cannot answer (the run, or a run sharing one of
        its events, has not started: apache/airflow#71360), or the call failed: judged again later.
        No request for a run known not to have started (it would only fail, with a traceback in
        Airflow's log). Raises ``Gone`` when the run was deleted."""
        if run.start_date is None:
            return None
        path = _path("dags", run.dag_id, "dagRuns", run.run_id, "upstreamAssetEvents")
        try:
            answer = self._get(path, None, READ_EVENTS)
        except Transient:
            return None
        ids: set[int] = set()
        consumers: set[tuple[str, str]] = set()
        assets: set[tuple[str, str]] = set()
        triggers = []
        for event in answer.get("asset_events") or []:
            ids.add(int(event["id"]))
            if event.get("name") or event.get("uri"):  # AssetEventResponse, 3.0-3.3
                assets.add((str(event.get("name") or event.get("uri")), str(event.get("uri") or "")))
            consumers |= _created(event)
            if (found := _trigger(event, self.id_paths)) is not None:
                triggers.append(found)
        return ConsumedEvents(frozenset(ids), frozenset(consumers), frozenset(assets), tuple(triggers))

    def trigger_events_near(self, asset_id: int, low: datetime, high: datetime) -> NearEvents | None:
        """The trigger events of ``asset_id`` with a timestamp in [low, high] and their consumers
        (``GET /assets/events?asset_id=&timestamp_gte=&timestamp_lte=``, every page); None while Airflow
        cannot serialise one of them (a consumer not started, apache/airflow#71360): judged later."""
        query = {
            "asset_id": asset_id,
            "timestamp_gte": _iso(low),
            "timestamp_lte": _iso(high),
            "order_by": "timestamp",
            "limit": self.page,
        }
        triggers: list[TriggerEvent] = []
        consumers: dict[int, frozenset[tuple[str, str]]] = {}
        seen = 0
        for _ in range(MAX_PAGES):
            try:
                answer = self._get("/api/v2/assets/events", {**query, "offset": seen}, READ_EVENTS)
            except Transient:
                return None
            items = answer.get("asset_events") or []
            seen += len(items)
            for event in items:
                if (found := _trigger(event, self.id_paths)) is not None:
                    triggers.append(found)
                    consumers[found.id] = _created(event)
            total = answer.get("total_entries")
            if not items or not isinstance(total, int) or seen >= total:
                return NearEvents(tuple(triggers), consumers)
        raise AirflowApiError(f"GET /api/v2/assets/events: more than {MAX_PAGES} pages for asset {asset_id}")

    def event_consumers(
        self, *, since: datetime | None, triggers: list[TriggerEvent] | None = None
    ) -> tuple[dict[int, frozenset[tuple[str, str]]], int]:
        """Every asset event since ``since`` -> the runs that consumed it (``GET /assets/events``,
        ordered by timestamp with Airflow's id tie-break, so offsets are stable). A page that fails
        with HTTP 500 is halved until the events Airflow cannot serialise (a consumer not started,
        apache/airflow#71360) are isolated; those are skipped and counted (second value). The events
        a trigger submitted are appended to ``triggers`` (the trigger_event kind)."""
        self._triggers = triggers
        query: dict[str, Any] = {"order_by": "timestamp"}
        if since is not None:
            query["timestamp_gte"] = _iso(since)
        found: dict[int, frozenset[tuple[str, str]]] = {}
        unreadable = 0
        offset = 0
        for _ in range(MAX_PAGES * 10):
            try:
                answer = self._get(
                    "/api/v2/assets/events", {**query, "limit": self.page, "offset": offset}, READ_EVENTS
                )
            except Transient:
                unreadable += self._bisect(query, offset, self.page, found)
                offset += self.page
                continue
            items = answer.get("asset_events") or []
            self._collect(items, found)
            total = answer.get("total_entries")
            offset += len(items)
            if not items or not isinstance(total, int) or offset >= total:
                return found, unreadable
        raise AirflowApiError("GET /api/v2/assets/events: too many pages; narrow the range (--since)")

    def _bisect(self, query: Mapping[str, Any], offset: int, limit: int, found: dict[int, Any]) -> int:
        if limit == 1:
            try:
                answer = self._get("/api/v2/assets/events", {**query, "limit": 1, "offset": offset}, READ_EVENTS)
            except Transient:
                return 1
            self._collect(answer.get("asset_events") or [], found)
            return 0
        half = limit // 2
        missing = 0
        for start, size in ((offset, half), (offset + half, limit - half)):
            try:
                answer = self._get("/api/v2/assets/events", {**query, "limit": size, "offset": start}, READ_EVENTS)
            except Transient:
                missing += self._bisect(query, start, size, found)
                continue
            self._collect(answer.get("asset_events") or [], found)
        return missing

    def _collect(self, items: list[dict[str, Any]], found: dict[int, frozenset[tuple[str, str]]]) -> None:
        for event in items:
            found[int(event["id"])] = _created(event)
            if self._triggers is not None and (trigger := _trigger(event, self.id_paths)) is not None:
                self._triggers.append(trigger)

    def task_states(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of the run (all pages) as the API answers them."""
        path = _path("dags", dag_id, "dagRuns", run_id, "taskInstances")
        found: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):
            answer = self._get(path, {"limit": self.page, "offset": len(found)}, READ_TASKS)
            items = answer.get("task_instances") or []
            found.extend(items)
            total = answer.get("total_entries")
            if not items or not isinstance(total, int) or len(found) >= total:
                return found
        raise AirflowApiError(f"GET {path}: more than {MAX_PAGES} pages of task instances")


def progress_of(tasks: list[dict[str, Any]], now: datetime, *, guarded: bool) -> TaskProgress:
    """TaskProgress from the API's task instances, counted as ``consumption.progress_and_notes`` counts rows."""
    total = started = skipped = 0
    seconds = 0.0
    for ti in tasks:
        total += 1
        state = ti.get("state")
        if ti_started(state, ti.get("pid")):
            started += 1
            start = parse_time(ti.get("start_date"))
            if start is not None:
                seconds += max(0.0, ((parse_time(ti.get("end_date")) or now) - start).total_seconds())
        elif state == "skipped":
            skipped += 1
    return TaskProgress(total=total, started=started, skipped=skipped, task_seconds=seconds, guarded=guarded)


class ApiRunStates:
    """The remediation guard's re-read and the backend's read-back through the API
    (``actions.remediation.guarded.RunStates``): the run and every task instance, two requests.

    The API has no ``dag_run.id``, so a run deleted and re-created under the same run_id between the
    judgement and the re-read cannot be told from the original (the database source can)."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def state(self, action: Action) -> RunState | None:
        found = self._read(action.dag_id, action.run.run_id, action.run.id)
        return None if found is None else found[0]

    def kept(self, action: Action) -> KeptRun | None:
        # the kept run's id is not known here and not needed: judge_kept reads states and the note
        found = self._read(action.dag_id, action.kept_run_id, -1)
        return None if found is None else KeptRun(*found)

    def _read(self, dag_id: str, run_id: str, pk: int) -> tuple[RunState, str | None] | None:
        run = self.reader.run(dag_id, run_id)
        if run is None:
            return None
        try:
            tasks = self.reader.task_states(dag_id, run_id)
        except Gone:
            return None
        return RunState(
            id=pk,
            dag_id=run.dag_id,
            run_id=run.run_id,
            state=run.state,
            tasks=tuple(
                TaskState(
                    task_id=str(ti["task_id"]),
                    map_index=int(ti.get("map_index", -1)),
                    state=ti.get("state"),
                    pid=ti.get("pid"),
                )
                for ti in tasks
            ),
        ), run.note

    def note(self, action: Action) -> str | None:
        run = self.reader.run(action.dag_id, action.run.run_id)
        return None if run is None else run.note
