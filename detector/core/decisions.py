"""Reading back earlier keep decisions from what Airflow stores: the notes on stopped runs.

dupguard's remediation (``plan.note_for``) and the in-scheduler guard (``detector/guard/policy.py``
``_DUPGUARD_NOTE``) write a note on every run they stop, naming the kept run. The note lives in
Airflow's ``dag_run_note``, so it is evidence of the decision that survives restarts and failovers
even for read-only users without the durable ledger: a decision is final. Pure: notes in, ``Decisions`` out.

A note is not proof on its own: an operator can type the same words, or copy a note onto another run.
A note counts only where Airflow's record agrees that the run was stopped (``note_agrees``) and the
ledger did not keep the run; any other note in dupguard's words is ``disputed``: the run is judged
afresh, and the source logs the disagreement: a note is not proof.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from detector.core.model import GUARD_NOTE_PREFIX, NO_PROGRESS, Decisions, Run, TaskProgress

# The fixed beginnings of the two notes; the kept run_id follows, then " (".
REMEDIATION_NOTE_PREFIX = "dupguard stopped this run as a duplicate of "
NOTE_PREFIXES = (REMEDIATION_NOTE_PREFIX, GUARD_NOTE_PREFIX)


def note_agrees(run: Run, progress: TaskProgress) -> bool:
    """Whether Airflow's record agrees that ``run`` was stopped: the run failed (mode ``fail``), or it has
    tasks and every one was skipped without starting (mode ``skip``, the guard's runs). A run still
    queued or running whose tasks are not all skipped was not stopped, whatever its note says."""
    return run.state == "failed" or (progress.all_skipped and not progress.any_started)


def decisions_from_notes(
    runs: Iterable[Run],
    notes: Mapping[int, str],
    progress: Mapping[int, TaskProgress] | None = None,
    *,
    ledger_kept: frozenset[int] = frozenset(),
) -> Decisions:
    """Runs whose note says dupguard stopped them, and the runs those notes name as kept; a note that
    disagrees with ``progress``/the run's state (``note_agrees``) or with the ledger (``ledger_kept``)
    decides nothing and is returned as ``disputed``. Every source passes ``progress``; None (Airflow's
    record not read) is left for tests of the keep rule alone.

    The kept run is matched by its full ``run_id`` among ``runs`` of the same DAG (followed by the
    " (" that ends it in both notes), so a run_id that happens to contain spaces cannot be misread.
    """
    group = list(runs)
    stopped: set[int] = set()
    kept: set[int] = set()
    disputed: set[int] = set()
    for run in group:
        note = notes.get(run.id)
        prefix = next((p for p in NOTE_PREFIXES if note and note.startswith(p)), None)
        if note is None or prefix is None:
            continue
        agrees = progress is None or note_agrees(run, progress.get(run.id, NO_PROGRESS))
        if run.id in ledger_kept or not agrees:
            disputed.add(run.id)
            continue
        stopped.add(run.id)
        rest = note[len(prefix) :]
        for other in group:
            if other.id != run.id and other.dag_id == run.dag_id and rest.startswith(other.run_id + " ("):
                kept.add(other.id)
    return Decisions(stopped=frozenset(stopped), kept=frozenset(kept), disputed=frozenset(disputed))


def decisions_from_roles(runs: Iterable[Run], roles: Mapping[tuple[str, str], set[str]]) -> Decisions:
    """The ledger's recorded roles (``kept`` / ``duplicate`` by (dag_id, run_id)) as ``Decisions``."""
    kept: set[int] = set()
    duplicates: set[int] = set()
    for run in runs:
        found = roles.get((run.dag_id, run.run_id), set())
        if "kept" in found:
            kept.add(run.id)
        if "duplicate" in found:
            duplicates.add(run.id)
    return Decisions(duplicates=frozenset(duplicates), kept=frozenset(kept))
