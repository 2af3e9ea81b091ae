"""An event trigger whose payload has the shape of a real provider's, for scenarios_trigger_event.py.

Why not the provider itself: the amazon/redis providers are not installed in the Airflow venvs, and
running them needs a broker. What dupguard reads is the payload Airflow stores
(``extra.payload``), so this trigger reads one message from a JSON file standing for the queue and
yields it exactly as the provider's trigger would (docs/explanation/airflow-internals.md, "One message, one asset event
per triggerer"):

* ``shape="sqs"``: ``SqsSensorTrigger.run`` (amazon 9.39.0 ``aws/triggers/sqs.py`` L231):
  ``{"status": "success", "message_batch": [<SQS message with MessageId, ReceiptHandle, MD5OfBody, Body>]}``;
* ``shape="redis"``: redis ``AwaitMessageTrigger.run`` (redis 4.7.1 ``triggers/redis_await_message.py`` L74):
  the pub/sub message ``{"type": "message", "pattern": None, "channel", "data"}``, no id;
* ``shape="custom"``: a custom watcher's own payload, the message as read (``{"meta": {"id": ...}, "body": ...}``):
  its unique id sits under a key only its author knows (dupguard's ``message_id_paths`` names it).

The message is not removed on reception: every copy of the trigger that reads it gets it (an SQS
message whose visibility timeout ran out, or any Redis pub/sub message, which fans out).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


class QueueFileTrigger(BaseEventTrigger):
    def __init__(self, path: str, shape: str) -> None:
        super().__init__()
        self.path, self.shape = path, shape

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("queue_triggers.QueueFileTrigger", {"path": self.path, "shape": self.shape})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        message = json.loads(Path(self.path).read_text())
        if self.shape == "sqs":
            yield TriggerEvent({"status": "success", "message_batch": [message]})
        elif self.shape == "custom":
            yield TriggerEvent(message)
        else:
            yield TriggerEvent({"type": "message", "pattern": None, **message})
