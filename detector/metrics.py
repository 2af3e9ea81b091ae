"""Prometheus metrics (prometheus-client). One ``Metrics`` per daemon, on its own registry, so tests
can run several daemons in one process. Names follow prometheus.io naming: one ``dupguard_`` prefix,
base units, ``_total`` counters, no run_id labels (unbounded cardinality).

Hygiene for alerting: every labelled counter whose label values are known up front starts at 0, so
the first failure shows in ``increase()``; no ``_created`` series (they double the series count and
dashboards never use them); ``process_*`` metrics come from prometheus-client's process collector.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from detector import __version__, deadline
from detector.checks.registry import REGISTERED
from detector.core.model import Confidence, Kind
from detector.core.ports import Result

# Process-wide switch of prometheus-client: drop the `_created` series of counters and histograms.
disable_created_metrics()  # type: ignore[no-untyped-call]
ALERT_OUTCOMES = ("sent", "deduplicated", "retried", "failed")

# detector.deadline's peer names known to every process; an alert channel's name is its peer too (the
# Alertmanager sink's alertmanager, alertmanager-1 …: init_alerts adds them)
DEADLINE_PEERS = ("airflow_api", "airflow_token", "slack", "webhook")

T = TypeVar("T")
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.groups_detected = Counter(
            "dupguard_duplicate_groups_detected_total", "Duplicate groups detected.", ["kind", "confidence"], registry=r
        )
        self.poll_duration = Histogram(
            "dupguard_poll_duration_seconds", "Wall time of one poll.", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.detection_latency = Histogram(
            "dupguard_detection_latency_seconds",
            "From the duplicate run's queued_at (set just before its commit) to its detection.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.last_successful_poll = Gauge(
            "dupguard_last_successful_poll_timestamp_seconds", "Unix time of the last successful poll.", registry=r
        )
        self.leader = Gauge("dupguard_leader", "1 while this replica holds the leader lock.", registry=r)
        self.db_up = Gauge("dupguard_db_up", "1 while the metadata database answers.", registry=r)
        self.up = Gauge(
            "dupguard_up",
            "1 while this replica leads and polls, or stands by behind a live leader; 0: see dupguard_state.",
            registry=r,
        )
        self.state = Gauge(
            "dupguard_state",
            "1 for this replica's current state: leading, standby, or why it cannot detect or act.",
            ["state"],
            registry=r,
        )
        self.ledger_fault = Gauge(
            "dupguard_ledger_fault",
            "1 while a table of the durable ledger is missing, altered or unwritable (kind): detection and alerts "
            "go on, remediation waits for its claims; the ledger_fault log line names the repair.",
            ["kind"],
            registry=r,
        )
        self.leader_wait = Gauge(
            "dupguard_leader_wait_seconds",
            "Seconds a replica that just took the leader lock still waits before its first write (the "
            "previous leader's writes may still land; it detects and alerts meanwhile); 0 otherwise.",
            registry=r,
        )
        self.late_runs = Counter(
            "dupguard_late_runs_total",
            "Runs that became visible more than --gap-grace after a later id (found by the re-scan).",
            registry=r,
        )
        self.gaps_abandoned = Counter(
            "dupguard_gaps_abandoned_total",
            "dag_run ids never seen within the re-scan horizon (rolled-back inserts, or runs missed).",
            registry=r,
        )
        self.coverage_gaps = Counter(
            "dupguard_coverage_gaps_total",
            "Ranges of dag_run ids a new leader term could not judge (deleted before it, or beyond its "
            "catch-up limit); each is one coverage_gap warning naming the ids.",
            registry=r,
        )
        self.build_info = Gauge(
            "dupguard_build_info", "Build and Airflow version.", ["version", "airflow_version"], registry=r
        )
        self.config_missing = Gauge(
            "dupguard_config_missing",
            "1 when the configuration the deployment meant to load (DUPGUARD_CONFIG_EXPECTED) was not loaded.",
            registry=r,
        )
        self.poll_errors = Counter("dupguard_poll_errors_total", "Polls that failed.", registry=r)
        self.remediations = Counter(
            "dupguard_remediations_total", "Remediation attempts by result.", ["mode", "backend", "result"], registry=r
        )
        self.remediation_latency = Histogram(
            "dupguard_remediation_latency_seconds",
            "From detection to the committed state change.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.remediation_queue_depth = Gauge(
            "dupguard_remediation_queue_depth", "Remediations waiting for a free worker.", registry=r
        )
        self.remediation_retries_pending = Gauge(
            "dupguard_remediation_retries_pending",
            "Failed remediations waiting for their back-off to end before another attempt.",
            registry=r,
        )
        self._deadlines = _Deadlines()
        r.register(self._deadlines)
        self.remediation_ready = Gauge(
            "dupguard_remediation_ready",
            "1 while the remediation backend can act at once (api: it holds a token from Airflow's REST "
            "API); 0: /readyz names why. Only for backends that get ready ahead (api).",
            ["backend"],
            registry=r,
        )
        self.alerts = Counter(
            "dupguard_alerts_total",
            "Alert deliveries: sent, deduplicated, retried, failed.",
            ["channel", "outcome"],
            registry=r,
        )

        self.groups_by_dag = Counter(
            "dupguard_duplicate_groups_by_dag_total",
            "Duplicate groups detected per DAG (one series per DAG that had a duplicate).",
            ["dag_id"],
            registry=r,
        )
        # Each periodic check's own metrics (detector/checks/<kind>/metrics.py), by kind; registry order.
        self.of_kinds: dict[str, object] = {k.name: k.metrics(r) for k in REGISTERED if k.metrics is not None}
        # The periodic checks (detector/checks), one series per kind that runs here.
        self.check_observations = Gauge(
            "dupguard_check_observations",
            "What the last run of each periodic check found (split partitions, flapping triggers, ...).",
            ["kind"],
            registry=r,
        )
        self.check_detected = Counter(
            "dupguard_check_detected_total", "Observations of each periodic check, once each.", ["kind"], registry=r
        )
        self.check_failures = Counter(
            "dupguard_check_failures_total",
            "Runs of a periodic check that failed (the database, a timeout, a bug): it saw nothing that time.",
            ["kind"],
            registry=r,
        )
        self.check_seconds = Histogram(
            "dupguard_check_duration_seconds",
            "Duration of one run of a periodic check (read, judge, claim).",
            ["kind"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
            registry=r,
        )
        for kind in Kind:
            for confidence in Confidence:
                self.groups_detected.labels(kind=kind.value, confidence=confidence.value)

    def of_kind(self, kind: str, shape: type[T]) -> T:
        """The metrics of one kind's own (its ``metrics.py``), as the type it registered."""
        found = self.of_kinds[kind]
        if not isinstance(found, shape):
            raise TypeError(f"the metrics of {kind} are a {type(found).__name__}, not a {shape.__name__}")
        return found

    def init_checks(self, kinds: Sequence[str]) -> None:
        """Zero series for every check that runs here, so a rule on them sees 0, not no data."""
        for kind in kinds:
            self.check_observations.labels(kind=kind)
            self.check_detected.labels(kind=kind)
            self.check_failures.labels(kind=kind)

    def init_remediations(self, mode: str, backend: str) -> None:
        """Zero series for every result of the configured mode and backend."""
        for result in Result:
            self.remediations.labels(mode=mode, backend=backend, result=result.value)

    def init_alerts(self, channels: Iterable[str]) -> None:
        """Zero series for every outcome of every configured alert channel."""
        for channel in channels:
            for outcome in ALERT_OUTCOMES:
                self.alerts.labels(channel=channel, outcome=outcome)
            self._deadlines.peers.add(channel)

    def set_build(self, airflow_version: str) -> None:
        """``version`` is dupguard's own; ``airflow_version`` the Airflow series the schema belongs to
        (e.g. "3.1"), a version rather than the range of releases sharing that schema head."""
        self.build_info.clear()
        self.build_info.labels(version=__version__, airflow_version=airflow_version).set(1)


class _Deadlines(Collector):
    """``dupguard_deadline_exceeded_total{peer}``: outbound calls cut at their whole-request deadline
    (``detector.deadline``, which counts them for the process), read at scrape time: the known peers
    from 0, and any other peer that has a count (an overrun is never left out of the scrape)."""

    def __init__(self) -> None:
        self.peers = set(DEADLINE_PEERS)

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "dupguard_deadline_exceeded",
            "Outbound calls with no complete answer within their deadline (--airflow-timeout, --alert-timeout), cut.",
            labels=["peer"],
        )
        counts = deadline.exceeded()
        for peer in sorted(self.peers | counts.keys()):
            family.add_metric([peer], counts.get(peer, 0))
        yield family
