"""Partitioned producer (Airflow 3.2+, ``--dags partitioned``): one task whose outlet is a partitioned asset.

``schedule=None``: the harness triggers one run every few seconds through the REST API with a new
``partition_key`` (3.2 lets any Dag run carry one). When the task succeeds, Airflow registers the
asset event with the run's ``partition_key`` (``TaskInstance.register_asset_changes_in_db``), which
writes ``asset_partition_dag_run`` (APDR) and ``partitioned_asset_key_log`` for the consumer.
``DUPGUARD_E2E_PRODUCER_SLEEP`` (seconds, default 2) is read when the task runs.
"""

import os
import time

import pendulum
from airflow.sdk import Asset, dag, task

partitioned_asset = Asset("test://e2e-partitioned-asset")
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@dag(dag_id="producer_partitioned", schedule=None, start_date=START, catchup=False)
def producer_partitioned():
    @task(outlets=[partitioned_asset])
    def emit_partition(**context):
        print(f"Emitting partition {context['dag_run'].partition_key}")
        time.sleep(float(os.environ.get("DUPGUARD_E2E_PRODUCER_SLEEP", "2")))

    emit_partition()


producer_partitioned()
