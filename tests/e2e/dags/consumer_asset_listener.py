"""The consumer DAG of the user's report (apache/airflow#54491); only its start_date is fixed: one task that
logs its triggering events."""

import pendulum
from airflow.sdk import Asset, dag, task

test_asset = Asset("test://reproduction-asset-duplicate-runs")
# Fixed, not pendulum.now() as in the seed: a moving start_date makes a new DAG version per parse.
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@dag(
    dag_id="consumer_asset_listener",
    schedule=[test_asset],
    start_date=START,
    catchup=False,
)
def consumer_asset_listener():
    @task
    def process_event(**context):
        run_id = context["dag_run"].run_id
        triggering_events = context.get("triggering_asset_events", {})
        print(f"Run ID: {run_id}")
        for asset, events in triggering_events.items():
            print(f"Asset: {asset}, Events: {len(events)}")

    process_event()


consumer_asset_listener()
