"""One run-creation step of Airflow's own scheduler on a database, then the DAG's runs, as JSON.

Run with an Airflow venv's python (``.airflow-venvs/<ver>/bin/python``) and ``AIRFLOW__DATABASE__SQL_ALCHEMY_CONN``
set; ``tests/integration/test_stranded_repair_airflow.py`` does that after dupguard's requeue. It calls
``SchedulerJobRunner._create_dagruns_for_dags`` exactly as ``scripts/airflow/scenarios_stranded.py`` made
the fixtures (``scenarios_asset.AF.create_runs``: one loop's step, committed by Airflow), so the run, its
``run_after`` and the events it consumed are Airflow's.

    AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=postgresql+psycopg2://... .airflow-venvs/3.1.2/bin/python \\
        tests/integration/airflow_scheduler_loop.py orders_consumer [--finish-active]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "airflow"))

import scenarios_asset as sa  # sets Airflow's environment before it is imported


def main() -> None:
    dag_id, finish = sys.argv[1], sys.argv[2:] == ["--finish-active"]
    af = sa.AF()
    if finish:  # the DAG's active runs succeed first, as a worker would finish them (max_active_runs)
        with af.create_session() as session:
            active = [
                dr.run_id
                for dr in session.query(af.DagRun).filter_by(dag_id=dag_id)
                if dr.state in (af.DagRunState.QUEUED, af.DagRunState.RUNNING)
            ]
        for run_id in active:
            sa.set_run_outcome(af, dag_id, run_id, {"extract": 1, "load": 1}, True)
    af.create_runs(af.new_scheduler("scheduler-after-repair"))
    print(json.dumps({"version": af.version, "runs": af.runs(dag_id)}, default=str))


if __name__ == "__main__":
    main()
