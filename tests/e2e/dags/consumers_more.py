"""More consumers of the same asset: ``consumer_fanout_<i>`` (like the user's) and ``consumer_serial``
(``max_active_runs=1``: a duplicate waits QUEUED until the kept run ends, a much wider window).

``DUPGUARD_E2E_SERIAL_SECONDS`` (default 0) makes ``consumer_serial``'s task sleep.
``DUPGUARD_E2E_FANOUT`` (default 1) sets how many fan-out consumers exist; it must be the same for
the DAG processor and the workers (the harness sets it on every Airflow process).
"""

import os
import time

import pendulum
from airflow.sdk import Asset, dag, task

test_asset = Asset("test://reproduction-asset-duplicate-runs")
# Fixed, not pendulum.now() as in the seed: a moving start_date makes a new DAG version per parse.
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def make_consumer(dag_id, seconds=0.0, **kwargs):
    @dag(dag_id=dag_id, schedule=[test_asset], start_date=START, catchup=False, **kwargs)
    def consumer():
        @task
        def process_event(**context):
            print(f"Run ID: {context['dag_run'].run_id}")
            time.sleep(seconds)

        process_event()

    return consumer()


for i in range(int(os.environ.get("DUPGUARD_E2E_FANOUT", "1"))):
    make_consumer(f"consumer_fanout_{i + 1}")

# DUPGUARD_E2E_SERIAL_SECONDS: a slow serial consumer, so the producer's events arrive while its run is
# active and queue behind it (apache/airflow#56050: the events after the queue row's first one strand).
make_consumer("consumer_serial", float(os.environ.get("DUPGUARD_E2E_SERIAL_SECONDS", "0")), max_active_runs=1)
