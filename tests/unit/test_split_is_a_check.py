"""A split partition is a check like the others: rendered, counted and listed as they are; format 1's
``split_partitions`` stays one more minor release, deprecated."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from detector.app.render import as_json, as_table, error_json
from detector.app.scan import ScanReport
from detector.checks.split_partition.rule import SplitPartition, SplitRow, observe, split_dict
from detector.metadb.schema import Family
from detector.metadb.versions import SchemaInfo
from detector.metrics import Metrics

NOW = datetime(2026, 12, 7, 8, 0, tzinfo=UTC)
SPLIT = SplitPartition(
    key="split:7",
    dag_id="consumer",
    partition_key="2026-12-06",
    rows=(
        SplitRow(
            id=7,
            created_at=datetime(2026, 12, 7, 7, 0, tzinfo=UTC),
            created_dag_run_id=None,
            event_ids=(1,),
            age_seconds=3600,
        ),
        SplitRow(
            id=9,
            created_at=datetime(2026, 12, 7, 7, 1, tzinfo=UTC),
            created_dag_run_id=None,
            event_ids=(2,),
            age_seconds=3540,
        ),
    ),
    split_at=datetime(2026, 12, 7, 7, 1, tzinfo=UTC),
)


def _report() -> ScanReport:
    info = SchemaInfo(family=Family.AIRFLOW_3_2, airflow_version=">=3.2.0", revision=None, exact=False)
    return ScanReport(
        info=info, findings=[], scanned_at=NOW, since=None, runs_examined=0,
        observations={"split_partition": [observe(SPLIT, NOW)]},
    )  # fmt: skip


def test_json_lists_a_split_under_checks_and_keeps_the_deprecated_alias() -> None:
    doc = json.loads(as_json(_report()))
    assert doc["format_version"] == 1
    [entry] = doc["checks"]["split_partition"]
    assert entry["dag_ids"] == ["consumer"] and entry["stuck_row_ids"] == [7]
    assert doc["summary"]["checks"] == {"split_partition": 1}
    assert doc["split_partitions"] == [split_dict(SPLIT)]  # the deprecated alias: format 1's shape as before
    assert doc["summary"]["split_partitions"] == 1


def test_error_document_keeps_the_deprecated_alias_empty() -> None:
    doc = json.loads(error_json(2, "bad"))
    assert doc["split_partitions"] == [] and doc["summary"]["split_partitions"] == 0


def test_table_shows_a_split_as_every_check_shows_its_findings() -> None:
    text = as_table(_report())
    assert "[SPLIT PARTITION, confirmed] Split partition key 2026-12-06 of DAG consumer" in text
    assert text.count("[SPLIT PARTITION") == 1, "once: no separate split block beside the check's"


def test_splits_are_counted_by_the_metric_families_every_check_has() -> None:
    """No family of its own: ``dupguard_check_*{kind="split_partition"}`` (CHANGELOG, Upgrading)."""
    names = {m.name for m in Metrics().registry.collect()}
    assert "dupguard_check_observations" in names
    assert not [n for n in names if n.startswith("dupguard_split_partitions")]
