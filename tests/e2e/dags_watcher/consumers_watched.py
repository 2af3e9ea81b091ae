"""The reporter's second pattern, offline: an AssetWatcher whose event trigger the **triggerer** runs.

The seed used ``MessageQueueTrigger`` on SQS, which cannot be reached here. ``FileDeleteTrigger``
(standard provider, in the committed constraints) is a ``BaseEventTrigger`` too: it waits for a file,
deletes it and fires one event; the triggerer then starts it again. The harness writes the file
(``DUPGUARD_E2E_WATCH_FILE``) every few seconds, so the triggerer, not a task, creates the asset
events (``Trigger.submit_event`` -> ``AssetManager.register_asset_change``, airflow/models/trigger.py
L239-264 in 3.1.2), and the schedulers race on the queue rows exactly as for a producer's outlet.

- ``consumer_watched``: scheduled on the watched asset alone (the seed's consumer, case 2).
- ``consumer_two_assets``: scheduled on the producer's asset **or** the watched one. Two assets
  whose events arrive independently give the overlap race (one scheduler's stale queue read holds
  one asset's row, the other's read both; the runs have different ``run_after`` and share an event).
"""

import os

import pendulum
from airflow.providers.standard.triggers.file import FileDeleteTrigger
from airflow.sdk import Asset, AssetWatcher, dag, task

test_asset = Asset("test://reproduction-asset-duplicate-runs")
trigger = FileDeleteTrigger(filepath=os.environ.get("DUPGUARD_E2E_WATCH_FILE", "/nonexistent"), poke_interval=0.5)
watched_asset = Asset("test://e2e-watched-asset", watchers=[AssetWatcher(name="e2e_file_watcher", trigger=trigger)])
# Fixed, not pendulum.now() as in the seed: a moving start_date makes a new DAG version per parse.
START = pendulum.datetime(2026, 1, 1, tz="UTC")


def make_consumer(dag_id, schedule):
    @dag(dag_id=dag_id, schedule=schedule, start_date=START, catchup=False)
    def consumer():
        @task
        def process_event(**context):
            print(f"Run ID: {context['dag_run'].run_id}")

        process_event()

    return consumer()


make_consumer("consumer_watched", [watched_asset])
make_consumer("consumer_two_assets", test_asset | watched_asset)
