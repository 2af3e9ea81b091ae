"""Small builders for domain objects used by unit tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count

from detector.core.model import ASSET_TRIGGERED, Run

T0 = datetime(2026, 3, 12, 11, 35, 9, 550275, tzinfo=UTC)
_ids = count(1)


def run(
    dag_id: str = "consumer",
    run_after: datetime = T0,
    *,
    id: int | None = None,
    run_type: str = ASSET_TRIGGERED,
    partition_key: str | None = None,
    job: int | None = None,
) -> Run:
    rid = id if id is not None else next(_ids)
    return Run(
        id=rid,
        dag_id=dag_id,
        run_id=f"{run_type}__{run_after.isoformat()}_{rid:08d}",
        run_type=run_type,
        run_after=run_after,
        state="queued",
        partition_key=partition_key,
        creating_job_id=job,
        queued_at=run_after + timedelta(milliseconds=50),
    )
