"""The Alertmanager sink's pure parts (severity, finality, what each push says) and its settings.

What Alertmanager does with the pushes is tested on a real one (tests/integration/test_alertmanager.py).
"""

from __future__ import annotations

import tomllib
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from detector.actions.alerts.channels.alertmanager import (
    AlertmanagerChannel,
    Tracker,
    auth_headers,
    channel_names,
    group_alert,
    is_final,
    severity_of,
    split_alert,
)
from detector.actions.alerts.channels.webhook import severity as webhook_severity
from detector.actions.alerts.slack_messages import detected_message
from detector.checks.split_partition.alert import split_notice
from detector.checks.split_partition.rule import SplitPartition, SplitRow
from detector.config import Config, load
from detector.core.model import Confidence
from detector.core.plan import Outcome
from detector.core.ports import AlertEvent, Result
from detector.errors import AlertDeliveryError, ConfigError
from tests.factories import T0
from tests.integration.test_alerts import detected, outcome

MINUTE = timedelta(minutes=1)


def _left_alone(event: AlertEvent, why: Outcome) -> AlertEvent:
    """Skipped as the planner skips: with the outcome that says why (off, not confirmed, kept before)."""
    done = outcome(event, Result.SKIPPED)
    return replace(done, results=tuple(replace(r, action=replace(r.action, outcome=why)) for r in done.results))


def _suspected(event: AlertEvent) -> AlertEvent:
    return replace(event, finding=replace(event.finding, confidence=Confidence.SUSPECTED))


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (None, "warning"),
        (Result.TOO_LATE, "critical"),
        (Result.CAUGHT_AFTER_START, "critical"),
        (Result.FAILED, "critical"),
        (Result.DRY_RUN, "critical"),
        (Result.UNKNOWN, "critical"),
        (Result.DONE, "info"),
        (Result.ALREADY, "info"),
    ],
)
def test_severity_of_a_confirmed_group(result: Result | None, expected: str) -> None:
    """Critical when a duplicate will run (a stop failed or not confirmed, dry-run) or ran, info when it
    was stopped in time, warning while it is being stopped."""
    event = detected("g1") if result is None else outcome(detected("g1"), result)
    assert severity_of(event) == expected


def test_a_suspected_group_is_a_warning_whatever_its_outcome() -> None:
    """A suspected group is never remediated: someone must look (not info, though nothing was stopped)."""
    assert severity_of(_suspected(detected("g1"))) == "warning"
    assert severity_of(_suspected(_left_alone(detected("g1"), Outcome.NOT_CONFIRMED))) == "warning"


@pytest.mark.parametrize("why", [Outcome.DISABLED, Outcome.KEPT_BEFORE])
def test_a_confirmed_duplicate_left_alone_pages(why: Outcome) -> None:
    """Remediation off, or a run an earlier judgement kept: the duplicate runs unless someone stops it."""
    assert severity_of(_left_alone(detected("g1"), why)) == "critical"


@pytest.mark.parametrize("mode", ["dry-run", "off"])
def test_a_duplicate_detected_in_a_mode_that_never_stops_it_pages(mode: str) -> None:
    """The incident dupguard is for: in dry-run (the default) a duplicate nobody stops runs and loads
    twice; its very first alert reaches the critical route, not only its outcome."""
    assert severity_of(replace(detected("g1"), mode=mode)) == "critical"


@pytest.mark.parametrize(
    "event",
    [
        replace(detected("g1"), mode="dry-run"),
        outcome(detected("g1"), Result.DRY_RUN),
        outcome(detected("g1"), Result.TOO_LATE),
        outcome(detected("g1"), Result.FAILED),
        outcome(detected("g1"), Result.UNKNOWN),
        _left_alone(detected("g1"), Outcome.DISABLED),
    ],
)
def test_the_operator_lowers_an_unstopped_duplicate_to_a_warning_on_every_channel(event: AlertEvent) -> None:
    """DUPGUARD_UNSTOPPED_SEVERITY=warning: the Alertmanager label, the webhook's severity and Slack's
    level all say warning, never critical; the default says critical on all three."""
    lowered = replace(event, unstopped_severity="warning")
    assert (severity_of(event), webhook_severity(event), _level(event)) == ("critical", "error", "CRITICAL")
    assert (severity_of(lowered), webhook_severity(lowered), _level(lowered)) == ("warning", "warning", "WARNING")


