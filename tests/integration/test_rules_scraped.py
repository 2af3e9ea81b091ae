"""The alert rules on series scraped from real daemons, not on invented ones.

Each case runs a real ``Daemon`` on an Airflow-made 3.1.2 fixture (real PostgreSQL, real ``db`` or
``api`` remediation), scrapes its registry (``generate_latest``, what ``/metrics`` serves) before and
after one outcome (detected, done, too_late, caught_after_start, prevented, failed, leader lost,
gone), and turns the two scrapes into promtool ``input_series``: the first held for five minutes,
the second after it, with the target labels Prometheus adds. ``promtool test rules`` then asserts
which alerts fire after the outcome and that none fires before it, so a counter the daemon never
increments (or never starts at 0: ``increase()`` ignores a series' first sample) fails the test.

The "before" scrape is taken while another session holds the leader lock (a live foreign leader:
the daemon stands by and judges nothing), then the lock is released and the daemon takes over. The
rules run without their annotations (those are pinned by tests/deploy/promtool/rules-test.yaml).
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from detector.core.model import GUARD_NOTE_PREFIX
from tests.airflow_server import sql
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.deploy.test_deploy_monitoring import RULES, run_promtool
from tests.integration.test_keep_final import _TaskStartsFirst
from tests.pg import Templates, ground_truth
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.integration

# What Prometheus' scrape adds to every series (target labels; cluster as Thanos/Mimir carry it).
TARGET = {"cluster": "test", "namespace": "airflow", "pod": "airflow-scheduler-0", "job": "dupguard"}
BEFORE, AFTER = 5, 8  # one-minute samples of each scrape: 0m..4m before, 5m..12m after the outcome
LOCK_KEY = 2_402_403_001
LONG_AGO = timedelta(days=3650)  # the look-back reaches the fixture's runs
STANDBY_CHECKS = timedelta(minutes=5)  # longer than a case: the only checks are the first and run's own
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True)
class Scrape:
    at: float  # wall clock of the scrape
    samples: Samples

    def value(self, name: str, **labels: str) -> float:
        return sum(v for (n, ls), v in self.samples.items() if n == name and labels.items() <= dict(ls).items())


def scrape(d: Running) -> Scrape:
    at = time.time()
    text = generate_latest(d.metrics.registry).decode()
    samples = (s for family in text_string_to_metric_families(text) for s in family.samples)
    return Scrape(at, {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples if not math.isnan(s.value)})


def input_series(before: Scrape, after: Scrape | None, pod: str = TARGET["pod"]) -> list[dict[str, str]]:
    """Each series of one target as Prometheus would store it: the first scrape for BEFORE minutes,
    then the second (``_`` where a series did not exist yet; ``stale`` once the target is gone). A
    unix timestamp keeps its age at the scrape on promtool's clock (which starts at 0), so rules on
    ``time() - …`` see what Prometheus would."""
    target = TARGET | {"pod": pod}
    out = []
    for name, labels in sorted(before.samples.keys() | (after.samples.keys() if after else set())):
        selector = ", ".join(f"{k}={json.dumps(v)}" for k, v in sorted({**dict(labels), **target}.items()))
        timestamp = name.endswith("_timestamp_seconds") or name == "process_start_time_seconds"
        values = []
        for minute in range(BEFORE + AFTER):
            taken = before if minute < BEFORE else after
            v = None if taken is None else taken.samples.get((name, labels))
            if taken is None:
                values.append("stale" if minute == BEFORE else "_")
            elif v is None:
                values.append("_")
            else:
                values.append(repr(minute * 60 - (taken.at - v) if timestamp and v > 0 else v))
        out.append({"series": f"{name}{{{selector}}}", "values": " ".join(values)})
    return out


def alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def assert_rules(
    tmp_path: Path,
    series: list[dict[str, str]],
    expected: dict[str, list[dict[str, str]]],
    *,
    grew: dict[str, float] | None = None,
) -> None:
    """promtool: before the outcome (1m) no alert fires; at 12m exactly ``expected`` fire (alert ->
    the label sets beyond alertname and severity), every other alert stays quiet. ``grew``: by how
    much each remediation result's counter rose between the scrapes (every other result: not at all)."""
    rules = alerts()
    assert expected.keys() <= rules.keys()
    stripped = [{k: v for k, v in r.items() if k != "annotations"} for r in rules.values()]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "dupguard", "rules": stripped}]}))
    end = f"{BEFORE + AFTER - 1}m"
    tests: list[dict[str, Any]] = [{"eval_time": "1m", "alertname": a, "exp_alerts": []} for a in rules]
    tests += [
        {
            "eval_time": end,
            "alertname": a,
            "exp_alerts": [{"exp_labels": {**labels, **rules[a]["labels"]}} for labels in expected.get(a, [])],
        }
        for a in rules
    ]
    exprs = []
    if grew is not None:  # the last sample minus the last one before the outcome: exact, no extrapolation
        rise = f"sum by (result) (dupguard_remediations_total - dupguard_remediations_total offset {AFTER}m) > 0"
        samples = [{"labels": f'{{result="{r}"}}', "value": v} for r, v in sorted(grew.items())]
        exprs.append({"expr": rise, "eval_time": end, "exp_samples": samples})
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": tests,
                "promql_expr_test": exprs,
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(doc, width=1000))
    run_promtool("test", "rules", "test.yaml", cwd=tmp_path)


