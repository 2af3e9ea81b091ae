"""Delivering an alert in parts (a storm's digest): each part is sent, also after one failed.

Shared by the dispatcher's channels and the Alertmanager sink, so that every part is either
delivered or reported with its own groups (after one refused part the rest of a digest
was never attempted, and one line covered every group)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from detector.core.ports import AlertEvent
from detector.errors import AlertDeliveryError


class PartialDelivery(AlertDeliveryError):
    """Parts of a digest that failed (their events and why); ``sent`` parts went out."""

    def __init__(self, sent: int, failed: list[tuple[tuple[AlertEvent, ...], str]]) -> None:
        super().__init__(f"{len(failed)} of {sent + len(failed)} parts undelivered: {failed[0][1]}")
        self.sent, self.failed = sent, failed


def send_each(parts: Iterable[tuple[Sequence[AlertEvent], Callable[[], object]]]) -> int:
    """Send every part, also after one failed: the number sent, or ``PartialDelivery``."""
    sent, failed = 0, []
    for events, send in parts:
        try:
            send()
            sent += 1
        except Exception as exc:  # noqa: BLE001 - each part is delivered or reported on its own
            failed.append((tuple(events), str(exc) or type(exc).__name__))
    if failed:
        raise PartialDelivery(sent, failed)
    return sent