def test_a_duplicate_stopped_in_time_is_info_on_every_channel() -> None:
    event = outcome(detected("g1"), Result.DONE)
    assert (severity_of(event), webhook_severity(event), _level(event)) == ("info", "info", "INFO")


def test_the_setting_reads_critical_or_warning_only() -> None:
    assert load(env=BASE).unstopped_severity == "critical"
    assert load(env=BASE | {"DUPGUARD_UNSTOPPED_SEVERITY": "Warning"}).unstopped_severity == "warning"
    with pytest.raises(ConfigError, match="DUPGUARD_UNSTOPPED_SEVERITY"):
        load(env=BASE | {"DUPGUARD_UNSTOPPED_SEVERITY": "page"})


def _level(event: AlertEvent) -> str:
    """Slack's level word, as its header shows it."""
    header = detected_message(event, results=event.results).blocks[0]["text"]["text"]
    return str(header.split()[1].rstrip(":"))  # ":rotating_light: CRITICAL: Duplicate run of …"


def test_every_split_partition_is_a_warning() -> None:
    """Waiting for ever or maybe running twice: someone must check either way (Slack: HIGH, WARNING)."""
    now = T0
    for made in (None, 42):
        rows = (SplitRow(7, now, None, (1,), 90.0), SplitRow(8, now, made, (2,), 30.0))
        split = SplitPartition(key="split:7", dag_id="d", partition_key="k", rows=rows, split_at=now)
        alert = split_alert(split_notice(split, "prod", now))
        assert alert.labels["severity"] == "warning" and alert.final
        assert alert.annotations["outcome"] == ("waiting" if made is None else "orphaned_row")


def test_the_runbook_link_names_the_alert_whatever_the_setting_ends_with() -> None:
    event = detected("g1")
    released = f"https://github.com/airflow-dupguard/airflow-dupguard/blob/v{_project_version()}/docs/runbooks.md"
    assert group_alert(event).annotations["runbook_url"] == f"{released}#DupguardDuplicateRun"
    assert load(env=BASE).runbook_url == released  # the default on-call can click: the released page
    linked = group_alert(event, runbook="https://x.example/runbooks.md#top").annotations["runbook_url"]
    assert linked == "https://x.example/runbooks.md#DupguardDuplicateRun"


def test_only_an_outcome_without_retries_left_is_final() -> None:
    done = outcome(detected("g1"), Result.DONE)
    retrying = replace(done, results=tuple(replace(r, retryable=True) for r in done.results))
    assert is_final(done) and not is_final(retrying) and not is_final(detected("g1"))


def _ends(body: list[dict[str, Any]]) -> list[str]:
    return [b["endsAt"] for b in body]


def test_an_open_alert_ends_four_intervals_ahead_and_each_resend_moves_it() -> None:
    tracker = Tracker(MINUTE, 5 * MINUTE)
    [first] = tracker.track(group_alert(detected("g1")), T0)
    assert (first["startsAt"], first["endsAt"]) == (T0.isoformat(), (T0 + 4 * MINUTE).isoformat())
    [again] = tracker.due(T0 + MINUTE)
    assert again["startsAt"] == T0.isoformat() and again["endsAt"] == (T0 + 5 * MINUTE).isoformat()


def test_a_final_outcome_ends_resolve_after_the_first_push_or_now() -> None:
    """Fixed at ``first push + resolve_after`` (so group_wait sees it firing); later than that: now."""
    tracker = Tracker(MINUTE, 5 * MINUTE)
    dry = replace(detected("g1"), mode="dry-run")  # critical from detection to outcome: one label set
    tracker.track(group_alert(dry), T0)
    [final] = tracker.track(group_alert(outcome(dry, Result.DRY_RUN)), T0 + 2 * MINUTE)
    assert final["endsAt"] == (T0 + 5 * MINUTE).isoformat()
    assert _ends(tracker.due(T0 + 3 * MINUTE)) == [(T0 + 5 * MINUTE).isoformat()]  # not moved on
    assert _ends(tracker.due(T0 + 6 * MINUTE)) == [(T0 + 5 * MINUTE).isoformat()]  # once more, resolved
    assert tracker.due(T0 + 7 * MINUTE) == [] and len(tracker) == 0
    late = Tracker(MINUTE, 5 * MINUTE)
    late_dry = replace(detected("g2"), mode="dry-run")
    late.track(group_alert(late_dry), T0)
    [final] = late.track(group_alert(outcome(late_dry, Result.DRY_RUN)), T0 + 9 * MINUTE)
    assert final["endsAt"] == (T0 + 9 * MINUTE).isoformat() and len(late) == 0


