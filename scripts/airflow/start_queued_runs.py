"""Moves every queued DAG run to running with Airflow's own scheduler code, as the scheduler loop that
created it does (``SchedulerJobRunner._start_queued_dagruns``, 3.1.2 scheduler_job_runner.py L1767;
docs/explanation/airflow-internals.md, "From a new run to a running task": the run starts in the loop that made it
unless ``max_active_runs`` holds it).

The scenario fixtures stop right after the race created its runs (still queued, ``start_date``
NULL); the REST API cannot serve a run's consumed events before it started (apache/airflow#71360),
so the API-source tests first let Airflow start them. Run through af.sh:

    scripts/airflow/af.sh 3.1.2 "$DB" python scripts/airflow/start_queued_runs.py [OTHER_DB ...]

Each further database URL is done in the same process after the first (Airflow's ORM pointed at it
anew): importing Airflow costs seconds, and a test module starts the runs of up to nine databases.
Prints one JSON line per database, in the order given.
"""

from __future__ import annotations

import json
import os
import sys

from airflow import settings
from airflow.jobs.job import Job
from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
from airflow.models.dagrun import DagRun
from airflow.utils.session import create_session
from sqlalchemy import select


def start_queued() -> list[list[str]]:
    with create_session() as session:
        runner = SchedulerJobRunner(job=Job())
        runner._start_queued_dagruns(session)
        session.commit()
        started = session.execute(select(DagRun.dag_id, DagRun.run_id).where(DagRun.state == "running")).all()
    return [list(r) for r in started]


def point_at(url: str) -> None:
    """Airflow's ORM on database ``url`` (its environment variable wins over any other configuration)."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            url = "postgresql+psycopg2://" + url[len(scheme) :]
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = url
    settings.configure_vars()
    settings.reconfigure_orm()


print(json.dumps({"running": start_queued()}), flush=True)
for other in sys.argv[1:]:
    point_at(other)
    print(json.dumps({"running": start_queued()}), flush=True)
