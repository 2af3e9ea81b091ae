"""The Alertmanager sink against a real Alertmanager (Debian's ``prometheus-alertmanager``, tests/alertmanager.py).

Alerts go in through the daemon's own ``Alerter`` (``build_alerter``: claims, workers, retries,
counters) and come out of Alertmanager's route into a local webhook receiver: what on-call's
receivers would get. The route groups by ``alertname, cluster, dag_id``, sends ``severity=critical``
to ``/pager`` and the rest to ``/chat``. No test waits a fixed time: each waits for what
Alertmanager does, and ordering comes from silences, not from timers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from detector.actions.alerts.dispatch import Dispatcher
from detector.actions.alerts.oncall import DUPLICATE_ALERT
from detector.actions.alerts.text import run_url
from detector.app.scan import scan
from detector.app.wiring import build_alerter
from detector.checks.split_partition.alert import SPLIT_ALERT, split_notice
from detector.checks.split_partition.rule import SplitPartition, SplitRow
from detector.config import RUNBOOK_URL, Config
from detector.core.ports import AlertEvent, Result
from detector.metrics import Metrics
from tests.airflow_server import CountingProxy, make_test_ca
from tests.alertmanager import Alertmanager, Receiver, alertmanager, free_port, route_config, wait_for
from tests.integration.test_alerts import SharedLedger, detected, outcome
from tests.integration.test_remediation_db import Db

pytestmark = pytest.mark.integration

UI = "http://airflow.local:8080"
DUPGUARD = str(Path(sys.executable).parent / "dupguard")
SECOND = timedelta(seconds=1)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture
def am(receiver: Receiver) -> Iterator[Alertmanager]:
    with alertmanager(route_config(receiver.url)) as instance:
        yield instance


def _alerter(urls: tuple[str, ...], metrics: Metrics | None = None, **overrides: Any) -> Dispatcher:
    config = Config.of(
        alertmanager_urls=urls,
        airflow_ui_url=UI,
        cluster_name="prod-eu",
        alert_timeout=SECOND,
        **overrides,
    )
    return build_alerter(config, SharedLedger(), metrics or Metrics(), retries=2, digest_delay=0.3)


def _of(dag_id: str, key: str, base: int) -> AlertEvent:
    event = detected(key, base)
    return replace(event, finding=replace(event.finding, dag_id=dag_id))


def _count(metrics: Metrics, channel: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value("dupguard_alerts_total", {"channel": channel, "outcome": outcome})
    return value or 0.0


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_group_reaches_the_receiver_through_the_route_and_its_severity_routes_it(
    am: Alertmanager, receiver: Receiver
) -> None:
    """A confirmed group is a ``warning`` on ``/chat`` with the documented labels, run links and runbook;
    its outcome ``too_late`` (both runs executed) is a ``critical`` alert on ``/pager``, and the
    warning is resolved."""
    event = detected("g1")
    alerter = _alerter((am.url,))
    alerter.notify(event)
    [alert] = wait_for(lambda: receiver.alerts("/chat"), what="the group on /chat")
    assert alert["status"] == "firing"
    assert alert["labels"] == {
        "alertname": DUPLICATE_ALERT,
        "severity": "warning",
        "cluster": "prod-eu",
        "dag_id": "orders_consumer",
        "kind": "asset",
        "group_key": "g1",
    }
    notes = alert["annotations"]
    f = event.finding
    assert notes["summary"] == "Duplicate run of DAG orders_consumer on prod-eu"
    assert notes["outcome"] == "pending" and notes["confidence"] == "confirmed"
    assert notes["kept_run"] == f.kept.run_id and notes["duplicate_runs"] == f.duplicates[0].run_id
    assert notes["kept_run_url"] == run_url(UI, f.dag_id, f.kept.run_id)
    assert notes["duplicate_run_urls"] == run_url(UI, f.dag_id, f.duplicates[0].run_id)
    assert notes["runbook_url"] == f"{RUNBOOK_URL}#DupguardDuplicateRun" and RUNBOOK_URL.startswith("https://")
    assert f.duplicates[0].run_id in notes["description"] and "s3://lake/orders" in notes["description"]
    assert alert["generatorURL"] == notes["kept_run_url"]

    alerter.notify(outcome(event, Result.TOO_LATE))
    [page] = wait_for(lambda: receiver.alerts("/pager"), what="the page")
    assert page["labels"] | {"severity": "warning"} == alert["labels"]
    assert page["labels"]["severity"] == "critical" and page["annotations"]["outcome"] == "too_late"
    wait_for(lambda: [a for a in receiver.alerts("/chat") if a["status"] == "resolved"], what="the warning resolved")
    alerter.close(10)


def test_a_silence_made_with_amtool_suppresses_the_alert(am: Alertmanager, receiver: Receiver) -> None:
    """``amtool silence add dag_id=…`` keeps that DAG's group from on-call; another DAG's still arrives."""
    silence = am.amtool("silence", "add", "dag_id=noisy_dag", "--comment=known", "--author=test", "--duration=1h")
    alerter = _alerter((am.url,))
    alerter.notify(_of("noisy_dag", "g-noisy", 1))
    alerter.notify(_of("orders_consumer", "g-orders", 10))
    wait_for(lambda: receiver.alerts("/chat"), what="the other DAG's alert")
    [silenced] = am.alerts(dag_id="noisy_dag")
    assert silenced["status"]["state"] == "suppressed" and silenced["status"]["silencedBy"] == [silence]
    assert {a["labels"]["dag_id"] for a in receiver.alerts("/chat")} == {"orders_consumer"}
    alerter.close(10)


def test_two_groups_of_one_dag_arrive_grouped_in_one_notification(am: Alertmanager, receiver: Receiver) -> None:
    """Two groups of one DAG are two alerts (``group_key``) in one notification, grouped as the route
    says. A silence holds both back until both are in Alertmanager, so the test does not rest on two
    pushes landing within ``group_wait``; once it expires, the next flush carries both."""
    silence = am.amtool("silence", "add", "dag_id=orders_consumer", "--comment=hold", "--author=test")
    alerter = _alerter((am.url,))
    alerter.notify(_of("orders_consumer", "g-a", 1))
    alerter.notify(_of("orders_consumer", "g-b", 10))
    wait_for(lambda: len(am.alerts(dag_id="orders_consumer")) == 2, what="both alerts in Alertmanager")
    am.amtool("silence", "expire", silence)
    [body] = wait_for(lambda: receiver.at("/chat"), what="the notification")
    assert body["groupLabels"] == {"alertname": DUPLICATE_ALERT, "cluster": "prod-eu", "dag_id": "orders_consumer"}
    assert sorted(a["labels"]["group_key"] for a in body["alerts"]) == ["g-a", "g-b"]
    alerter.close(10)


def test_an_open_alert_is_resent_and_a_final_outcome_ends_it(am: Alertmanager, receiver: Receiver) -> None:
    """While open, every re-send moves ``endsAt`` on (four intervals ahead); a final outcome fixes it at
    ``resolve_after`` after the first push, and Alertmanager sends the resolved notification."""
    event = replace(detected("g1"), mode="dry-run")  # critical from detection to outcome: one label set
    alerter = _alerter((am.url,), alertmanager_resend_interval=SECOND, alertmanager_resolve_after=3 * SECOND)
    alerter.notify(event)
    [first] = wait_for(lambda: am.alerts(group_key="g1"), what="the alert")
    assert _time(first["endsAt"]) - _time(first["startsAt"]) >= 4 * SECOND - timedelta(milliseconds=50)
    wait_for(lambda: _time(am.alerts(group_key="g1")[0]["endsAt"]) > _time(first["endsAt"]), what="a re-send's endsAt")
    alerter.notify(outcome(event, Result.DRY_RUN))
    resolved = wait_for(
        lambda: [a for a in receiver.alerts("/pager") if a["status"] == "resolved"], what="the resolved notification"
    )
    ends, starts = _time(resolved[0]["endsAt"]), _time(resolved[0]["startsAt"])
    assert ends - starts >= 3 * SECOND and resolved[0]["annotations"]["outcome"] == "dry_run"
    assert receiver.alerts("/pager")[0]["status"] == "firing"  # notified before it ended
    alerter.close(10)


def test_a_failing_re_send_is_named_in_the_trouble_readyz_shows(receiver: Receiver) -> None:
    """Alertmanager stops after the first push: the next periodic re-send fails, is counted ``failed``
    and logged, and is named by ``trouble()`` (what ``/readyz`` adds, daemon.py) like any channel's
    undelivered alert (was: only the counter and the log line knew)."""
    metrics = Metrics()
    with capture_logs() as logs:
        with alertmanager(route_config(receiver.url)) as am:
            alerter = _alerter((am.url,), metrics, alertmanager_resend_interval=SECOND)
            alerter.notify(detected("g1"))
            wait_for(lambda: am.alerts(group_key="g1"), what="the alert in Alertmanager")
            assert alerter.trouble() is None
        wait_for(lambda: _count(metrics, "alertmanager", "failed") >= 1, what="a failed re-send")
        trouble = alerter.trouble()
        alerter.close(10)
    [failed, *_] = [e for e in logs if e["event"] == "alert_resend_failed"]  # logged as before
    assert trouble is not None and trouble.startswith("alertmanager: ") and " in the last 15 min (latest: " in trouble
    assert "cannot connect" in trouble and "cannot connect" in failed["error"]


def test_a_stopped_duplicate_becomes_info_and_the_warning_is_resolved(am: Alertmanager, receiver: Receiver) -> None:
    """Stopped before any task ran: nothing to do, so ``info`` (a new label set: the ``warning`` of the
    detection is resolved in the same push, and the ``info`` alert fires until ``resolve_after``)."""
    event = detected("g1")
    alerter = _alerter((am.url,))
    alerter.notify(event)
    wait_for(lambda: am.alerts(group_key="g1", severity="warning"), what="the warning")
    alerter.notify(outcome(event, Result.DONE))
    wait_for(lambda: am.alerts(group_key="g1", severity="info"), what="the info alert")
    # /api/v2/alerts leaves out resolved alerts: the warning is gone, the info alert is the group's one
    assert {a["labels"]["severity"]: a["status"]["state"] for a in am.alerts(group_key="g1")} == {"info": "active"}
    alerter.close(10)


def test_an_ha_pair_gets_every_alert_on_both_members(receiver: Receiver) -> None:
    """Two URLs: each Alertmanager gets the alert (they do not share alerts) and notifies it."""
    metrics = Metrics()
    with alertmanager(route_config(receiver.url)) as one, alertmanager(route_config(receiver.url)) as two:
        alerter = _alerter((one.url, two.url), metrics)
        alerter.notify(detected("g1"))
        wait_for(lambda: len(receiver.at("/chat")) == 2, what="a notification from each")
        assert {b["externalURL"].rsplit(":", 1)[1] for b in receiver.at("/chat")} == {
            one.url.rsplit(":", 1)[1],
            two.url.rsplit(":", 1)[1],
        }
        alerter.close(10)
    assert _count(metrics, "alertmanager-1", "sent") == 1 and _count(metrics, "alertmanager-2", "sent") == 1


def test_a_failing_url_is_retried_and_counted_while_the_other_delivers(am: Alertmanager, receiver: Receiver) -> None:
    """A pair member that refuses connections: its alert is retried twice, then counted ``failed`` and
    logged undelivered (no URL in the error); the member that works delivers."""
    metrics = Metrics()
    with capture_logs() as logs:
        alerter = _alerter((am.url, f"http://127.0.0.1:{free_port()}"), metrics)
        alerter.notify(detected("g1"))
        wait_for(lambda: receiver.alerts("/chat"), what="the alert from the working member")
        alerter.close(10)
    assert _count(metrics, "alertmanager-1", "sent") == 1 and _count(metrics, "alertmanager-1", "failed") == 0
    assert _count(metrics, "alertmanager-2", "retried") == 2 and _count(metrics, "alertmanager-2", "failed") == 1
    [undelivered] = [e for e in logs if e["event"] == "alert_undelivered"]
    assert undelivered["channel"] == "alertmanager-2" and "cannot connect" in undelivered["error"]
    assert "127.0.0.1" not in undelivered["error"]


def test_each_refused_push_of_a_storm_is_counted_and_logged_with_its_own_groups(
    am: Alertmanager, receiver: Receiver
) -> None:
    """2,500 groups in one digest are three pushes of at most 1,000 alerts; a
    proxy has Alertmanager's first answer be HTTP 400. The other two pushes still go out (they were
    left for the next re-send, a minute later), the refused one is one alert_undelivered line naming
    its own 1,000 groups and one ``failed``, and ``sent`` counts the two pushes that arrived."""
    metrics = Metrics()
    with CountingProxy(int(am.url.rsplit(":", 1)[1])) as proxy:
        proxy.inject.append(("/api/v2/alerts", 400, 0.0))
        config = Config.of(
            alertmanager_urls=(proxy.url,),
            alert_timeout=SECOND * 10,
            alert_storm_threshold=0,  # the first group opens the digest
            alertmanager_resend_interval=timedelta(hours=1),  # no re-send within the test
        )
        with capture_logs() as logs:
            alerter = build_alerter(config, SharedLedger(), metrics, digest_delay=60)  # close() sends it
            for i in range(2500):
                alerter.notify(detected(f"p{i:04d}", base=10 * i))
            alerter.close(60)
    assert {a["labels"]["group_key"] for a in am.alerts()} == {f"p{i:04d}" for i in range(1000, 2500)}
    [undelivered] = [e for e in logs if e["event"] == "alert_undelivered"]
    assert undelivered["alert"] == "digest" and "HTTP 400" in undelivered["error"]
    assert undelivered["group_keys"] == [f"p{i:04d}" for i in range(1000)]
    assert _count(metrics, "alertmanager", "sent") == 2 and _count(metrics, "alertmanager", "failed") == 1


def test_a_split_partition_is_its_own_alert(am: Alertmanager, receiver: Receiver) -> None:
    """A split partition key reaches the route as ``DupguardSplitPartition``, ``warning`` while the
    consumer waits."""
    now = datetime.now(UTC)
    rows = tuple(
        SplitRow(id=i, created_at=now, created_dag_run_id=None, event_ids=(i,), age_seconds=90.0) for i in (7, 8)
    )
    split = SplitPartition(key="split:7", dag_id="daily_report", partition_key="2026-03-12", rows=rows, split_at=now)
    alerter = _alerter((am.url,), runbook_url="https://docs.example/runbooks.md")
    alerter.notify_notice(split_notice(split, "prod-eu", now))
    [alert] = wait_for(lambda: receiver.alerts("/chat"), what="the split alert")
    assert alert["labels"] == {
        "alertname": SPLIT_ALERT,
        "severity": "warning",
        "cluster": "prod-eu",
        "dag_id": "daily_report",
        "kind": split.kind,
        "group_key": "split:7",
    }
    assert alert["annotations"]["partition_key"] == "2026-03-12"
    assert alert["annotations"]["runbook_url"] == "https://docs.example/runbooks.md#DupguardSplitPartition"
    alerter.close(10)


# A bcrypt hash of this test password (Alertmanager's --web.config.file takes only hashes).
PASSWORD = "am-test-password"
HASH = "$2b$10$abcdefghijklmnopqrstuuY.im4KZ5A.M3rBZUw8Q4H3D8lMjNGnO"


def test_basic_auth_over_tls_with_a_ca_bundle(receiver: Receiver, tmp_path: Any) -> None:
    """Alertmanager behind TLS (a throw-away CA) and basic auth: delivered with the CA bundle and the
    credentials; without the credentials it is refused (401, not retried) and counted failed."""
    tls = make_test_ca(tmp_path)
    web = (
        f"tls_server_config: {{cert_file: {tls.cert}, key_file: {tls.key}}}\nbasic_auth_users: {{dupguard: '{HASH}'}}\n"
    )
    metrics = Metrics()
    with alertmanager(route_config(receiver.url), web_config=web, scheme="https") as secured:
        tls_settings = {"alertmanager_ca_bundle": str(tls.ca_cert)}
        alerter = _alerter(
            (secured.url,), metrics, alertmanager_username="dupguard", alertmanager_password=PASSWORD, **tls_settings
        )
        alerter.notify(detected("g1"))
        wait_for(lambda: receiver.alerts("/chat"), what="the alert through TLS and basic auth")
        alerter.close(10)
        anonymous = Metrics()
        with capture_logs() as logs:
            alerter = _alerter((secured.url,), anonymous, **tls_settings)
            alerter.notify(detected("g2"))
            alerter.close(10)
    assert _count(metrics, "alertmanager", "sent") == 1
    assert _count(anonymous, "alertmanager", "failed") == 1 and _count(anonymous, "alertmanager", "retried") == 0
    [undelivered] = [e for e in logs if e["event"] == "alert_undelivered"]
    assert undelivered["error"] == "alertmanager rejected the alert: HTTP 401"
    assert PASSWORD not in str(logs)


def test_dupguard_run_pushes_every_group_of_airflow_made_duplicates(
    fanout: Db, am: Alertmanager, receiver: Receiver
) -> None:
    """The real process (``dupguard run --once``, settings from the environment) on the 3.1.2
    ``race_asset_fanout`` fixture: its three groups, one per consumer DAG, reach the route as three
    notifications, in dry-run as ``critical`` pages (nobody stops them: they run twice)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "DUPGUARD_DATABASE_URL": fanout.url,
        "DUPGUARD_ALERTMANAGER_URLS": am.url,
        "DUPGUARD_REMEDIATION": "dry-run",
        "DUPGUARD_CLUSTER_NAME": "prod-eu",
        "DUPGUARD_HTTP_PORT": "0",
        "DUPGUARD_STARTUP_LOOKBACK": f"{10 * 365}d",  # the fixture's runs were made long ago
    }
    done = subprocess.run([DUPGUARD, "run", "--once"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    truth = {f.dag_id for f in scan(fanout.db, now=datetime.now(UTC)).findings}
    assert len(truth) == 3
    wait_for(lambda: len(receiver.at("/pager")) >= 3, what="a page per DAG")
    shown = [(a["labels"], a["annotations"]["outcome"]) for a in receiver.alerts("/pager")]
    assert {body["groupLabels"]["dag_id"] for body in receiver.at("/pager")} == truth, shown
    for labels, result in shown:
        assert labels["severity"] == "critical" and labels["cluster"] == "prod-eu", (shown, done.stderr[-3000:])
        assert result in ("pending", "dry_run"), shown
    assert receiver.at("/chat") == [], receiver.at("/chat")


def _inhibit_rules() -> str:
    """The inhibit rule docs/how-to/alerts.md ships (its ``inhibit_rules`` block, as written there)."""
    text = (Path(__file__).parents[2] / "docs" / "how-to" / "alerts.md").read_text()
    return "inhibit_rules:" + text.split("```yaml\ninhibit_rules:", 1)[1].split("```", 1)[0]


def _rule_alert(am: Alertmanager, alertname: str) -> None:
    """What Prometheus sends when a dupguard rule fires for the same duplicate (cluster from its external labels)."""
    labels = {"alertname": alertname, "severity": "critical", "cluster": "prod-eu", "namespace": "airflow"}
    body = json.dumps([{"labels": labels, "annotations": {"summary": "from the rule"}}]).encode()
    request = urllib.request.Request(f"{am.url}/api/v2/alerts", body, {"Content-Type": "application/json"})  # noqa: S310
    with urllib.request.urlopen(request, timeout=5):  # noqa: S310 - a local test server
        pass


@pytest.mark.parametrize("with_inhibit", [True, False])
def test_one_duplicate_pages_once_with_the_documented_inhibit_rule(receiver: Receiver, with_inhibit: bool) -> None:
    """A duplicate left running in dry-run fires the pushed DupguardDuplicateRun and the rule
    DupguardDuplicateNotStopped: with the documented inhibit rule on-call gets one page (the push,
    which names the runs), without it two."""
    config = route_config(receiver.url) + (_inhibit_rules() if with_inhibit else "")
    with alertmanager(config) as am:
        alerter = _alerter((am.url,))
        alerter.notify(replace(detected("g1"), mode="dry-run"))
        wait_for(lambda: am.alerts(alertname=DUPLICATE_ALERT), what="the pushed alert in Alertmanager")
        _rule_alert(am, "DupguardDuplicateNotStopped")
        wait_for(lambda: am.alerts(alertname="DupguardDuplicateNotStopped"), what="the rule's alert")
        time.sleep(2)  # several group_wait/group_interval rounds: a second page would have come
        paged = {a["labels"]["alertname"] for a in receiver.alerts("/pager") if a["status"] == "firing"}
        [rule] = am.alerts(alertname="DupguardDuplicateNotStopped")
        alerter.close(10)
    if with_inhibit:
        assert paged == {DUPLICATE_ALERT}
        assert rule["status"]["inhibitedBy"], rule["status"]
    else:
        assert paged == {DUPLICATE_ALERT, "DupguardDuplicateNotStopped"}