def remediated(result: str, backend: str = "db") -> dict[str, str]:
    return {"mode": "fail", "backend": backend, "result": result, **TARGET}


DETECTED = {"kind": "asset", "confidence": "confirmed", **TARGET}
LEADERS = {"namespace": TARGET["namespace"], "cluster": TARGET["cluster"]}


class ForeignLeader:
    """Another session holding dupguard's lock key, and alive (a statement every 0.1 s, so the
    daemon stands by behind it instead of reporting it unresponsive)."""

    def __init__(self, url: str, key: int) -> None:
        self.conn = psycopg2.connect(url)
        self.conn.autocommit = True
        self.key, self.stopped = key, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def take(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s)", (self.key,))
            assert cur.fetchone() == (True,), "the lock key is taken"
        self.thread.start()

    def _beat(self) -> None:
        while not self.stopped.wait(0.1):
            with self.conn.cursor() as cur:
                cur.execute("SELECT 1")

    def release(self) -> None:
        """Unlock, then close: closing alone frees the lock only once the server's backend has exited, and
        on a busy machine the standby's takeover check came first, found the lock held and stood by."""
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(5)
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
        self.conn.close()


def daemon(url: str, **settings: Any) -> Running:
    """A daemon with the remediator its settings ask for (it counts every result), on a lock key no
    other test uses, acting at once on taking the lock (no predecessor's writes to wait for)."""
    return start_daemon(url, real_remediation=True, lock_key=LOCK_KEY, takeover_wait=timedelta(0), **settings)


def polled(d: Running) -> None:
    """Wait for the first successful poll (before it, db_up and the poll's timestamp are 0)."""
    stamp = "dupguard_last_successful_poll_timestamp_seconds"
    wait_for(lambda: (d.metrics.registry.get_sample_value(stamp) or 0) > 0, what="a successful poll")


def state(d: Running) -> str | None:
    samples = d.metrics.registry.collect()
    found = [s.labels["state"] for m in samples if m.name == "dupguard_state" for s in m.samples if s.value == 1]
    return found[0] if found else None


def counted(d: Running, result: str) -> float:
    return scrape(d).value("dupguard_remediations_total", result=result)


