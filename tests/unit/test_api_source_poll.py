"""The API source's poll against an in-memory fake of the three list/read calls it makes: what an idle
poll costs, pages followed by ``total_entries`` when the server caps ``limit``, and a clock skew
between dupguard and Airflow. (The real API server: tests/integration/test_api_source.py.)"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pytest

from detector.airflowapi.client import Gone
from detector.app.ledger import MemoryLedger
from detector.config import Config
from detector.metrics import Metrics
from detector.sources.api.reader import Reader
from detector.sources.api.source import ApiSource

AIRFLOW_NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@dataclass
class FakeAirflow:
    """Asset runs with ids; lists filtered by run_after, ordered by id, ``limit`` capped at ``cap``."""

    cap: int = 100
    runs: list[dict[str, Any]] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    deleted: set[str] = field(default_factory=set)  # listed, then gone before the next read (HTTP 404)
    clock_offset: float | None = 0.0  # the server's clock minus the host's (a real server's Date header)
    triggered: dict[int, dict[str, Any]] = field(default_factory=dict)  # event id -> a trigger's event fields

    def trigger(self, event: int, at: datetime, message_id: str) -> None:
        """Event ``event`` as ``Trigger.submit_event`` writes it: no source task, an SQS-shaped payload."""
        payload = {"message_batch": [{"MessageId": message_id, "Body": "{}"}]}
        self.triggered[event] = {
            "asset_id": 1,
            "timestamp": at.isoformat(),
            "extra": {"from_trigger": True, "payload": payload},
            "source_dag_id": None,
        }

    def _event(self, event: int) -> dict[str, Any]:
        created = [{"dag_id": r["dag_id"], "run_id": r["dag_run_id"]} for r in self.runs if event in r["events"]]
        return {"id": event, "created_dagruns": created, **self.triggered.get(event, {})}

    def add(
        self,
        dag_id: str,
        run_after: datetime,
        event: int | tuple[int, ...],
        *,
        started: bool = True,
        partition_key: str | None = None,
    ) -> str:
        run_id = f"asset_triggered__{run_after.isoformat()}_{len(self.runs)}"
        self.runs.append(
            {
                "id": len(self.runs) + 1,
                "dag_run_id": run_id,
                "dag_id": dag_id,
                "run_type": "asset_triggered",
                "run_after": run_after.isoformat(),
                "state": "running" if started else "queued",
                "queued_at": run_after.isoformat(),
                "start_date": run_after.isoformat() if started else None,
                "note": None,
                "events": (event,) if isinstance(event, int) else event,
                "partition_key": partition_key,
            }
        )
        return run_id

    def start(self, run_id: str, at: datetime | None = None) -> None:
        run = next(r for r in self.runs if r["dag_run_id"] == run_id)
        run["state"], run["start_date"] = "running", (at.isoformat() if at else run["run_after"])

    def reads(self, kind: str) -> int:
        return sum(1 for path, _ in self.calls if path.endswith("/" + kind))

    def request(
        self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None, needs: str
    ) -> dict[str, Any]:
        q = dict(query or {})
        self.calls.append((path, q))
        parts = [unquote(p) for p in path.split("/")[3:]]
        if parts == ["version"]:
            return {"version": "3.1.2"}
        if parts[0] == "dags" and parts[2:] == ["dagRuns"]:
            found = [r for r in self.runs if parts[1] in ("~", r["dag_id"])]
            if "run_after_gte" in q:
                found = [
                    r
                    for r in found
                    if datetime.fromisoformat(r["run_after"]) >= datetime.fromisoformat(q["run_after_gte"])
                ]
            if "run_after_lte" in q:
                found = [
                    r
                    for r in found
                    if datetime.fromisoformat(r["run_after"]) <= datetime.fromisoformat(q["run_after_lte"])
                ]
            if "state" in q:
                found = [r for r in found if r["state"] == q["state"]]
            if "start_date_gte" in q:
                found = [
                    r
                    for r in found
                    if r["start_date"] is not None
                    and datetime.fromisoformat(r["start_date"]) >= datetime.fromisoformat(q["start_date_gte"])
                ]
            found.sort(key=lambda r: r["id"], reverse=q.get("order_by") == "-id")
            limit = min(int(q.get("limit", 50)), self.cap)
            offset = int(q.get("offset", 0))
            return {"dag_runs": found[offset : offset + limit], "total_entries": len(found)}
        if len(parts) > 3 and parts[3] in self.deleted:
            raise Gone(f"GET {path}: HTTP 404")
        if parts[0] == "dags" and len(parts) == 4 and parts[2] == "dagRuns":
            return next(r for r in self.runs if r["dag_run_id"] == parts[3])
        if parts[0] == "dags" and parts[-1] == "upstreamAssetEvents":
            run = next(r for r in self.runs if r["dag_run_id"] == parts[3])
            assert run["start_date"] is not None, "Airflow answers 500 here (apache/airflow#71360)"
            events = [self._event(event) for event in run["events"]]
            return {"asset_events": events, "total_entries": len(events)}
        if parts == ["assets", "events"]:
            low, high = datetime.fromisoformat(q["timestamp_gte"]), datetime.fromisoformat(q["timestamp_lte"])
            near = sorted(
                (e for e, f in self.triggered.items() if low <= datetime.fromisoformat(f["timestamp"]) <= high),
                key=lambda e: (self.triggered[e]["timestamp"], e),
            )
            assert q["asset_id"] == 1
            return {"asset_events": [self._event(e) for e in near], "total_entries": len(near)}
        if parts[0] == "dags" and parts[-1] == "taskInstances":
            return {"task_instances": [], "total_entries": 0}
        raise AssertionError(f"unexpected call {path}")

    def close(self) -> None:
        pass


def source(fake: FakeAirflow, version: str = "3.1.2") -> ApiSource:
    config = Config.of(source="api", startup_lookback=timedelta(minutes=15))
    return ApiSource(config, Reader(fake), MemoryLedger(), Metrics(), version=version)


def poll(src: ApiSource, now: datetime) -> list[str]:
    found = src.poll(now)
    src.commit()
    return [r.run_id for f in found.findings for r in f.duplicates]


def test_an_idle_poll_is_one_count_that_reads_no_run() -> None:
    fake = FakeAirflow()
    for i in range(20):
        fake.add(f"dag_{i}", AIRFLOW_NOW - timedelta(seconds=i), event=i)
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    fake.calls.clear()
    for _ in range(5):
        assert poll(src, AIRFLOW_NOW + timedelta(seconds=1)) == []
    assert len(fake.calls) == 5
    assert all(q.get("limit") == 0 for _, q in fake.calls)


def test_a_lone_new_run_costs_the_count_one_page_and_its_events() -> None:
    """Nothing else of its DAG within 10 s: its events are read (one request: did a trigger's copy of a
    message make it? ``core.trigger_event``), no list of its DAG, no task instances."""
    fake = FakeAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    fake.calls.clear()
    fake.add("alone", AIRFLOW_NOW + timedelta(seconds=1), event=1)
    assert poll(src, AIRFLOW_NOW + timedelta(seconds=2)) == []
    assert [q.get("order_by") for _, q in fake.calls] == [None, "-id", None]
    assert fake.reads("upstreamAssetEvents") == 1


def test_pages_follow_total_entries_when_the_server_caps_the_page() -> None:
    """The server answers at most 3 runs a page (its maximum_page_limit): the first read still gets
    all 10 runs of the window, and the duplicate among them is found."""
    fake = FakeAirflow(cap=3)
    for i in range(8):
        fake.add(f"dag_{i}", AIRFLOW_NOW - timedelta(minutes=1, seconds=i), event=i)
    first = AIRFLOW_NOW - timedelta(seconds=30)
    fake.add("consumer", first, event=100)
    duplicate = fake.add("consumer", first, event=100)
    src = source(fake)
    src.start(AIRFLOW_NOW)
    assert poll(src, AIRFLOW_NOW) == [duplicate]
    pages = [q for path, q in fake.calls if path == "/api/v2/dags/~/dagRuns" and q.get("limit") and "state" not in q]
    assert len(pages) == 4  # 10 runs, 3 a page


@pytest.mark.parametrize("skew", [timedelta(minutes=-10), timedelta(minutes=10)], ids=["behind", "ahead"])
def test_a_clock_skew_between_dupguard_and_airflow_hides_nothing(skew: timedelta) -> None:
    """dupguard's clock 10 min off Airflow's (less than the 15 min look-back): duplicates committed
    after start are found; after the first runs the window follows Airflow's run_after only."""
    fake = FakeAirflow()
    fake.add("earlier", AIRFLOW_NOW - timedelta(minutes=1), event=1)
    src = source(fake)
    mine = AIRFLOW_NOW + skew
    src.start(mine)
    assert poll(src, mine) == []
    found = []
    for i in range(3):
        at = AIRFLOW_NOW + timedelta(seconds=5 * i)
        fake.add(f"consumer_{i}", at, event=10 + i)
        found.append(fake.add(f"consumer_{i}", at, event=10 + i))
        assert poll(src, mine + timedelta(seconds=5 * i + 1)) == [found[-1]]


