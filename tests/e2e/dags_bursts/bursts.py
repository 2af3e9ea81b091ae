"""Asset events in bursts (apache/airflow#56050): ``producer_bursts`` waits
``DUPGUARD_E2E_BURST_GAP`` s, then ``DUPGUARD_E2E_BURST`` parallel tasks each emit one event of
``burst_asset`` as they finish (a second or two apart on a LocalExecutor), and the run starts over.

The first event of a burst writes the consumer's queue row; the scheduler's run consumes the events up to
that row's ``created_at`` and deletes it, so the burst's later events wait for the next burst's first one:
stranded for about a gap. ``consumer_burst_serial`` (``max_active_runs=1``, its task sleeps
``DUPGUARD_E2E_BURST_SERIAL_SECONDS``) keeps its row through its running run: every event after the
row's first one strands. ``consumer_burst`` (default ``max_active_runs``) strands what arrives between
its row's insertion and its run's creation. Separate from the other DAGs' asset so the steady producer
does not rescue them within a second.
"""

import os
import time

import pendulum
from airflow.sdk import Asset, dag, task

burst_asset = Asset("test://e2e-burst-asset")
# Fixed, not pendulum.now(): a moving start_date makes a new DAG version per parse.
START = pendulum.datetime(2026, 1, 1, tz="UTC")
BURST = int(os.environ.get("DUPGUARD_E2E_BURST", "4"))


@dag(dag_id="producer_bursts", schedule="@continuous", start_date=START, catchup=False, max_active_runs=1)
def producer_bursts():
    @task
    def wait():
        time.sleep(float(os.environ.get("DUPGUARD_E2E_BURST_GAP", "20")))

    first = wait()
    for i in range(BURST):
        # One task per event (not a mapped task): each success registers one asset event.
        @task(task_id=f"emit_{i + 1}", outlets=[burst_asset])
        def emit():
            print("burst event")

        first >> emit()


producer_bursts()


def make_consumer(dag_id, seconds, **kwargs):
    @dag(dag_id=dag_id, schedule=[burst_asset], start_date=START, catchup=False, **kwargs)
    def consumer():
        @task
        def process_event(**context):
            print(f"Run ID: {context['dag_run'].run_id}")
            time.sleep(seconds)

        process_event()

    return consumer()


make_consumer("consumer_burst", 0.0)
make_consumer(
    "consumer_burst_serial", float(os.environ.get("DUPGUARD_E2E_BURST_SERIAL_SECONDS", "6")), max_active_runs=1
)
