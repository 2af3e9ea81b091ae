"""Prometheus metrics (prometheus-client). One ``Metrics`` per daemon, on its own registry, so tests
can run several daemons in one process. Names follow prometheus.io naming: one ``dupguard_`` prefix,
base units, ``_total`` counters, no run_id labels (unbounded cardinality).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from detector import __version__

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
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
        self.build_info = Gauge(
            "dupguard_build_info", "Build and Airflow version.", ["version", "airflow_version"], registry=r
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
        self.alerts = Counter(
            "dupguard_alerts_total",
            "Alert deliveries: sent, deduplicated, retried, failed.",
            ["channel", "outcome"],
            registry=r,
        )

    def set_build(self, airflow_version: str) -> None:
        self.build_info.clear()
        self.build_info.labels(version=__version__, airflow_version=airflow_version).set(1)
