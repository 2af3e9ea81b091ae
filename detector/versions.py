"""Which Airflow a metadata database belongs to, from its alembic head or, failing that, its columns.

Pure functions: the queries that feed them live in ``detector.queries``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from detector.errors import UnsupportedSchema
from detector.schema import Family


def _load_heads() -> dict[str, str]:
    """revision -> Airflow version(s), from Airflow's own ``_REVISION_HEADS_MAP`` (airflow/utils/db.py).

    Releases without a migration share their predecessor's head, so one revision can name several.
    """
    raw: dict[str, str] = json.loads(resources.files("detector").joinpath("airflow_revisions.json").read_text())
    names: dict[str, list[str]] = {}
    for version, revision in raw.items():
        names.setdefault(revision, []).append(version)
    return {rev: " / ".join(versions) for rev, versions in names.items()}


REVISION_TO_VERSION = _load_heads()


@dataclass(frozen=True, slots=True)
class SchemaInfo:
    family: Family
    airflow_version: str  # exact when the alembic head is known, else e.g. "3.1 (inferred)"
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
    version = REVISION_TO_VERSION.get(revision or "")
    if version is not None:
        return SchemaInfo(family_of_version(version.split(" / ")[0]), version, revision, exact=True)
    family = family_from_columns(columns)
    return SchemaInfo(family, f"{family.value} (inferred from columns)", revision, exact=False)
