"""More consumers of the same asset: ``consumer_fanout_<i>`` (like the user's) and ``consumer_serial``
(``max_active_runs=1``: a duplicate waits QUEUED until the kept run ends, a much wider window).

``DUPGUARD_E2E_FANOUT`` (default 1) sets how many fan-out consumers exist; it must be the same for
the DAG processor and the workers (the harness sets it on every Airflow process).
"""

import os

import pendulum
from airflow.sdk import Asset, dag, task

test_asset = Asset("test://reproduction-asset-duplicate-runs")
# Fixed, not pendulum.now() as in the seed: a moving start_date makes a new DAG version per parse.
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def make_consumer(dag_id, **kwargs):
    @dag(dag_id=dag_id, schedule=[test_asset], start_date=START, catchup=False, **kwargs)
    def consumer():
        @task
        def process_event(**context):
            print(f"Run ID: {context['dag_run'].run_id}")

        process_event()

    return consumer()


for i in range(int(os.environ.get("DUPGUARD_E2E_FANOUT", "1"))):
    make_consumer(f"consumer_fanout_{i + 1}")

make_consumer("consumer_serial", max_active_runs=1)
