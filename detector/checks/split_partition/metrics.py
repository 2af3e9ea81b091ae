"""The split_partition check's own metrics, beside the ``dupguard_check_*`` series every kind has
(``detector.metrics`` registers them through the registry's entry)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class SplitMetrics:
    detected: Counter
    open: Gauge


def register(r: CollectorRegistry) -> SplitMetrics:
    return SplitMetrics(
        detected=Counter(
            "dupguard_split_partitions_detected_total",
            "Partition keys split into two pending asset_partition_dag_run rows (apache/airflow#71070), once each.",
            registry=r,
        ),
        open=Gauge(
            "dupguard_split_partitions",
            "Split partition keys seen by the last check (past the grace period).",
            registry=r,
        ),
    )
