"""Which Airflow a metadata database belongs to, from its alembic head or, failing that, its columns.

Pure functions: the statements that feed them live in ``detector.metadb.catalog``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from detector.errors import UnsupportedSchema
from detector.metadb.schema import Family


def _load_ranges() -> dict[str, str]:
    """revision -> the Airflow versions that end their migrations there, e.g. ">=3.1.0,<3.1.8".

    From Airflow's own ``_REVISION_HEADS_MAP`` (airflow/utils/db.py), extracted by
    scripts/airflow/extract_revisions.py: releases without a migration share their predecessor's head.
    """
    raw = json.loads(resources.files("detector.metadb").joinpath("airflow_revisions.json").read_text())
    ranges: dict[str, str] = {}
    for revision, span in raw["revisions"].items():
        upper = span["next_head_version"]
        ranges[revision] = f">={span['first_version']}" + (f",<{upper}" if upper else "")
    return ranges


REVISION_TO_VERSIONS = _load_ranges()


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    family: Family
    airflow_version: str  # a version range when the alembic head is known, e.g. ">=3.1.0,<3.1.8"
    revision: str | None
    exact: bool

    @property
    def can_duplicate(self) -> bool:
        return self.family is not Family.AIRFLOW_2


def family_of_version(version: str) -> Family:
    major, minor = (int(p) for p in version.split(".")[:2])
    if major < 3:
        return Family.AIRFLOW_2
    if minor == 0:
        return Family.AIRFLOW_3_0
    if minor == 1:
        return Family.AIRFLOW_3_1
    if minor == 2:
        return Family.AIRFLOW_3_2
    return Family.AIRFLOW_3_3  # 3.3 and later read like 3.3 until proven otherwise


def family_from_columns(columns: dict[str, set[str]]) -> Family:
    """Infer the family from ``{table: {column, ...}}`` when the alembic head is unknown."""
    dag_run = columns.get("dag_run")
    if not dag_run:
        raise UnsupportedSchema("no dag_run table: this is not an Airflow metadata database")
    if "execution_date" in dag_run:
        return Family.AIRFLOW_2
    if "run_after" not in dag_run:
        raise UnsupportedSchema("dag_run has neither execution_date nor run_after: unknown Airflow schema")
    if "partition_key" in dag_run:
        return (
            Family.AIRFLOW_3_3
            if "partition_date" in columns.get("asset_partition_dag_run", set())
            else (Family.AIRFLOW_3_2)
        )
    return Family.AIRFLOW_3_1 if "triggering_user_name" in dag_run else Family.AIRFLOW_3_0


def identify(revision: str | None, columns: dict[str, set[str]]) -> SchemaInfo:
    """SchemaInfo from the alembic head, falling back to the columns (callers warn when not exact)."""
    versions = REVISION_TO_VERSIONS.get(revision or "")
    if versions is not None:
        first = versions.split(",")[0].removeprefix(">=")
        return SchemaInfo(family_of_version(first), versions, revision, exact=True)
    family = family_from_columns(columns)
    return SchemaInfo(family, f"{family.value} (inferred from columns)", revision, exact=False)
