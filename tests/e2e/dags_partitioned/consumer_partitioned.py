"""Partitioned consumer (Airflow 3.2+): one run per partition key of the producer's asset.

``PartitionedAssetTimetable`` with the identity mapper: the scheduler creates its runs in
``SchedulerJobRunner._create_dagruns_for_partitioned_asset_dags`` from pending
``asset_partition_dag_run`` rows, read without a lock in 3.2 (two schedulers can both create one).
"""

import pendulum
from airflow.sdk import Asset, IdentityMapper, PartitionedAssetTimetable, dag, task

partitioned_asset = Asset("test://e2e-partitioned-asset")
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@dag(
    dag_id="consumer_partitioned",
    schedule=PartitionedAssetTimetable(assets=partitioned_asset, default_partition_mapper=IdentityMapper()),
    start_date=START,
    catchup=False,
)
def consumer_partitioned():
    @task
    def process_partition(**context):
        print(f"Run ID: {context['dag_run'].run_id} partition {context['dag_run'].partition_key}")

    process_partition()


consumer_partitioned()
