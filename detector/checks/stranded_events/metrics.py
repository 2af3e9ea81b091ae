"""The stranded_events check's own metrics (its repair step's outcomes), beside the ``dupguard_check_*``
series every kind has (``detector.metrics`` registers them through the registry's entry)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter


@dataclass(frozen=True)
class StrandedMetrics:
    repairs: Counter  # by outcome


def register(r: CollectorRegistry) -> StrandedMetrics:
    return StrandedMetrics(
        repairs=Counter(
            "dupguard_stranded_repairs_total",
            "Repairs of stranded asset events by outcome (planned, requeued, repaired, repair_unverified, "
            "refused, skipped, failed, not_permitted).",
            ["outcome"],
            registry=r,
        ),
    )
