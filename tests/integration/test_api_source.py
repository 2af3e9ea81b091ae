"""`--source api`: scan and run through a real Airflow 3.1.2 API server only, on duplicates made by
Airflow's own scheduler code (the race fixtures, then ``start_queued_runs``: the scheduler's own
``_start_queued_dagruns``). dupguard gets no database URL; ground truth is what Airflow recorded
(the scenario's JSON, and the live database read by the test, never by dupguard).
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest

from detector.app.cli import main
from detector.app.run import run_daemon
from tests.airflow_server import (
    AirflowServer,
    CountingProxy,
    airflow_api_server,
    db_state,
    free_port,
    start_queued_runs,
)
from tests.daemon_harness import wait_for
from tests.pg import Templates, database_url, ground_truth

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

VERSION = "3.1.2"
FANOUT = "race_asset_fanout"  # 3 consumer DAGs, an exact duplicate pair each
OVERLAP = "race_overlap"  # a duplicate with another run_after that consumed an event again
SUCCESSIVE = "successive"  # look-alike: successive runs of one DAG, no duplicate
NOT_STARTED = "fanout"  # one event, 3 consumers, runs still queued as the scheduler left them
STARTED = (FANOUT, OVERLAP, SUCCESSIVE)
DUPGUARD = str(Path(sys.executable).parent / "dupguard")


@pytest.fixture(scope="module")
def af(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    with airflow_api_server(
        VERSION, [*STARTED, NOT_STARTED], pg_templates, tmp_path_factory.mktemp("af-api-source")
    ) as server:
        workers = [
            threading.Thread(target=start_queued_runs, args=(VERSION, database_url(server.sources[s]))) for s in STARTED
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        yield server


def scan_api(url: str, *args: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["scan", "--source", "api", "--airflow-api-url", url, "--format", "json", *args])
    return code, json.loads(out.getvalue())


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUPGUARD_AIRFLOW_USERNAME", "admin")
    monkeypatch.setenv("DUPGUARD_AIRFLOW_PASSWORD", "admin")
    monkeypatch.delenv("DUPGUARD_DATABASE_URL", raising=False)


def _groups(doc: dict[str, Any]) -> set[tuple[str, str, str, str, tuple[str, ...]]]:
    return {
        (g["dag_id"], g["kind"], g["confidence"], g["kept_run_id"], tuple(g["duplicate_run_ids"]))
        for g in doc["groups"]
    }


def _truth(scenario: str, version: str = VERSION) -> set[tuple[str, str, str, str, tuple[str, ...]]]:
    return {
        (
            g["dag_id"],
            g["kind"],
            g["confidence"],
            g["first_run_id"],
            tuple(r for r in g["run_ids"] if r != g["first_run_id"]),
        )
        for g in ground_truth(VERSION, scenario)["expected_groups"]
    }


@pytest.mark.parametrize("scenario", STARTED)
def test_scan_through_the_api_finds_what_airflow_recorded(af: AirflowServer, creds: None, scenario: str) -> None:
    """Every group the race made (and nothing for the look-alike), with the kept run Airflow committed
    first; the same groups, keys and events as the database scan of the same database."""
    url = af.reset(scenario)
    code, doc = scan_api(af.url)
    assert _groups(doc) == _truth(scenario)
    assert code == (1 if doc["groups"] else 0)
    assert doc["source"] == "api" and doc["airflow_version"] == VERSION and doc["note"] is None
    assert all(r["id"] is None for g in doc["groups"] for r in g["runs"])  # the API shows no dag_run.id
    out = io.StringIO()
    with redirect_stdout(out):
        main(["scan", "--database-url", url, "--format", "json"])
    by_db = json.loads(out.getvalue())
    fields = ("key", "kind", "confidence", "kept_run_id", "duplicate_run_ids", "shared_event_ids", "run_after")
    assert [{f: g[f] for f in fields} for g in doc["groups"]] == [{f: g[f] for f in fields} for g in by_db["groups"]]


def test_runs_airflow_has_not_started_are_reported_not_judged(af: AirflowServer, creds: None) -> None:
    """Airflow cannot serve the events of a run it has not started (apache/airflow#71360): the scan
    says how many runs it could not judge instead of judging them without their events."""
    af.reset(NOT_STARTED)
    code, doc = scan_api(af.url)
    assert code == 0 and doc["groups"] == []
    assert doc["note"] is not None and "not judged" in doc["note"] and "71360" in doc["note"]


def _env(url: str, state: Path | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "DUPGUARD_SOURCE": "api",
        "DUPGUARD_AIRFLOW_API_URL": url,
        "DUPGUARD_AIRFLOW_USERNAME": "admin",
        "DUPGUARD_AIRFLOW_PASSWORD": "admin",
        "DUPGUARD_LOG_FORMAT": "json",
        "DUPGUARD_STARTUP_LOOKBACK": "3650d",
        "DUPGUARD_POLL_INTERVAL": "100ms",
        "DUPGUARD_HTTP_PORT": "0",
    } | extra  # fmt: skip
    if state is not None:
        env["DUPGUARD_STATE_FILE"] = str(state)
    return env


def _events(text: str, name: str | None = None) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.startswith("{")]
    return [e for e in found if name is None or e.get("event") == name]


def _once(env: dict[str, str]) -> tuple[int, str]:
    """`dupguard run --once` with ``env`` as its whole environment, in this process: a process of its own
    paid ~3.5 s importing apache-airflow-client's models each time (tests/integration/test_run_process.py
    runs the installed command)."""
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(out):
        code = run_daemon({}, once=True, env=env, install_signals=False)
    return code, out.getvalue()


def _duplicates(scenario: str, version: str = VERSION) -> dict[str, str]:
    """duplicate run_id -> its kept run_id, from Airflow's record of which scheduler made which run."""
    return {
        r: g["first_run_id"]
        for g in ground_truth(version, scenario)["expected_groups"]
        for r in g["run_ids"]
        if r != g["first_run_id"]
    }


