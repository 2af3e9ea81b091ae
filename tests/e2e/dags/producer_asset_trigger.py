"""The producer DAG of the user's report (apache/airflow#54491), with the sleep shortened: one asset
event every few seconds.

``DUPGUARD_E2E_PRODUCER_SLEEP`` (seconds, default 2; the user's DAG slept 30) is read when the task
runs; the harness sets it on the schedulers, whose LocalExecutor workers run the task.
"""

import os
import time
from datetime import datetime

import pendulum
from airflow.sdk import Asset, dag, task

test_asset = Asset("test://reproduction-asset-duplicate-runs")
# Fixed, not pendulum.now() as in the seed: a moving start_date makes a new DAG version per parse.
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@dag(
    dag_id="producer_asset_trigger",
    schedule="@continuous",
    start_date=START,
    catchup=False,
    max_active_runs=1,
)
def producer_asset_trigger():
    @task(outlets=[test_asset])
    def emit_asset_event():
        ts = datetime.now().isoformat()
        print(f"Emitting asset event at {ts}")
        time.sleep(float(os.environ.get("DUPGUARD_E2E_PRODUCER_SLEEP", "2")))
        return {"emitted_at": ts}

    emit_asset_event()


producer_asset_trigger()