def test_new_runs_are_found_when_pages_are_capped_below_the_limit_asked() -> None:
    """More new runs at once than the server's page (cap 3): the newest-first read pages on by what
    came back and finds the duplicate among them."""
    fake = FakeAirflow(cap=3)
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    at = AIRFLOW_NOW + timedelta(seconds=1)
    fake.add("consumer", at, event=7)
    duplicate = fake.add("consumer", at, event=7)
    for i in range(6):
        fake.add(f"other_{i}", at + timedelta(milliseconds=i + 1), event=20 + i)
    assert poll(src, AIRFLOW_NOW + timedelta(seconds=2)) == [duplicate]


def test_a_run_deleted_between_the_list_and_the_read_is_dropped() -> None:
    """Listed, then deleted before its events are read (404): the poll goes on and the other new
    runs are still judged; the deleted run is never judged again."""
    fake = FakeAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    at = AIRFLOW_NOW + timedelta(seconds=1)
    doomed = fake.add("doomed", at, event=1)
    fake.add("doomed", at + timedelta(seconds=1), event=2)
    fake.add("consumer", at, event=3)
    duplicate = fake.add("consumer", at, event=3)
    fake.deleted.add(doomed)
    assert poll(src, AIRFLOW_NOW + timedelta(seconds=3)) == [duplicate]
    assert src.tail is not None and not src.tail.waiting


