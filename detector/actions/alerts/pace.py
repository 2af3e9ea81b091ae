"""At most N requests to one sink in any minute (``DUPGUARD_ALERT_REQUESTS_PER_MINUTE``), whatever the storm.

Digests bound the messages a storm makes, not the requests: a JSON webhook digest goes out in parts of
at most 100 groups and an Alertmanager push holds at most 1,000 alerts, so 10,000 groups are a
hundred POSTs, and a Slack bot's digest outcomes are one reply per digest thread. Each channel's
transport waits here before every request (first attempts and retries of the JSON transport alike;
slack-sdk's own retries are not seen), so a storm's requests are spread out instead of refused by
the receiver (Slack answers a burst with 429s) or dropped by a gateway. Waiting happens on the
channel's worker thread (or the Alertmanager re-send thread), never on the detection path.

The bound is per process: a new leader's requests right after a failover are counted afresh. At
shutdown, once the alerter gives up (``stop``), a request still waiting here is not sent at all: the
dispatcher has logged it undelivered.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from detector.errors import AlertDeliveryError

WINDOW = 60.0
# A request leaves here a little before it arrives; a second's slack keeps two that left 60 s apart
# from arriving 59.9 s apart and so being 21 in one window at the receiver.
MARGIN = 1.0


class Pace:
    """``wait`` blocks until one more request keeps at most ``per_minute`` in any ``WINDOW`` seconds
    (0: no bound), then counts it. Thread-safe: a channel's worker and its re-send thread share one."""

    def __init__(
        self,
        per_minute: int,
        *,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.per_minute = per_minute
        self.stop = stop or threading.Event()
        self.clock = clock
        self.sleep = sleep or self.stop.wait
        self._sent: deque[float] = deque()
        self._lock = threading.Lock()

    def wait(self) -> float:
        """Seconds waited before this request may go."""
        if self.per_minute <= 0:
            return 0.0
        waited = 0.0
        while True:
            if self.stop.is_set():
                raise AlertDeliveryError("not sent before shutdown")
            with self._lock:
                now = self.clock()
                while self._sent and self._sent[0] <= now - WINDOW - MARGIN:
                    self._sent.popleft()
                if len(self._sent) < self.per_minute:
                    self._sent.append(now)
                    return waited
                delay = self._sent[0] + WINDOW + MARGIN - now
            self.sleep(delay)
            waited += delay


UNPACED = Pace(0)
