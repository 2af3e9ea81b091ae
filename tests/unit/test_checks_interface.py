"""The periodic-check interface: one runner for every kind, the daemon unaware of
which exist; claims, alerts, metrics and failures handled the same way for each. A check here is a test
class behind the real interface, run on the demo's SQLite database (the runner's own connection and the
database clock), with the real alert dispatcher, ledger and metrics."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from sqlalchemy.engine import Connection
from structlog.testing import capture_logs

from detector.actions.alerts.channels.alertmanager import notice_alert
from detector.actions.alerts.notice import Notice, alertname_of, observation_notice
from detector.app import demo
from detector.app.ledger import MemoryLedger
from detector.checks import enabled as checks
from detector.checks.base import CheckBase
from detector.checks.runner import CheckRunner
from detector.config import Config, load
from detector.core.checks import CheckContext, Observation
from detector.errors import ConfigError
from detector.metadb.engine import AirflowDb, make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2] / "detector"
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _obs(key: str, **over: Any) -> Observation:
    fields: dict[str, Any] = {
        "kind": "test_kind",
        "key": f"test_kind|{key}",
        "confidence": "confirmed",
        "severity": "warning",
        "dag_ids": ("orders_consumer",),
        "title": f"thing {key} seen",
        "lines": (f"evidence of {key}",),
        "advice": "look at it",
        "facts": {"thing": key},
        "seen_at": NOW,
    }
    return Observation(**(fields | over))


class FakeCheck(CheckBase):
    """Finds what ``found`` holds; records the contexts it was run with; raises ``error`` if set."""

    kind: ClassVar[str] = "test_kind"

    def __init__(self, config: Config, metrics: Metrics) -> None:
        super().__init__(config, metrics)
        self.found: list[Observation] = []
        self.contexts: list[CheckContext] = []
        self.error: Exception | None = None
        self.seen: list[tuple[int, int]] = []

    def interval(self) -> timedelta:
        return timedelta(seconds=7)

    def collect(self, conn: Connection, db: AirflowDb, ctx: CheckContext) -> list[Observation]:
        self.contexts.append(ctx)
        if self.error is not None:
            raise self.error
        return list(self.found)

    def observed(self, found: list[Observation], new: list[Observation]) -> None:
        self.seen.append((len(found), len(new)))


class Recorder:
    def __init__(self) -> None:
        self.notices: list[Notice] = []

    def notify_notice(self, notice: Notice) -> None:
        self.notices.append(notice)


@pytest.fixture
def db(tmp_path: Path) -> AirflowDb:
    path = tmp_path / "airflow.db"
    demo.build(path)
    return open_airflow_db(make_engine(parse_url(f"sqlite:///{path}"), read_only=True))


def _runner(db: AirflowDb, check: FakeCheck, metrics: Metrics, alerter: Recorder | None = None) -> CheckRunner:
    return CheckRunner(db, [check], MemoryLedger(), alerter or Recorder(), metrics, cluster="prod-eu")


def test_each_observation_is_alerted_once_across_runs(db: AirflowDb) -> None:
    """Two runs seeing the same thing and one new: three notices in all, one per key, counted by kind."""
    metrics, alerter = Metrics(), Recorder()
    check = FakeCheck(Config.of(database_url="sqlite://"), metrics)
    runner = _runner(db, check, metrics, alerter)
    check.found = [_obs("a"), _obs("b")]
    assert [o.key for o in runner.run("test_kind", NOW)] == ["test_kind|a", "test_kind|b"]
    check.found = [_obs("b"), _obs("c")]
    runner.run("test_kind", NOW + timedelta(seconds=7))
    assert [n.key for n in alerter.notices] == ["test_kind|a", "test_kind|b", "test_kind|c"]
    assert {n.cluster for n in alerter.notices} == {"prod-eu"}
    assert check.seen == [(2, 2), (2, 1)]
    sample = metrics.registry.get_sample_value
    assert sample("dupguard_check_detected_total", {"kind": "test_kind"}) == 3
    assert sample("dupguard_check_observations", {"kind": "test_kind"}) == 2
    assert sample("dupguard_check_duration_seconds_count", {"kind": "test_kind"}) == 2


def test_the_check_judges_on_the_database_clock_live(db: AirflowDb) -> None:
    """``db_now`` comes from the database (not the host clock passed as ``now``), ``live`` in `run`."""
    metrics = Metrics()
    check = FakeCheck(Config.of(database_url="sqlite://"), metrics)
    _runner(db, check, metrics).run("test_kind", datetime(2001, 1, 1, tzinfo=UTC))
    [ctx] = check.contexts
    assert ctx.live and ctx.since is None and ctx.now.year == 2001
    assert abs((ctx.db_now - datetime.now(UTC)).total_seconds()) < 3600  # SQLite's CURRENT_TIMESTAMP, not 2001


@pytest.mark.parametrize(
    ("error", "event"),
    [(ConfigError(["bad"]), "check_failed"), (ZeroDivisionError("bug"), "check_crashed")],
    ids=["expected", "bug"],
)
def test_a_failing_check_is_logged_counted_and_never_raises(db: AirflowDb, error: Exception, event: str) -> None:
    metrics, alerter = Metrics(), Recorder()
    check = FakeCheck(Config.of(database_url="sqlite://"), metrics)
    check.error = error
    with capture_logs() as logged:
        assert _runner(db, check, metrics, alerter).run_reported("test_kind", NOW) is False
    assert next(e for e in logged if e["event"] == event)["kind"] == "test_kind"
    assert metrics.registry.get_sample_value("dupguard_check_failures_total", {"kind": "test_kind"}) == 1
    assert alerter.notices == [] and check.seen == []


def test_the_generic_notice_on_every_channel() -> None:
    """Webhook payload, log fields and Alertmanager alert, from the observation's fields alone."""
    obs = _obs("a", severity="error", facts={"thing": "a", "key": "not this one", "event": 7, "level": "x"})
    notice = observation_notice(obs, "prod-eu", NOW + timedelta(seconds=2))
    assert notice.payload == {
        "schema": "dupguard.alert/v1",
        "type": "test_kind",
        "severity": "error",
        "summary": "thing a seen on prod-eu",
        "dedup_key": "test_kind|a",
        "cluster": "prod-eu",
        "observation": obs.as_dict(),
        "text": notice.text,
    }
    assert obs.as_dict()["key"] == "test_kind|a"  # the common fields win over a kind's own
    assert notice.text.splitlines() == [
        "thing a seen on prod-eu",
        f"test_kind|a: confirmed, seen {NOW.isoformat()}, detected {(NOW + timedelta(seconds=2)).isoformat()}",
        "evidence of a",
        "look at it",
    ]
    assert notice.log_fields["group_key"] == "test_kind|a" and notice.log_fields["thing"] == "a"
    assert not {"event", "level"} & set(notice.log_fields)  # structlog's keys: the log call must not break
    alerter = _dispatcher()
    with capture_logs() as logged:
        alerter.notify_notice(notice)
    assert [e["event"] for e in logged] == ["test_kind_detected"]
    alert = notice_alert(notice, "docs/runbooks.md")
    assert alert.labels == {
        "alertname": "DupguardTestKind",
        "severity": "critical",
        "cluster": "prod-eu",
        "dag_id": "orders_consumer",
        "kind": "test_kind",
        "group_key": "test_kind|a",
    }
    assert alert.annotations["runbook_url"] == "docs/runbooks.md#DupguardTestKind" and alert.final
    assert alertname_of("stranded_events") == "DupguardStrandedEvents"