def _assert_stopped_exactly(url: str, scenario: str, before: dict[str, Any]) -> None:
    after = db_state(url)
    duplicates = _duplicates(scenario)
    for run_id, row in after.items():
        if run_id in duplicates:
            assert row.state == "failed", run_id
            assert row.note is not None and duplicates[run_id] in row.note
        else:
            assert row == before[run_id], f"{run_id} must be untouched"


@pytest.mark.parametrize("scenario", STARTED)
def test_the_daemon_judges_only_runs_the_list_cannot_clear(af: AirflowServer, tmp_path: Path, scenario: str) -> None:
    """`run --once` (the daemon's poll, not scan): it finds what Airflow recorded -- the exact pairs,
    the overlap race (another run_after, found only because that run is out of id order) and nothing
    in the successive look-alike -- and reads the task instances of the runs of those groups only.
    On 3.1.2 each run's consumed events are read once (a trigger's copy of a message may have made it:
    the trigger_event kind, docs/explanation/api-source.md); none here is a trigger's, so nothing more is read."""
    af.reset(scenario)
    with CountingProxy(af.port) as proxy:
        code, out = _once(_env(proxy.url, tmp_path / "state.json"))
        assert code == 0, out
        reads = {
            (m, p): n for (m, p), n in proxy.requests.items() if p.endswith(("/upstreamAssetEvents", "/taskInstances"))
        }
    tasks = {unquote(p.split("/")[-2]) for _, p in reads if p.endswith("/taskInstances")}
    events = [n for (_, p), n in reads.items() if p.endswith("/upstreamAssetEvents")]
    truth = _duplicates(scenario)
    found = {r: e["kept_run"] for e in _events(out, "duplicate_detected") for r in e["duplicate_runs"]}
    assert found == truth
    assert tasks == set(truth) | set(truth.values())
    asset_runs = [r for r in ground_truth(VERSION, scenario)["runs"] if r["run_type"] == "asset_triggered"]
    assert max(events) == 1 and len(events) == len(asset_runs)
    assert not any(p.startswith("/api/v2/assets/events") for _, p in proxy.requests)