@dataclass
class Case:
    """A daemon taking over a fixture clone: ``before`` scraped while it stood by."""

    url: str
    daemons: list[Running]
    settings: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def standing_by(self) -> Iterator[Running]:
        foreign = ForeignLeader(self.url, LOCK_KEY)
        foreign.take()
        try:
            # The standby sees the foreign leader alive at one check only, its first: at two it would take the
            # runs already there for judged by that leader (detector/sources/database/resume.py), which judges
            # nothing, and the takeover would find no duplicate. Its periodic checks are too far apart to come
            # before ``run`` makes the next check itself: with checks 2 s apart, a busy machine let one in.
            d = daemon(self.url, startup_lookback=LONG_AGO, leader_check_interval=STANDBY_CHECKS, **self.settings)
            self.daemons.append(d)
            wait_for(lambda: state(d) == "standby", what="the daemon standing by")
            yield d
        finally:
            foreign.release()

    def run(self, until: Callable[[Running], bool], what: str) -> tuple[Scrape, Scrape]:
        with self.standing_by() as d:
            before = scrape(d)
        d.daemon.check_leader()  # the takeover, as the next periodic check would make it
        wait_for(d.is_leader, what="the takeover")
        wait_for(lambda: until(d), timeout=60, what=what)
        polled(d)
        return before, scrape(d)


@pytest.fixture
def case(pg_templates: Templates, daemons: list[Running]) -> Callable[..., Case]:
    def make(scenario: str, **settings: Any) -> Case:
        return Case(pg_templates.clone("3.1.2", scenario), daemons, settings)

    return make


def test_detected_in_dry_run(case: Callable[..., Case], tmp_path: Path) -> None:
    """Three Airflow-made duplicate groups, dry-run: DupguardDuplicatesDetected, and DupguardDuplicateNotStopped
    (nothing stops them: they run), nothing else."""
    c = case("race_asset_fanout")
    before, after = c.run(lambda d: counted(d, "dry_run") == 3, "three dry-run outcomes")
    not_stopped = {"mode": "dry-run", "backend": "none", "result": "dry_run", **TARGET}
    expected = {"DupguardDuplicatesDetected": [DETECTED], "DupguardDuplicateNotStopped": [not_stopped]}
    assert_rules(tmp_path, input_series(before, after), expected, grew={"dry_run": 3})


def test_done(case: Callable[..., Case], tmp_path: Path) -> None:
    """Three duplicates stopped before any task started (``done``): detected, no remediation alert."""
    c = case("race_asset_fanout", remediation="fail", remediation_backend="db")
    before, after = c.run(lambda d: counted(d, "done") == 3, "three stops")
    assert_rules(tmp_path, input_series(before, after), {"DupguardDuplicatesDetected": [DETECTED]}, grew={"done": 3})


def test_too_late(case: Callable[..., Case], tmp_path: Path) -> None:
    """The fixture's duplicate whose task ran: planned ``too_late``, it pages (both runs executed)."""
    c = case("race_asset", remediation="fail", remediation_backend="db")
    before, after = c.run(lambda d: len(d.alerter.outcomes()) == 1, "the outcome alert")
    assert_rules(
        tmp_path,
        input_series(before, after),
        {"DupguardDuplicatesDetected": [DETECTED], "DupguardDuplicateCaughtAfterStart": [remediated("too_late")]},
        grew={"too_late": 1},
    )


def test_caught_after_start(case: Callable[..., Case], tmp_path: Path) -> None:
    """A duplicate's first task starts after planning, right before the remediation's re-read, and
    DUPGUARD_REMEDIATE_STARTED is on: stopped mid-run (``caught_after_start``) pages; the other two
    duplicates are ``done``."""
    duplicate = ground_truth("3.1.2", "race_asset_fanout")["expected_groups"][0]["run_ids"][1]
    c = case("race_asset_fanout", remediation="fail", remediation_backend="db", remediate_started=True)
    c.settings["wrap_remediator"] = lambda inner: _TaskStartsFirst(inner, c.url, duplicate)
    before, after = c.run(lambda d: counted(d, "done") == 2 and counted(d, "caught_after_start") == 1, "the stops")
    assert_rules(
        tmp_path,
        input_series(before, after),
        {
            "DupguardDuplicatesDetected": [DETECTED],
            "DupguardDuplicateCaughtAfterStart": [remediated("caught_after_start")],
        },
        grew={"caught_after_start": 1, "done": 2},
    )


