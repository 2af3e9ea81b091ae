"""A local SQS for the end-to-end SQS AssetWatcher (``tests/e2e/dags_sqs``): moto's server from the
Airflow venv (``scripts/airflow/venv.sh`` installs ``moto[server]`` for 3.1.2), spoken to with SQS's
JSON protocol over ``urllib`` (the harness's venv has no boto3).

moto routes a request to a service by the credential scope of its ``Authorization`` header and does
not check the signature, so a fixed header with scope ``us-east-1/sqs`` is enough.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REGION = "us-east-1"
QUEUE = "e2e-sqs-watcher"
AUTH = f"AWS4-HMAC-SHA256 Credential=e2e/20260101/{REGION}/sqs/aws4_request, SignedHeaders=host, Signature=0"


def moto_argv(venv: Path, port: int) -> list[str]:
    return [str(venv / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]


def aws_env(endpoint: str) -> dict[str, str]:
    """What botocore needs to reach moto without an Airflow connection: the endpoint, the region and
    dummy keys (moto accepts any)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "e2e",
        "AWS_SECRET_ACCESS_KEY": "e2e-not-a-secret",
    }


class Sqs:
    """The few SQS calls the harness makes: create the queue, send a message, count what is left."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.queue_url = ""

    def call(self, action: str, body: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        headers = {
            "Authorization": AUTH,
            "Content-Type": "application/x-amz-json-1.0",
            "X-Amz-Target": f"AmazonSQS.{action}",
        }
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.endpoint, data=data, headers=headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (127.0.0.1 only)
                result: dict[str, Any] = json.loads(response.read() or b"{}")
                return result
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"SQS {action} -> {exc.code}: {exc.read()[:300]!r}") from None

    def ready(self) -> bool:
        try:
            self.call("ListQueues", {}, timeout=2)
        except (OSError, RuntimeError):
            return False
        return True

    def create_queue(self) -> str:
        self.queue_url = str(self.call("CreateQueue", {"QueueName": QUEUE})["QueueUrl"])
        return self.queue_url

    def send(self, body: str) -> str:
        """Put one message on the queue; its ``MessageId``."""
        return str(self.call("SendMessage", {"QueueUrl": self.queue_url, "MessageBody": body})["MessageId"])

    def left(self) -> int:
        """Messages still on the queue, visible or in flight."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attrs = self.call("GetQueueAttributes", {"QueueUrl": self.queue_url, "AttributeNames": names})
        return sum(int(attrs.get("Attributes", {}).get(n, 0)) for n in names)