def test_a_race_on_old_queue_rows_is_found_by_the_late_sweep(af: AirflowServer, tmp_path: Path) -> None:
    """Runs whose run_after lies far below the window (the schedulers caught up on old queue rows) are
    never listed by the tail. With a 1-minute look-back, the race's runs (hours old) are queued when
    dupguard starts; Airflow's own code then starts them, and the next late sweep finds each pair."""
    from sqlalchemy import create_engine, make_url, text

    url = af.reset(FANOUT)
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg2"))
    with engine.begin() as conn:  # as the scheduler that created them left them
        conn.execute(text("UPDATE dag_run SET state = 'queued', start_date = NULL WHERE run_type = 'asset_triggered'"))
    engine.dispose()
    log = tmp_path / "run.log"
    env = _env(af.url, tmp_path / "state.json", DUPGUARD_STARTUP_LOOKBACK="1m")
    with log.open("wb") as out:
        daemon = subprocess.Popen([DUPGUARD, "run"], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: bool(_events(log.read_text(), "watching")), timeout=60, what="watching")
        time.sleep(1)
        assert _events(log.read_text(), "duplicate_detected") == []
        start_queued_runs(VERSION, url)
        wait_for(lambda: len(_events(log.read_text(), "duplicate_detected")) >= 3, timeout=60, what="3 groups")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=15)
    text_ = log.read_text()
    found = {r: e["kept_run"] for e in _events(text_, "duplicate_detected") for r in e["duplicate_runs"]}
    assert found == _duplicates(FANOUT)
    assert _events(text_, "late_runs")


def test_run_once_fails_each_duplicate_and_a_restart_repeats_nothing(af: AirflowServer, tmp_path: Path) -> None:
    """`run --once --source api` with remediation fail: each duplicate failed through the API with the
    note naming its kept run, every other run untouched. Run again with the same state file: no
    alert and no write; with a fresh state file (no memory at all) the notes alone keep it from
    writing again (the alert repeats, as documented)."""
    url = af.reset(FANOUT)
    before = db_state(url)
    state = tmp_path / "state.json"
    with CountingProxy(af.port) as proxy:
        env = _env(proxy.url, state, DUPGUARD_REMEDIATION="fail")
        code, out = _once(env)
        assert code == 0, out
        assert len(_events(out, "duplicate_detected")) == 3
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
        assert patches == 3
        _assert_stopped_exactly(url, FANOUT, before)
        stopped = db_state(url)
        code, out = _once(env)
        assert code == 0 and _events(out, "duplicate_detected") == []
        code, out = _once(_env(proxy.url, tmp_path / "fresh.json", DUPGUARD_REMEDIATION="fail"))
        assert code == 0 and len(_events(out, "duplicate_detected")) == 3
        assert sum(n for (m, _), n in proxy.requests.items() if m == "PATCH") == patches
    assert db_state(url) == stopped