def test_a_steady_stream_of_runs_costs_one_page_a_poll_and_each_runs_events_once() -> None:
    """Ten runs a second over three DAGs (each DAG a run every 300 ms, each run its own event), for two
    minutes: the list clears every one (distinct run_after, in id order), so no list of a DAG and no
    task instances are read; each run's events are read once (the trigger_event kind: no event here is
    a trigger's, so nothing more); after the first busy poll each poll is one page request (no count),
    and the late sweep every 30 s takes none of the runs the tail listed."""
    fake = FakeAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    fake.calls.clear()
    at = AIRFLOW_NOW
    for _tick in range(400):
        for _ in range(3):
            at += timedelta(milliseconds=100)
            fake.add(f"consumer_{len(fake.runs) % 3}", at, event=len(fake.runs) + 1000)
        assert poll(src, at) == []
    events = [path for path, _ in fake.calls if path.endswith("/upstreamAssetEvents")]
    assert len(events) == len(set(events)) == 1200
    lists = [q for path, q in fake.calls if not path.endswith("/upstreamAssetEvents")]
    assert {path for path, _ in fake.calls} - set(events) == {"/api/v2/dags/~/dagRuns"}
    sweeps = [q for q in lists if q.get("state") == "running"]
    assert len(sweeps) == 4  # every 30 s of the 120
    assert len(lists) - len(sweeps) == 401  # one count (the first poll after an idle one), then a page a poll