def test_unknown_disabled_check_is_a_config_problem_listed_with_the_others() -> None:
    env = {
        "DUPGUARD_DATABASE_URL": "sqlite://",
        "DUPGUARD_DISABLED_CHECKS": "split_partition,nope",
        "DUPGUARD_HTTP_PORT": "x",
    }
    with pytest.raises(ConfigError) as caught:
        load({}, env)
    problems = "\n".join(caught.value.problems)
    assert "unknown check nope" in problems and "split_partition" in problems.split("known:")[1]
    assert "DUPGUARD_HTTP_PORT" in problems  # every problem at once


def test_a_disabled_check_is_not_built(db: AirflowDb, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only a check that does not apply to the demo's 3.1 schema beside the fake (others do apply to 3.1).
    split = next(c for c in checks.CHECKS if c.kind == "split_partition")
    monkeypatch.setattr(checks, "CHECKS", (FakeCheck, split))
    monkeypatch.setattr(checks, "KINDS", ("test_kind", split.kind))
    built = checks.build(Config.of(database_url="sqlite://"), db, Metrics())
    assert [c.kind for c in built] == ["test_kind"]  # split_partition needs 3.2's tables; the demo has 3.1's
    assert checks.build(Config.of(database_url="sqlite://", disabled_checks=("test_kind",)), db, Metrics()) == []
    with pytest.raises(ConfigError, match="unknown check nope"):
        checks.build(Config.of(database_url="sqlite://", disabled_checks=("nope",)), db, Metrics())


def _dispatcher() -> Any:
    from detector.app.wiring import build_alerter

    return build_alerter(Config.of(database_url="sqlite://"), MemoryLedger(), Metrics())


def _names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return found | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


@pytest.mark.parametrize("module", ["app/daemon.py", "app/scan.py", "app/wiring.py", "checks/runner.py"])
def test_the_loop_and_scan_name_no_kind(module: str) -> None:
    """node_exporter's rule: the loop, the scan and the wiring import no kind's package, only the machinery."""
    packages = [p.parent for p in (ROOT / "checks").glob("*/__init__.py")]
    kinds = {f"detector.checks.{p.name}" for p in packages} | {  # its pure rule aside (scan reads the split's)
        f"detector.checks.{p.parent.name}.{p.stem}" for d in packages for p in d.glob("*.py") if p.stem != "rule"
    }
    assert kinds and not (_names(ROOT / module) & kinds)


@pytest.mark.parametrize("kind", checks.KINDS)
def test_every_check_has_its_runbook_section_and_a_row_in_the_docs(kind: str) -> None:
    """Its alerts link `docs/runbooks.md#Dupguard<Kind>` (Slack, Alertmanager's runbook_url): the anchor must exist;
    docs/explanation/checks.md lists it."""
    runbooks = (ROOT.parent / "docs" / "runbooks.md").read_text()
    assert f'<a id="{alertname_of(kind)}"></a>' in runbooks
    assert f"| `{kind}` |" in (ROOT.parent / "docs" / "explanation" / "checks.md").read_text()


def test_a_notice_after_the_alerter_closed_is_logged_undelivered_per_channel() -> None:
    """As a group's alert: never dropped silently (it was: nothing logged but the detected line)."""
    from detector.app.wiring import build_alerter

    config = Config.of(database_url="sqlite://", webhook_url="http://127.0.0.1:9/hook")
    alerter = build_alerter(config, MemoryLedger(), Metrics())
    alerter.close(1.0)
    with capture_logs() as logged:
        alerter.notify_notice(observation_notice(_obs("late"), "prod-eu", NOW))
    undelivered = [e for e in logged if e["event"] == "alert_undelivered"]
    assert [(e["channel"], e["group_keys"], e["error"]) for e in undelivered] == [
        ("webhook", ["test_kind|late"], "the alerter is closed")
    ]