def test_a_new_severity_resolves_the_old_label_set_in_the_same_push() -> None:
    tracker = Tracker(MINUTE, 5 * MINUTE)
    tracker.track(group_alert(detected("g1")), T0)
    old, new = tracker.track(group_alert(outcome(detected("g1"), Result.TOO_LATE)), T0 + MINUTE)
    assert old["labels"]["severity"] == "warning" and old["endsAt"] == (T0 + MINUTE).isoformat()
    assert new["labels"]["severity"] == "critical" and new["startsAt"] == (T0 + MINUTE).isoformat()
    assert new["endsAt"] == (T0 + 5 * MINUTE).isoformat()  # counted from the group's first push
    assert [b["labels"]["severity"] for b in tracker.due(T0 + 2 * MINUTE)] == ["critical"]


class _Failing:
    def send(self, payload: Any) -> None:
        raise AlertDeliveryError("alertmanager: cannot connect (ConnectionRefusedError) after 3 attempts")


def test_a_failed_resend_is_counted_and_logged_and_the_alert_kept() -> None:
    failures: list[str] = []
    channel = AlertmanagerChannel(
        "alertmanager", _Failing(), resend_interval=MINUTE, resolve_after=MINUTE, on_failure=failures.append
    )
    with pytest.raises(AlertDeliveryError):
        channel.detected(detected("g1"))
    with capture_logs() as logs:
        channel.resend()
    channel.close()
    assert failures == ["alertmanager: cannot connect (ConnectionRefusedError) after 3 attempts"]
    assert len(channel.tracker) == 1
    [line] = [e for e in logs if e["event"] == "alert_resend_failed"]
    assert line["channel"] == "alertmanager" and line["alerts"] == 1


def test_channel_names_number_an_ha_set() -> None:
    assert channel_names(["http://a"]) == ["alertmanager"]
    assert channel_names(["http://a", "http://b"]) == ["alertmanager-1", "alertmanager-2"]


def test_auth_headers_basic_or_bearer() -> None:
    basic = Config.of(alertmanager_username="u", alertmanager_password="p")
    assert auth_headers(basic) == {"Authorization": "Basic dTpw"}
    assert auth_headers(Config.of(alertmanager_bearer_token="t")) == {"Authorization": "Bearer t"}
    assert auth_headers(Config.of()) == {}


BASE = {"DUPGUARD_DATABASE_URL": "sqlite:///x.db"}


def _problems(**env: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(env=BASE | env)
    return str(info.value)


def test_alertmanager_settings_are_checked_without_showing_secrets() -> None:
    config = load(env=BASE | {"DUPGUARD_ALERTMANAGER_URLS": "http://am-0:9093/, https://am-1:9093"})
    assert config.alertmanager_urls == ("http://am-0:9093", "https://am-1:9093")
    assert "s3cret" not in _problems(DUPGUARD_ALERTMANAGER_URLS="http://u:s3cret@am:9093")
    assert "listed twice" in _problems(DUPGUARD_ALERTMANAGER_URLS="http://am:9093,http://am:9093/")
    both = _problems(DUPGUARD_ALERTMANAGER_BEARER_TOKEN="t", DUPGUARD_ALERTMANAGER_USERNAME="u")
    assert "not both" in both
    assert "go together" in _problems(DUPGUARD_ALERTMANAGER_USERNAME="u")
    secret = load(env=BASE | {"DUPGUARD_ALERTMANAGER_USERNAME": "u", "DUPGUARD_ALERTMANAGER_PASSWORD": "pw-123456"})
    assert "pw-123456" not in str(secret.redacted()) and "pw-123456" not in repr(secret)


def _project_version() -> str:
    return str(tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["version"])