def test_the_overlap_race_is_read_because_its_run_is_out_of_order() -> None:
    """The overlap race (docs/explanation/airflow-internals.md, "The 3.0/3.1 race", core.detect): the run committed
    second has an earlier run_after
    and consumed an event of the first again. Found whether the two arrive in one poll or two; the
    runs around them, in order, are read once each (their events: the trigger_event kind), never judged."""
    for together in (True, False):
        fake = FakeAirflow()
        src = source(fake)
        src.start(AIRFLOW_NOW)
        poll(src, AIRFLOW_NOW)
        fake.add("two_assets", AIRFLOW_NOW + timedelta(seconds=1), event=1)
        fake.add("two_assets", AIRFLOW_NOW + timedelta(seconds=3), event=(2, 3))  # A: both rows, committed first
        found = [] if together else poll(src, AIRFLOW_NOW + timedelta(seconds=3))
        stale = fake.add("two_assets", AIRFLOW_NOW + timedelta(seconds=2), event=2)  # B: its stale snapshot
        fake.add("two_assets", AIRFLOW_NOW + timedelta(seconds=4), event=4)
        found += poll(src, AIRFLOW_NOW + timedelta(seconds=5))
        assert found == [stale]
        # each run once; A a second time only when it came in an earlier poll (named by the shared event)
        assert fake.reads("upstreamAssetEvents") == (4 if together else 5)
        assert fake.reads("taskInstances") == 2  # the group's two runs only


def test_a_run_out_of_order_without_a_race_is_read_and_judged_no_duplicate() -> None:
    """A producer that committed its queue row late gives a run an earlier run_after than the one
    before it, with an event no other run has: read (the list cannot clear it), and not a group."""
    fake = FakeAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    fake.add("consumer", AIRFLOW_NOW + timedelta(seconds=2), event=1)
    fake.add("consumer", AIRFLOW_NOW + timedelta(seconds=1), event=2)
    assert poll(src, AIRFLOW_NOW + timedelta(seconds=3)) == []
    assert fake.reads("upstreamAssetEvents") == 2  # the out-of-order run, and the other one's own read


def test_a_pair_airflow_has_not_started_is_judged_at_the_first_poll_after_its_start() -> None:
    """Its events are unreadable until Airflow starts it (apache/airflow#71360): read again at every
    poll at first (not every 5 s), so it is judged at the poll after its start."""
    fake = FakeAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    at = AIRFLOW_NOW + timedelta(seconds=1)
    kept = fake.add("consumer", at, event=1, started=False)
    duplicate = fake.add("consumer", at, event=1, started=False)
    assert poll(src, at + timedelta(milliseconds=250)) == []
    assert poll(src, at + timedelta(milliseconds=375)) == []
    assert fake.reads("upstreamAssetEvents") == 0  # not asked: it would only fail
    assert fake.reads("taskInstances") == 0  # nor its tasks, nor its DAG's list: the pair waits
    assert ("/api/v2/dags/consumer/dagRuns", True) not in {(p, "order_by" in q) for p, q in fake.calls}
    fake.start(kept)
    fake.start(duplicate)
    assert poll(src, at + timedelta(milliseconds=500)) == [duplicate]


def test_a_pair_committed_with_an_old_run_after_is_found_by_the_late_sweep() -> None:
    """The schedulers catch up on queue rows 10 minutes old (an outage, an unpause) and race: both runs
    get that old run_after, below the window. The late sweep (one request every 30 s, for running
    runs started since the last sweep) finds the pair once it started; the poll costs nothing more."""
    fake = FakeAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    fake.add("busy", AIRFLOW_NOW, event=1)
    poll(src, AIRFLOW_NOW)
    old = AIRFLOW_NOW - timedelta(minutes=10)
    kept = fake.add("caught_up", old, event=2, started=False)
    duplicate = fake.add("caught_up", old, event=2, started=False)
    fake.calls.clear()
    later = AIRFLOW_NOW + timedelta(seconds=20)
    assert poll(src, later) == []  # below the window: the tail does not list them
    fake.start(kept, at=later)
    fake.start(duplicate, at=later)
    assert poll(src, AIRFLOW_NOW + timedelta(seconds=29)) == []  # the next sweep is not due yet
    sweeps = [q for _, q in fake.calls if q.get("state") == "running"]
    assert sweeps == []
    assert poll(src, AIRFLOW_NOW + timedelta(seconds=31)) == [duplicate]
    assert poll(src, AIRFLOW_NOW + timedelta(seconds=62)) == []  # swept once, judged once
    assert len([q for _, q in fake.calls if q.get("state") == "running"]) == 2