def test_a_viewer_watches_and_a_remediation_it_may_not_make_names_the_permission(
    af: AirflowServer, tmp_path: Path
) -> None:
    """The minimum permissions of docs/how-to/airflow-api-auth.md: the viewer role is enough to watch (the
    same groups as admin), and `run --once` with remediation fail as a viewer changes nothing and says
    in one line which Airflow permission the PATCH lacks."""
    url = af.reset(FANOUT)
    before = db_state(url)
    viewer = {"DUPGUARD_AIRFLOW_USERNAME": "viewer", "DUPGUARD_AIRFLOW_PASSWORD": "viewer"}
    done = subprocess.run(
        [DUPGUARD, "scan", "--format", "json"], env=_env(af.url, None, **viewer), capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    assert _groups(json.loads(done.stdout)) == _truth(FANOUT)
    code, out = _once(_env(af.url, tmp_path / "state.json", DUPGUARD_REMEDIATION="fail", **viewer))
    # a pass that ran: failed remediations are told in alerts and logs (docs/reference/cli.md, exit codes)
    assert code == 0
    assert len(_events(out, "duplicate_detected")) == 3, out
    refused = [e for e in _events(out) if "HTTP 403" in json.dumps(e)]
    assert refused and all("can edit" in json.dumps(e) for e in refused), refused
    assert "Traceback" not in out
    assert db_state(url) == before


def test_restart_in_the_middle_of_a_storm(af: AirflowServer, tmp_path: Path) -> None:
    """SIGKILL while the second of three remediations is on the wire, then a restart with the same
    state file: every group alerted once over both lives, every duplicate failed, the kept runs and
    the other runs untouched, and no duplicate PATCHed twice."""
    url = af.reset(FANOUT)
    before = db_state(url)
    duplicates = sorted(_duplicates(FANOUT))
    state = tmp_path / "state.json"
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    with CountingProxy(af.port) as proxy:
        env = _env(proxy.url, state, DUPGUARD_REMEDIATION="fail")
        patched: list[str] = []

        def count_patch(path: str) -> Any:
            return lambda: patched.append(path)

        for run_id in duplicates:
            dag = next(r.dag_id for r in before.values() if r.run_id == run_id)
            proxy.hooks.append((f"PATCH /api/v2/dags/{dag}/dagRuns/{quote(run_id, safe='')}", count_patch(run_id)))
        with log1.open("wb") as out:
            first = subprocess.Popen([DUPGUARD, "run"], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: len(patched) >= 2, timeout=60, what="two remediations sent")
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        finally:
            if first.poll() is None:
                first.kill()
        with log2.open("wb") as out:
            second = subprocess.Popen([DUPGUARD, "run"], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: all(db_state(url)[r].state == "failed" for r in duplicates), timeout=60, what="all failed")
            time.sleep(1.5)  # a few more polls: nothing else may happen
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=15)
        patches = {
            r: proxy.count("PATCH", f"/api/v2/dags/{before[r].dag_id}/dagRuns/{quote(r, safe='')}") for r in duplicates
        }
    detected = _events(log1.read_text(), "duplicate_detected") + _events(log2.read_text(), "duplicate_detected")
    assert sorted(e["group_key"] for e in detected) == sorted({e["group_key"] for e in detected})
    assert len(detected) == 3
    assert patches == dict.fromkeys(duplicates, 1)
    _assert_stopped_exactly(url, FANOUT, before)


