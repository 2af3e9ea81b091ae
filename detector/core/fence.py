"""Permission to write for one leader term, until the term's lease ends.

Made by the leader lock (``detector.app.leader.AdvisoryLock.fence``) and checked by the remediation
before every write (``detector.actions.remediation``): a write is sent only while its fence is valid,
with its whole timeout clipped to ``remaining()``. Pure: the clock is given, never read here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Fence:
    """``ends``: the instant (on ``clock``, a monotonic clock) the lease ends. ``key``/``backend_pid``:
    the advisory lock and the server backend it is granted to, for the ``db`` backend's check inside
    its own write transaction (None: nothing to check there). A snapshot: ask for a fresh one before
    every write."""

    term: int
    ends: float
    clock: Callable[[], float]
    key: int | None = None
    backend_pid: int | None = None

    def remaining(self) -> float:
        return max(0.0, self.ends - self.clock())

    def valid(self) -> bool:
        return self.clock() < self.ends


# The only replica (SQLite, the REST source) or no lock at all: nothing to fence against.
UNFENCED = Fence(term=0, ends=math.inf, clock=lambda: 0.0)

# Where a backend asks for the current fence; None back means: not allowed to write now.
FenceSource = Callable[[], "Fence | None"]


class LeadershipLost(Exception):
    """A write refused because this replica's fence is gone: retried once it leads (and waited) again."""