def test_partitioned_runs_are_read_only_when_their_key_repeats() -> None:
    """Airflow 3.2 partitioned runs: a stream of runs, each its own partition key, costs each run's
    events and no judgement; the race's pair (one key twice, run_after a few ms apart, the same
    event) is judged and found."""
    fake = FakeAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    at = AIRFLOW_NOW
    for i in range(30):
        at += timedelta(milliseconds=100)
        fake.add("partitioned", at, event=100 + i, partition_key=f"p{i:03}")
        if i % 3 == 2:
            assert poll(src, at) == []
    assert fake.reads("upstreamAssetEvents") == 30 and fake.reads("taskInstances") == 0
    fake.add("partitioned", at + timedelta(milliseconds=50), event=7, partition_key="p999")
    duplicate = fake.add("partitioned", at + timedelta(milliseconds=53), event=7, partition_key="p999")
    assert poll(src, at + timedelta(milliseconds=100)) == [duplicate]
    assert fake.reads("upstreamAssetEvents") == 32


def test_more_new_runs_than_the_last_poll_cost_one_page_of_what_is_missing() -> None:
    """Runs streaming in: the poll after one that found 10 asks for 10 at once; 12 arrived, so its
    second page asks for the 2 missing (plus one), not for a doubled page of runs already read."""
    fake = FakeAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    at = AIRFLOW_NOW
    for n in (10, 12):
        for _ in range(n):
            at += timedelta(milliseconds=10)
            fake.add(f"consumer_{len(fake.runs)}", at, event=len(fake.runs))
        fake.calls.clear()
        poll(src, at)
    pages = [(q.get("limit"), q.get("offset")) for path, q in fake.calls if path == "/api/v2/dags/~/dagRuns"]
    assert pages == [(10, 0), (3, 10)]


@dataclass
class StreamingAirflow(FakeAirflow):
    """The scheduler commits a run while each newest-first page is being served (10 runs/s and a page
    that takes ~100 ms): every page sees one run more than the page before it."""

    streaming: bool = False
    at: datetime = AIRFLOW_NOW

    def request(
        self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None, needs: str
    ) -> dict[str, Any]:
        if self.streaming and (query or {}).get("order_by") == "-id":
            self.at += timedelta(milliseconds=100)
            self.add(f"consumer_{len(self.runs) % 3}", self.at, event=len(self.runs) + 1000)
        return super().request(method, path, query=query, body=body, needs=needs)


def test_runs_committed_while_a_poll_pages_leave_for_the_next_poll_not_a_read_of_the_window() -> None:
    """Under a stream, a poll that needs a second page sees a new run arrive with each page. It looks
    for the runs its first page counted; those that arrived later are the next poll's. (It used to
    chase the count down to the bottom of the window: every run of it, in 7 pages.)"""
    fake = StreamingAirflow()
    src = source(fake)
    src.start(AIRFLOW_NOW)
    for _ in range(200):  # the window's older runs
        fake.at += timedelta(milliseconds=100)
        fake.add(f"consumer_{len(fake.runs) % 3}", fake.at, event=len(fake.runs) + 1000)
    poll(src, fake.at)
    for n in (10, 12):  # the second poll finds more new runs than the first: a second page
        for _ in range(n):
            fake.at += timedelta(milliseconds=100)
            fake.add(f"consumer_{len(fake.runs) % 3}", fake.at, event=len(fake.runs) + 1000)
        fake.calls.clear()
        fake.streaming = n == 12
        poll(src, fake.at)
    pages = [(q.get("limit"), q.get("offset")) for _, q in fake.calls if q.get("order_by") == "-id"]
    # 13 counted by the first page (12 and the one committed as it was served): 10, then the 3 missing
    # plus one for the run committed before the second page, which pushed them down
    assert pages == [(10, 0), (4, 10)]

    fake.streaming = False
    fake.calls.clear()
    poll(src, fake.at)  # the runs that arrived during the paging: found now, nothing lost
    assert src.tail is not None
    assert {r["dag_run_id"] for r in fake.runs[-60:]} <= set(k[1] for k in src.tail.seen)