def test_two_accidental_replicas_never_touch_a_kept_run(af: AirflowServer, tmp_path: Path) -> None:
    """Two replicas (each its own state file) on the same duplicates at once: both keep the same run
    of each group (the keep rule is deterministic), each duplicate ends failed once, and a replica's
    second write finds the run already failed by the first. Alerts may repeat (at most one per replica)."""
    url = af.reset(FANOUT)
    before = db_state(url)
    with CountingProxy(af.port) as proxy:
        procs = []
        for i in (1, 2):
            env = _env(proxy.url, tmp_path / f"state{i}.json", DUPGUARD_REMEDIATION="fail")
            procs.append(
                subprocess.Popen(
                    [DUPGUARD, "run", "--once"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
            )
        outs = [p.communicate(timeout=120)[0] for p in procs]
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert all(p.returncode == 0 for p in procs), outs
    _assert_stopped_exactly(url, FANOUT, before)
    detected = [e for out in outs for e in _events(out, "duplicate_detected")]
    assert 3 <= len(detected) <= 6
    kept = {(e["group_key"], e["kept_run"]) for e in detected}
    assert len(kept) == 3  # both replicas kept the same run of each group
    results = [e for out in outs for e in _events(out, "remediation")]
    assert {e["result"] for e in results} <= {"done", "already"}
    assert 3 <= patches <= 6
    print(f"two replicas: {len(detected)} alerts, {patches} PATCH requests for 3 duplicates")


class _NotAirflow(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_bad_endpoints_and_credentials_are_one_line_errors(af: AirflowServer, tmp_path: Path) -> None:
    """Unreachable, wrong password, and a server without Airflow 3's API v2 (404): exit 3 with one
    line, no traceback, no password."""
    dead = f"http://127.0.0.1:{free_port()}"
    code, out = _once(_env(dead, None))
    assert code == 3 and "connection refused" in out and "Traceback" not in out
    code, out = _once(_env(af.url, None, DUPGUARD_AIRFLOW_PASSWORD="wrong-secret-pw"))
    assert code == 3 and "rejected user 'admin'" in out and "wrong-secret-pw" not in out and "Traceback" not in out
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotAirflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, out = _once(_env(f"http://127.0.0.1:{server.server_address[1]}", None, DUPGUARD_AIRFLOW_TOKEN="t"))
    finally:
        server.shutdown()
        server.server_close()
    assert code == 3 and "not an Airflow 3 API server" in out and "Traceback" not in out


def _ready(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def test_outage_and_429_are_logged_once_readyz_red_and_nothing_lost(af: AirflowServer, tmp_path: Path) -> None:
    """The API goes down under a running daemon (every answer 503): /readyz turns red with
    api_unreachable, logged once per change, not per poll. A duplicate Airflow made meanwhile (the
    live database is switched to the overlap race) is found when the API is back, also after three
    429 answers on the list."""
    af.reset(SUCCESSIVE)
    port = free_port()
    log = tmp_path / "run.log"
    with CountingProxy(af.port) as proxy:
        env = _env(
            proxy.url, tmp_path / "state.json", DUPGUARD_HTTP_PORT=str(port), DUPGUARD_LEADER_CHECK_INTERVAL="200ms"
        )
        with log.open("wb") as out:
            proc = subprocess.Popen([DUPGUARD, "run"], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: _ready(port)[0] == 200, timeout=60, what="/readyz green")
            proxy.outage = 503
            wait_for(lambda: "api_unreachable" in _ready(port)[1], timeout=30, what="/readyz api_unreachable")
            assert _ready(port)[0] == 503
            af.reset(OVERLAP)
            time.sleep(2.0)  # many polls while down
            for _ in range(3):
                proxy.inject.append(("/api/v2/dags/~/dagRuns", 429, 0.0))
            proxy.outage = 0
            wait_for(lambda: len(_events(log.read_text(), "duplicate_detected")) == 1, timeout=60, what="the group")
            wait_for(lambda: _ready(port)[0] == 200, timeout=10, what="/readyz green again")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
    text = log.read_text()
    assert "Traceback" not in text
    assert _groups({"groups": [_as_group(e) for e in _events(text, "duplicate_detected")]}) == _truth(OVERLAP)
    changes = [e["state"] for e in _events(text, "status_changed")]
    assert changes.count("api_unreachable") == 1, changes
    assert len(_events(text, "poll_failed")) <= 3  # once per failing streak, not once per poll


def _as_group(event: dict[str, Any]) -> dict[str, Any]:
    return {
        "dag_id": event["dag_id"],
        "kind": event["kind"],
        "confidence": event["confidence"],
        "kept_run_id": event["kept_run"],
        "duplicate_run_ids": event.get("duplicate_runs", []),
    }


PARTITIONED = ("race_partitioned", "partition_fanout")  # 3.2.2: the partitioned race, and its look-alike


def _started(version: str, scenarios: tuple[str, ...], templates: Templates, home: Path) -> Iterator[AirflowServer]:
    """An API server on ``scenarios`` whose queued runs Airflow's code started (their events are
    unreadable before, apache/airflow#71360)."""
    with airflow_api_server(version, list(scenarios), templates, home) as server:
        start_queued_runs(version, *(database_url(server.sources[s]) for s in scenarios))
        yield server


@pytest.fixture(scope="module")
def af322(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    yield from _started("3.2.2", PARTITIONED, pg_templates, tmp_path_factory.mktemp("af322-api"))


@pytest.mark.parametrize("scenario", PARTITIONED)
def test_scan_through_the_api_on_partitioned_runs(
    af322: AirflowServer, creds: None, tmp_path: Path, scenario: str
) -> None:
    """Airflow 3.2.2: the partitioned race (two runs of one partition key, run_after 8 ms apart) is
    found with the run Airflow committed first kept; one event mapped to several keys is not a group.
    The daemon's poll finds the same, reading the events of the race's runs only."""
    url = af322.reset(scenario)
    with CountingProxy(af322.port) as proxy:
        code, out = _once(_env(proxy.url, tmp_path / "state.json"))
        assert code == 0, out
        read = {unquote(path.split("/")[-2]) for _, path in proxy.requests if path.endswith("/upstreamAssetEvents")}
    duplicates = _duplicates(scenario, "3.2.2")
    assert {r: e["kept_run"] for e in _events(out, "duplicate_detected") for r in e["duplicate_runs"]} == duplicates
    assert read == set(duplicates) | set(duplicates.values())
    code, doc = scan_api(af322.url)
    truth = {
        (
            g["dag_id"],
            g["kind"],
            g["confidence"],
            g["first_run_id"],
            tuple(r for r in g["run_ids"] if r != g["first_run_id"]),
        )
        for g in ground_truth("3.2.2", scenario)["expected_groups"]
    }
    assert _groups(doc) == truth
    assert code == (1 if truth else 0)
    out = io.StringIO()
    with redirect_stdout(out):
        main(["scan", "--database-url", url, "--format", "json"])
    by_db = json.loads(out.getvalue())
    fields = ("key", "kind", "confidence", "kept_run_id", "duplicate_run_ids", "partition_key", "shared_event_ids")
    assert [{f: g[f] for f in fields} for g in doc["groups"]] == [{f: g[f] for f in fields} for g in by_db["groups"]]


def _webhook_assets(url: str, state: Path) -> list[list[str]]:
    """``run --once`` through the REST API with a real webhook receiver: each DETECTED payload's assets."""
    from tests.slack_server import SlackServer

    server = SlackServer()
    try:
        code, out = _once(_env(url, state, DUPGUARD_WEBHOOK_URL=server.generic_url))
        assert code == 0, out
        return [p["group"]["assets"] for p in server.generic_payloads if p["type"] == "detected"]
    finally:
        server.stop()


def test_the_webhook_names_the_assets_read_through_the_api(af: AirflowServer, tmp_path: Path) -> None:
    """The REST source reads each consumed event's asset (name, URI) from
    upstreamAssetEvents, so the webhook names it (was ``"assets": []``). Airflow 3.1.2, three groups."""
    af.reset(FANOUT)
    assert _webhook_assets(af.url, tmp_path / "state.json") == [["orders (s3://warehouse/orders)"]] * 3


def test_the_webhook_names_the_partitioned_asset_read_through_the_api(af322: AirflowServer, tmp_path: Path) -> None:
    """The same on Airflow 3.2.2's partitioned race (an asset whose name is its URI: named once)."""
    af322.reset("race_partitioned")
    assert _webhook_assets(af322.url, tmp_path / "state.json") == [["hourly_sales"]]


@pytest.fixture(scope="module")
def af306(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    yield from _started("3.0.6", STARTED, pg_templates, tmp_path_factory.mktemp("af306-api"))


@pytest.mark.parametrize("scenario", STARTED)
def test_airflow_3_0_through_the_api(af306: AirflowServer, creds: None, tmp_path: Path, scenario: str) -> None:
    """Airflow 3.0.6 (the oldest API v2 dupguard supports): `scan` and the daemon's poll find what 3.0.6's
    own scheduler recorded, with the run it committed first kept."""
    af306.reset(scenario)
    truth = _duplicates(scenario, "3.0.6")
    code, doc = scan_api(af306.url)
    assert {r: g["kept_run_id"] for g in doc["groups"] for r in g["duplicate_run_ids"]} == truth
    assert doc["airflow_version"] == "3.0.6"
    code, out = _once(_env(af306.url, tmp_path / "state.json"))
    assert code == 0, out
    assert {r: e["kept_run"] for e in _events(out, "duplicate_detected") for r in e["duplicate_runs"]} == truth


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/html; charset=utf-8", b"<!doctype html><html><body>Sign in to continue</body></html>"),
        ("application/json", b'{"dag_runs": [{"dag_id": "consumer_a", "dag_run_id": "asset_trig'),
    ],
    ids=["html-page", "cut-json"],
)
def test_an_answer_that_is_not_json_says_so(af: AirflowServer, content_type: str, body: bytes) -> None:
    """A proxy's sign-in page or a cut body where the runs list should be: the error says the answer
    is not JSON, with its status and content type (it said "no total_entries in the answer")."""
    with CountingProxy(af.port) as proxy:
        proxy.answers.append(("/api/v2/dags/~/dagRuns", 200, content_type, body))
        code, out = _once(_env(proxy.url, None))
    assert code == 3 and "Traceback" not in out, out
    assert f"HTTP 200 answer is not JSON (Content-Type {content_type}, {len(body)} bytes)" in out, out
    assert "total_entries" not in out


def _serve(url: str, state: Path, log: Path, port: int, hook: Any, **settings: str) -> subprocess.Popen[bytes]:
    """`dupguard run` on ``url`` with health on ``port``, alerts to ``hook``'s JSON webhook and
    ``settings`` (names without DUPGUARD_), its log in ``log``; returned once /readyz is green."""
    extra = {f"DUPGUARD_{k}": v for k, v in settings.items()}
    env = _env(
        url,
        state,
        DUPGUARD_HTTP_PORT=str(port),
        DUPGUARD_LEADER_CHECK_INTERVAL="200ms",
        DUPGUARD_WEBHOOK_URL=hook.generic_url,
        **extra,
    )
    with log.open("wb") as out:
        proc = subprocess.Popen([DUPGUARD, "run"], env=env, stdout=out, stderr=subprocess.STDOUT)
    wait_for(lambda: _ready(port)[0] == 200, timeout=60, what="/readyz green")
    return proc


def _stopped(proc: subprocess.Popen[bytes], hook: Any, log: Path) -> str:
    """Stop what ``_serve`` started (and the webhook receiver); the log, which holds no traceback."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)
    hook.stop()
    text = log.read_text()
    assert "Traceback" not in text
    return text


def test_an_api_that_trickles_is_cut_at_the_deadline_loudly(af: AirflowServer, tmp_path: Path) -> None:
    """A proxy forwards the run list one byte a second (no read ever waits long enough
    for --airflow-timeout, 3 s, to fire). Each poll is cut at the deadline: /readyz turns red naming
    it, dupguard_deadline_exceeded_total{peer="airflow_api"} counts it, a poll_failed line says it.
    Then the API answers again and a duplicate appears while the JSON webhook trickles: the group is
    found, and /readyz (green) names the webhook's undelivered alert and its deadline."""
    from tests.integration.test_run_process import metric
    from tests.slack_server import SlackServer

    af.reset(SUCCESSIVE)
    port, log, hook = free_port(), tmp_path / "run.log", SlackServer()
    with CountingProxy(af.port) as proxy:
        proc = _serve(proxy.url, tmp_path / "state.json", log, port, hook, AIRFLOW_TIMEOUT="3s", ALERT_TIMEOUT="3s")
        try:
            proxy.trickle.add("/api/v2/dags/~/dagRuns")
            cut = "no complete answer within 3 s (--airflow-timeout)"
            wait_for(lambda: cut in _ready(port)[1], timeout=90, what="/readyz naming the deadline")
            assert _ready(port)[0] == 503
            assert (metric(port, 'dupguard_deadline_exceeded_total{peer="airflow_api"}') or 0) >= 1
            hook.trickle_next(3)  # the group's alert: its first try and both retries
            af.reset(OVERLAP)
            proxy.trickle.clear()
            wait_for(lambda: len(_events(log.read_text(), "duplicate_detected")) == 1, timeout=60, what="the group")
            undelivered = "alerts undelivered: webhook: 1 in the last 15 min (latest: webhook: timed out: no complete"
            wait_for(lambda: undelivered in _ready(port)[1], timeout=90, what="/readyz naming the webhook")
            assert _ready(port)[0] == 200  # an alert that failed does not stop detection
            assert (metric(port, 'dupguard_deadline_exceeded_total{peer="webhook"}') or 0) == 3
        finally:
            text = _stopped(proc, hook, log)
    assert any(cut in str(e.get("error")) for e in _events(text, "poll_failed"))
    [alert] = _events(text, "alert_undelivered")
    assert "no complete answer within 3 s" in alert["error"]


def test_a_full_state_volume_alerts_anyway_and_remediates_once_it_can_record(af: AirflowServer, tmp_path: Path) -> None:
    """A ledger that cannot record, on a really full filesystem under DUPGUARD_STATE_FILE: three duplicates appear.
    Each is alerted at once (log and webhook), once, saying it may repeat; none is remediated while
    its claim cannot be recorded; /readyz names the cause (no space left), not "invalid
    configuration:". Once space is freed each is stopped, and the alerts are not sent again."""
    from tests.full_volume import fill, small_volume
    from tests.integration.test_run_process import metric
    from tests.slack_server import SlackServer

    af.reset(SUCCESSIVE)
    port, log, hook = free_port(), tmp_path / "run.log", SlackServer()
    with small_volume(tmp_path / "volume") as volume, CountingProxy(af.port) as proxy:
        proc = _serve(proxy.url, volume / "state.json", log, port, hook, REMEDIATION="fail")
        try:
            filler = fill(volume)
            url = af.reset(FANOUT)
            before = db_state(url)
            detected = lambda: [p for p in hook.generic_payloads if p["type"] == "detected"]  # noqa: E731
            wait_for(lambda: len(detected()) == 3, timeout=60, what="three alerts while the volume is full")
            wait_for(lambda: "No space left on device" in _ready(port)[1], timeout=30, what="/readyz naming it")
            assert _ready(port)[0] == 503
            polls = metric(port, "dupguard_poll_errors_total") or 0
            wait_for(lambda: (metric(port, "dupguard_poll_errors_total") or 0) >= polls + 3, 90, "retried polls")
            assert len(detected()) == 3 and all(p["group"]["may_repeat"] for p in detected())
            assert all("May repeat: the ledger could not record" in p["text"] for p in detected())
            assert sum(n for (m, _), n in proxy.requests.items() if m == "PATCH") == 0
            assert db_state(url) == before
            filler.unlink()
            outcomes = lambda: [p for p in hook.generic_payloads if p["type"] == "outcome"]  # noqa: E731
            wait_for(lambda: len(outcomes()) == 3, timeout=90, what="the three stops, announced")
            wait_for(lambda: _ready(port)[0] == 200, timeout=30, what="/readyz green again")
            _assert_stopped_exactly(url, FANOUT, before)
            assert len(detected()) == 3
        finally:
            text = _stopped(proc, hook, log)
    assert len(_events(text, "duplicate_detected")) == 3
    assert len(_events(text, "ledger_claim_failed")) == 3
    assert all("No space left on device" in e["error"] for e in _events(text, "ledger_claim_failed"))