def test_prevented(case: Callable[..., Case], tmp_path: Path) -> None:
    """The fixture's duplicate as the in-scheduler guard creates it (every task skipped, the guard's
    note naming the kept run): counted ``already`` (nothing to stop), detected, no remediation alert."""
    c = case("race_asset", remediation="fail", remediation_backend="db")
    (group,) = ground_truth("3.1.2", "race_asset")["expected_groups"]
    kept, duplicate = group["first_run_id"], group["run_ids"][1]
    sql(c.url, "UPDATE task_instance SET state = 'skipped' WHERE run_id = :r", r=duplicate)
    sql(
        c.url,
        "INSERT INTO dag_run_note (dag_run_id, content, created_at, updated_at) "
        "SELECT id, :note, now(), now() FROM dag_run WHERE run_id = :r",
        note=f"{GUARD_NOTE_PREFIX}{kept} (HA scheduler race, apache/airflow#54491)",
        r=duplicate,
    )
    before, after = c.run(lambda d: len(d.alerter.outcomes()) == 1, "the outcome alert")
    assert_rules(tmp_path, input_series(before, after), {"DupguardDuplicatesDetected": [DETECTED]}, grew={"already": 1})


def test_failed(case: Callable[..., Case], tmp_path: Path) -> None:
    """The api backend with an Airflow API that refuses connections: ``failed`` pages."""
    c = case(
        "race_asset_fanout",
        remediation="fail",
        remediation_backend="api",  # the refusing API is the subject (auto would write to the database)
        airflow_api_url="http://127.0.0.1:9",
        airflow_username="admin",
        airflow_password="admin",
        backend_options={"attempts": 1},
        dispatch_options={"retry_backoff": 0.2, "max_retry_backoff": 1.0},
    )
    before, after = c.run(lambda d: counted(d, "failed") >= 3, "three failures")
    assert_rules(
        tmp_path,
        input_series(before, after),
        {
            "DupguardDuplicatesDetected": [DETECTED],
            "DupguardRemediationFailing": [remediated("failed", backend="api")],
        },
        grew={"failed": after.value("dupguard_remediations_total", result="failed")},
    )


def test_leader_lost(tmp_path: Path, pg_templates: Templates) -> None:
    """The leader's lock connection goes (a network cut to the lock database): it reports
    ``lock_unavailable``; no leader in the namespace and the replica down both page."""
    url = pg_templates.clone("3.1.2")
    host = make_url(url)
    with TcpProxy(str(host.host), int(host.port or 5432)) as proxy:
        through = host.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        d = daemon(url, lock_database_url=through)
        try:
            wait_for(d.is_leader, what="leadership")
            polled(d)
            before = scrape(d)
            proxy.close()
            wait_for(lambda: state(d) == "lock_unavailable", what="the lost lock reported")
            after = scrape(d)
        finally:
            d.stop()
    assert_rules(
        tmp_path,
        input_series(before, after),
        {
            "DupguardLeaderCount": [LEADERS],
            "DupguardDown": [{"state": "lock_unavailable", **TARGET}],
        },
    )


def test_gone(tmp_path: Path, pg_templates: Templates) -> None:
    """The daemon stops and its target disappears (series stale): DupguardAbsent, per namespace."""
    d = daemon(pg_templates.clone("3.1.2"))
    try:
        wait_for(d.is_leader, what="leadership")
        polled(d)
        before = scrape(d)
    finally:
        d.stop()
    assert_rules(tmp_path, input_series(before, None), {"DupguardAbsent": [LEADERS]})


def test_leader_and_standby_are_quiet(tmp_path: Path, pg_templates: Templates, daemons: list[Running]) -> None:
    """Two replicas on one database, nothing to report: no alert fires for either. A standby never
    polls (its last-poll timestamp stays 0): DupguardPollStale must not page for it."""
    url = pg_templates.clone("3.1.2")
    leader = daemon(url)
    daemons.append(leader)
    wait_for(leader.is_leader, what="leadership")
    polled(leader)
    standby = daemon(url)
    daemons.append(standby)
    wait_for(lambda: state(standby) == "standby", what="the second replica standing by")
    first = {"a": scrape(leader), "b": scrape(standby)}
    series = input_series(first["a"], scrape(leader), pod="a") + input_series(first["b"], scrape(standby), pod="b")
    assert_rules(tmp_path, series, {})