def _watching(fake: FakeAirflow, version: str = "3.1.2") -> ApiSource:
    """A source past its first poll, the fake's calls cleared."""
    src = source(fake, version)
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    fake.calls.clear()
    return src


def _trigger_run(fake: FakeAirflow, event: int, message_id: str) -> datetime:
    """A run of ``orders`` made by a trigger's event carrying ``message_id``, a second after start."""
    at = AIRFLOW_NOW + timedelta(seconds=1)
    fake.trigger(event, at, message_id)
    fake.add("orders", at, event=event)
    return at


def test_two_runs_from_copies_of_one_message_are_found_with_one_events_list() -> None:
    """Two triggerers' copies of one SQS message (one MessageId), each made a run of the consumer: in
    order, distinct run_after, so the list clears both; their events (read once each) show a trigger's
    message id, so one ``GET /assets/events`` of the asset around them finds the copies: a
    trigger_event group, the first copy's run kept. A trigger's run alone costs its events and that
    one list, nothing more (no DAG list, no task instances)."""
    fake = FakeAirflow()
    src = _watching(fake)
    at = _trigger_run(fake, 1, "m-1")
    assert poll(src, at + timedelta(milliseconds=100)) == []
    assert (fake.reads("upstreamAssetEvents"), fake.reads("events"), fake.reads("taskInstances")) == (1, 1, 0)
    assert ("/api/v2/dags/orders/dagRuns", True) not in {(p, "order_by" in q) for p, q in fake.calls}
    fake.trigger(2, at + timedelta(milliseconds=300), "m-1")
    duplicate = fake.add("orders", at + timedelta(milliseconds=300), event=2)
    found = src.poll(at + timedelta(milliseconds=400))
    src.commit()
    [group] = found.findings
    assert group.kind.value == "trigger_event" and [r.run_id for r in group.duplicates] == [duplicate]
    assert group.shared_event_ids == (1, 2)


def test_a_copy_of_another_message_id_links_nothing() -> None:
    """Two messages (two MessageIds) with equal bodies: two real runs, no group."""
    fake = FakeAirflow()
    src = _watching(fake)
    at = _trigger_run(fake, 1, "m-1")
    fake.trigger(2, at + timedelta(milliseconds=300), "m-2")
    fake.add("orders", at + timedelta(milliseconds=300), event=2)
    assert poll(src, at + timedelta(milliseconds=400)) == []
    assert fake.reads("events") == 1 and fake.reads("taskInstances") == 0


@pytest.mark.parametrize("version", ["3.2.2", "3.3.2"])
def test_on_a_release_that_runs_one_copy_a_cleared_run_costs_nothing_more(version: str) -> None:
    """From 3.2.2 one triggerer runs an asset trigger (``trigger_event.copies_possible``): no new copy
    can make a run, so a trigger's run the list clears costs the count and the page only, as before."""
    fake = FakeAirflow()
    src = ApiSource(
        Config.of(source="api", startup_lookback=timedelta(minutes=15)),
        Reader(fake),
        MemoryLedger(),
        Metrics(),
        version=version,
    )
    src.start(AIRFLOW_NOW)
    poll(src, AIRFLOW_NOW)
    fake.calls.clear()
    at = AIRFLOW_NOW + timedelta(seconds=1)
    fake.trigger(1, at, "m-1")
    fake.add("orders", at, event=1)
    assert poll(src, at + timedelta(milliseconds=100)) == []
    assert [q.get("order_by") for _, q in fake.calls] == [None, "-id"]
