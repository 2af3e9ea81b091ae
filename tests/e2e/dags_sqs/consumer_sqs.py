"""The seed's AssetWatcher on SQS, offline: the AWS provider's own ``SqsSensorTrigger`` against moto's
server (``tests/e2e/sqs.py``), which speaks the SQS API on 127.0.0.1.

Each event's payload is ``{"status": "success", "message_batch": [<SQS message>...]}`` (sqs.py
``run``), so every event carries its messages' ``MessageId``: two events with one id are one message
processed twice (docs/explanation/airflow-internals.md, "One message, one asset event per triggerer"). On 3.1.2 both
triggerers run the trigger (#65792), but SQS hands a message to one receiver until its visibility timeout ends; the
harness's
``DUPGUARD_E2E_SQS_VISIBILITY`` (0 by default) is that timeout on every receive, so a copy that polls
before the other deleted the message receives it too (a redelivery), as on a queue whose timeout is
shorter than the time between receive and delete. Empty: the queue's own (30 s).

- ``consumer_sqs``: scheduled on the watched asset alone; its task takes
  ``DUPGUARD_E2E_SQS_TASK_SECONDS``, so events arrive while a run is going.
"""

import os
import time

import pendulum
from airflow.providers.amazon.aws.triggers.sqs import SqsSensorTrigger
from airflow.sdk import Asset, AssetWatcher, dag, task

visibility = os.environ.get("DUPGUARD_E2E_SQS_VISIBILITY", "0")
trigger = SqsSensorTrigger(
    sqs_queue=os.environ.get("DUPGUARD_E2E_SQS_QUEUE_URL", "http://127.0.0.1:1/000000000000/none"),
    # No connection: botocore reads moto's endpoint and dummy keys from AWS_* variables. With one, each
    # poll's get_connection masks its password: mask_secret sends MaskSecret to the supervisor
    # (airflow/sdk/log.py L239 in 3.1.2) through TriggerCommsDecoder.send, async_to_sync(asend) on a
    # loop of its own, whose asyncio lock does not exclude the runner's sync_state_to_supervisor; the
    # triggerer died within a minute: "Response read out of order! Got frame.id=128, expect_id=129"
    # (triggerer_job_runner.py L788; 3.2.2 rewrote the comms: one reader loop, futures per request).
    aws_conn_id=None,
    wait_time_seconds=1,
    visibility_timeout=int(visibility) if visibility else None,
    waiter_delay=1,  # the provider's 60 s would leave one poll a minute
)
sqs_asset = Asset("test://e2e-sqs-asset", watchers=[AssetWatcher(name="e2e_sqs_watcher", trigger=trigger)])
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@dag(dag_id="consumer_sqs", schedule=[sqs_asset], start_date=START, catchup=False)
def consumer_sqs():
    @task
    def process_messages(**context):
        ids = [
            m["MessageId"]
            for e in context["triggering_asset_events"][sqs_asset]
            for m in e.extra.get("payload", {}).get("message_batch", [])
        ]
        print(f"Run ID: {context['dag_run'].run_id} messages {ids}")
        time.sleep(float(os.environ.get("DUPGUARD_E2E_SQS_TASK_SECONDS", "8")))

    process_messages()


consumer_sqs()
