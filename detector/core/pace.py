"""How long the daemon waits before its next poll: fast only while an asset race is possible.

Every duplicate the database poll finds comes out of Airflow's asset queues: an asset event inserts
its queue rows (``asset_dag_run_queue``, 3.2+ ``asset_partition_dag_run``) in its own transaction, and
a scheduler loop later turns them into a run; two schedulers racing commit the pair within a loop
or two (docs/explanation/daemon.md, "How the daemon polls"). So the daemon rests (``rest``) while the
queues' fingerprint stands still, and polls fast (``fast``) for ``hold`` after it changes or after a
new asset-triggered run appears. A change, not a presence: a DAG on an AND of assets keeps its queue
row for hours, which must not keep the daemon fast. The top dag_run id is read at rest too, so a run
is never missed, only found up to ``rest`` later.

Pure: the caller passes monotonic seconds and what the source saw.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


def stirred(before: Hashable | None, after: Hashable | None, asset_runs: int) -> bool:
    """Whether a poll saw what may precede a race: new asset-triggered runs, or a queue fingerprint
    unlike the last one read. The first reading (``before`` None) is no change; a poll that read no
    fingerprint (``after`` None: it fetched the runs without the probe) changes nothing either."""
    return asset_runs > 0 or (before is not None and after is not None and before != after)


@dataclass
class Pace:
    """The wait after each successful poll: ``fast`` until ``hold`` after the last stir, else ``rest``
    (or ``fast``, if set slower)."""

    fast: float
    rest: float
    hold: float
    fast_until: float = float("-inf")

    def wait(self, now: float, stir: bool, asset_runs: bool = False) -> float:
        """``asset_runs``: the poll found new asset-triggered runs. The race's second run commits a few
        milliseconds after the first, often while the first is being judged: the next poll goes at once
        (one more probe per such poll), not ``fast`` after a judging that already took milliseconds."""
        if stir:
            self.fast_until = now + self.hold
        if asset_runs:
            return 0.0
        return self.fast if now < self.fast_until else self.slowest  # rest never polls faster than fast

    @property
    def slowest(self) -> float:
        return max(self.fast, self.rest)
