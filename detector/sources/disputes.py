"""Telling that a note in dupguard's words decided nothing: one log line per such run.

Both sources read earlier decisions back from notes (``detector.core.decisions``); a note that Airflow's
record or the ledger contradicts is ``disputed`` there, and the run is judged afresh. This says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from detector import logs
from detector.core.model import Decisions, Run

log = logs.get("dupguard.decisions")


def report_disputed(prior: Decisions, runs: Iterable[Run], notes: Mapping[int, str]) -> None:
    """One line per run whose note, in dupguard's words, Airflow's record (or the ledger) contradicts:
    it decides nothing and the run is judged afresh (detector.core.decisions)."""
    for run in runs:
        if run.id in prior.disputed:
            log.warning(
                "note_disagrees",
                dag_id=run.dag_id,
                run_id=run.run_id,
                run_state=run.state,
                note=notes.get(run.id, "")[:200],
                reason="a note in dupguard's words on a run Airflow does not show stopped: judged afresh",
            )
