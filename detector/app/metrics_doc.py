"""docs/reference/metrics.md: every Prometheus metric dupguard exports, generated from the registry a daemon
builds (``detector.metrics.Metrics``, with each periodic check's own ``metrics.py`` through
``detector.checks.registry``); the test compares them, ``python -m detector.app.metrics_doc`` prints the block.

Read from a real registry, not from the source: a metric is listed as Prometheus scrapes it (a counter's
``_total``), with the labels it is declared with and its help text.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass

from prometheus_client.metrics import MetricWrapperBase

from detector.app.status import StatusBoard
from detector.checks.registry import KINDS
from detector.metrics import Metrics

BEGIN = "<!-- metrics-table:begin -->"
END = "<!-- metrics-table:end -->"
PREFIX = "dupguard_"
# Labels whose values depend on the deployment (its configuration, its DAGs): not listed.
OPEN_LABELS = {"mode", "backend", "channel", "dag_id", "version", "airflow_version"}


@dataclass(frozen=True)
class Metric:
    name: str  # as scraped (a counter's _total; a histogram's base name)
    type: str
    labels: tuple[str, ...]
    help: str
    values: dict[str, tuple[str, ...]]  # label -> the values a daemon starts with at 0 (known up front)
    source: str  # the module that declares it


def _wrappers(metrics: Metrics) -> dict[str, tuple[tuple[str, ...], str]]:
    """Declared metric name -> (its label names, its module), for the labels a series without samples has."""
    out: dict[str, tuple[tuple[str, ...], str]] = {}
    owners: list[tuple[object, str]] = [(metrics, "detector/metrics.py")]
    owners += [(own, f"detector/checks/{kind}/metrics.py") for kind, own in metrics.of_kinds.items()]
    for owner, module in owners:
        values = [getattr(owner, f.name) for f in fields(owner)] if is_dataclass(owner) else []
        values += list(vars(owner).values()) if owner is metrics else []
        for value in values:
            if isinstance(value, MetricWrapperBase):
                out[value._name] = (tuple(value._labelnames), module)
    return out


def metrics() -> list[Metric]:
    """dupguard's own metrics, in the order the registry exports them."""
    registry = Metrics()
    # the series a daemon starts at 0 (detector/app/wiring.py): their label values are known up front
    StatusBoard(registry)
    registry.init_checks(KINDS)
    registry.init_remediations("dry-run", "db")
    registry.init_alerts(["slack"])  # already a peer: adds no value to `peer`
    declared = _wrappers(registry)
    out = []
    for family in registry.registry.collect():
        if not family.name.startswith(PREFIX):
            continue
        labels, module = declared.get(family.name, ((), "detector/metrics.py"))
        sampled = tuple(k for s in family.samples for k in s.labels if k != "le")
        labels = tuple(dict.fromkeys(labels + sampled))
        values = {
            label: tuple(dict.fromkeys(s.labels[label] for s in family.samples if label in s.labels))
            for label in labels
            if label not in OPEN_LABELS
        }
        name = family.name + ("_total" if family.type == "counter" else "")
        out.append(Metric(name, family.type, labels, family.documentation, values, module))
    return out


def table() -> str:
    rows = ["| metric | type | labels | help | declared in |", "| --- | --- | --- | --- | --- |"]
    for m in metrics():
        labels = "<br>".join(f"`{label}`" + _values(m.values.get(label, ())) for label in m.labels) or "—"
        help_ = m.help.replace("|", "\\|")
        rows.append(f"| `{m.name}` | {m.type} | {labels} | {help_} | {m.source} |")
    return "\n".join(rows)


def _values(values: tuple[str, ...]) -> str:
    return ": " + ", ".join(values) if values else ""


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


if __name__ == "__main__":
    print(block())
