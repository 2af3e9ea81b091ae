"""What on-call must know first: how bad it is, what to do now, and where to look.

Pure: a group's state in, Slack mrkdwn out. The severity is words (``CRITICAL — both runs executed``),
not only an emoji, so it survives notifications, screen readers and colour blindness. Each outcome has
one "what to do now" line, with the links to the runs it names. Links are mrkdwn ``<url|label>``, not
buttons: a button posts an interaction payload to the Slack app on every click, which an incoming
webhook or a bot without an Interactivity URL cannot answer.

Levels follow the harm. ``CRITICAL``: a duplicate that will run (nobody stopped it: dry-run,
remediation off, kept by an earlier judgement, a stop not confirmed or failed) or ran (too late,
caught after start): it pages, unless the operator lowers it to ``WARNING``
(``DUPGUARD_UNSTOPPED_SEVERITY``). ``HIGH``: a confirmed duplicate being stopped (its outcome
follows). ``WARNING``: a suspected duplicate (dupguard never stops one). ``INFO``: nothing left to do.
Every channel says the same: ``Guidance.severity`` is the level in Alertmanager's words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from detector.actions.alerts.text import clip, context, escape, grid_url, run_url, section
from detector.config import RUNBOOK_URL, Config
from detector.core.model import Confidence, Finding, Run
from detector.core.plan import Mode, Outcome
from detector.core.ports import RemediationResult, Result

# The anchors of docs/runbooks.md, one per alert (the Alertmanager sink and the Prometheus rules use the same);
# a periodic check's are Dupguard<Kind> (notice.alertname_of), the split partition's in its alert.py
DUPLICATE_ALERT = "DupguardDuplicateRun"
_REFS_SHOWN = 3
_URL_LIMIT = 300
_LINK_LIMIT = 900  # three of them stay within a context element's 3000 characters


@dataclass(frozen=True)
class Links:
    """Where on-call looks beyond the message: the runbook, and the Grafana dashboard when configured."""

    runbook_url: str | None = None
    grafana_url: str | None = None

    @classmethod
    def of(cls, config: Config) -> Links:
        return cls(runbook_url=config.runbook_url, grafana_url=config.grafana_dashboard_url)


NO_LINKS = Links()


_SEVERITY = {"CRITICAL": "critical", "HIGH": "warning", "WARNING": "warning", "INFO": "info"}


@dataclass(frozen=True)
class Guidance:
    level: str  # CRITICAL, HIGH, WARNING, INFO
    reason: str
    todo: str  # mrkdwn, names escaped

    @property
    def headline(self) -> str:
        return f"{self.level} — {self.reason}"

    @property
    def severity(self) -> str:
        """The level in Alertmanager's words (``critical``, ``warning``, ``info``): its ``severity`` label."""
        return _SEVERITY[self.level]


def _harm(unstopped: str) -> str:
    """The level of a duplicate that will run or ran: ``CRITICAL`` unless the operator lowered it."""
    return "CRITICAL" if unstopped == "critical" else "WARNING"


def _ref(run: Run, label: str, ui_url: str | None) -> str:
    url = run_url(ui_url, run.dag_id, run.run_id)
    # a line names up to 7 runs: links this long would break the section's 3000 characters
    if url and len(url) <= _URL_LIMIT:
        return f"<{url}|{label}>"
    return "`" + escape(clip(run.run_id, 80)).replace("`", "'") + "`"


def _dups(f: Finding, ui_url: str | None) -> str:
    shown = f.duplicates[:_REFS_SHOWN]
    labels = ["duplicate"] if len(shown) == 1 else [f"duplicate {i}" for i in range(1, len(shown) + 1)]
    refs = ", ".join(_ref(r, label, ui_url) for r, label in zip(shown, labels, strict=True))
    more = len(f.duplicates) - len(shown)
    return refs + (f" and {more} more" if more else "")


def _both(f: Finding, ui_url: str | None) -> str:
    return (
        f"check the downstream effects of both runs ({_ref(f.kept, 'kept run', ui_url)}, {_dups(f, ui_url)}): "
        "what each wrote, loaded or sent happened twice"
    )


_STOP = 'mark it failed in the Airflow UI (API: `PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}` `{"state": "failed"}`)'


def _by_hand(f: Finding, ui_url: str | None) -> str:
    """Stop it by hand when no task started (what dupguard would have done), else check both runs."""
    if any(f.progress[r.id].started for r in f.duplicates if r.id in f.progress):
        return f"a task of {_dups(f, ui_url)} has started: {_both(f, ui_url)}; {_STOP} to end the rest of its work."
    return f"if no task of {_dups(f, ui_url)} has started, stop it by hand: {_STOP}. If one has, {_both(f, ui_url)}."


def _then_by_hand(lead: str, f: Finding, ui_url: str | None) -> str:
    rest = _by_hand(f, ui_url)
    return f"{lead} {rest[0].upper()}{rest[1:]}"


def _suspected(f: Finding, ui_url: str | None) -> str:
    return (
        "dupguard never stops a suspected duplicate. Check whether both runs should exist "
        f"({_ref(f.kept, 'kept run', ui_url)}, {_dups(f, ui_url)}); if not, " + _by_hand(f, ui_url)
    )


def _not_stopped(f: Finding, ui_url: str | None, mode: str, level: str) -> Guidance:
    """A confirmed duplicate that dupguard does not stop because of its mode (dry-run or off): it will run."""
    if mode == Mode.DRY_RUN:
        return Guidance(
            level, "duplicate not stopped (dry-run)", _then_by_hand("dupguard did not stop it (dry-run).", f, ui_url)
        )
    return Guidance(level, "duplicate not stopped (remediation off)", _then_by_hand("Remediation is off.", f, ui_url))


def _pending(f: Finding, ui_url: str | None, mode: str, level: str) -> Guidance:
    if f.confidence is Confidence.SUSPECTED:
        return Guidance("WARNING", "suspected duplicate run", _suspected(f, ui_url))
    if mode in (Mode.DRY_RUN, Mode.OFF):
        return _not_stopped(f, ui_url, mode, level)
    todo = "Nothing yet: dupguard is stopping the duplicate; the outcome follows."
    return Guidance("HIGH", "duplicate run detected, being stopped", todo)


def _left_alone(f: Finding, ui_url: str | None, results: Sequence[RemediationResult], level: str) -> Guidance:
    """Status ``no_action``: every duplicate was left alone (or deleted) for the planner's reasons."""
    outcomes = {r.action.outcome for r in results}
    if Outcome.KEPT_BEFORE in outcomes:
        todo = _then_by_hand("dupguard never stops a run an earlier judgement kept.", f, ui_url)
        return Guidance(level, "duplicate not stopped (kept by an earlier judgement)", todo)
    if Outcome.DISABLED in outcomes:
        return _not_stopped(f, ui_url, Mode.OFF, level)
    if Outcome.NOT_CONFIRMED in outcomes:
        return Guidance("WARNING", "suspected duplicate run, not stopped", _suspected(f, ui_url))
    return Guidance("INFO", "the duplicate run was deleted", "Nothing to do: the duplicate run no longer exists.")


def guidance(
    f: Finding,
    mode: str,
    status: str,
    results: Sequence[RemediationResult],
    ui_url: str | None,
    unstopped: str = "critical",
) -> Guidance:
    """The severity and the one "what to do now" line of a group in ``status`` (``group_text.status_of``);
    ``unstopped`` (``DUPGUARD_UNSTOPPED_SEVERITY``) is the severity of a duplicate that will run or ran."""
    level = _harm(unstopped)
    if status == "failed":
        return Guidance(
            level,
            "remediation failed: the duplicate may run",
            _then_by_hand("dupguard could not stop it.", f, ui_url),
        )
    if status == "caught_after_start":
        todo = "The tasks named below ran in the duplicate before the stop landed: " + _both(f, ui_url) + "."
        return Guidance(level, "both runs executed (the duplicate was stopped mid-run)", todo)
    if status == "too_late":
        todo = f"dupguard left the duplicate alone: {_both(f, ui_url)}; {_STOP} if the rest of its work must not run."
        return Guidance(level, "both runs executed", todo)
    if status == "unknown":
        todo = (
            f"Open {_dups(f, ui_url)}: stopped with no task run, nothing more to do; "
            f"a task running or ran: {_both(f, ui_url)}."
        )
        return Guidance(level, "stop sent but not confirmed", todo)
    if status == "dry_run":
        return _not_stopped(f, ui_url, Mode.DRY_RUN, level)
    if status == "remediated":
        return Guidance("INFO", _stopped_how(results), "Nothing to do: the duplicate is stopped.")
    if status == "no_action":
        return _left_alone(f, ui_url, results, level)
    return _pending(f, ui_url, mode, level)


def _stopped_how(results: Sequence[RemediationResult]) -> str:
    """Who stopped the duplicate(s) of a ``remediated`` group: this write, the guard, or an earlier stop."""
    if all(r.action.outcome is Outcome.PREVENTED for r in results):
        return "prevented by the in-scheduler guard: its tasks were created skipped"
    if any(r.result is Result.DONE for r in results):
        return "duplicate stopped before its tasks ran"
    return "duplicate already stopped (earlier, by dupguard, its guard, an operator or Airflow)"


def icon(level: str) -> str:
    """The emoji next to the level word in a header (the word is what counts)."""
    return {"CRITICAL": ":rotating_light:", "HIGH": ":warning:", "WARNING": ":grey_question:"}.get(
        level, ":white_check_mark:"
    )


def guidance_section(g: Guidance) -> dict[str, Any]:
    """The block right under the header: the severity in bold words, then what to do now."""
    return section(f"*{g.headline}*\n*What to do now:* {g.todo}")


def links_context(alert: str, links: Links, ui_url: str | None = None, dag_id: str | None = None) -> dict[str, Any]:
    """Runbook, Grafana dashboard and the DAG's grid view, as one context line (the last two when configured).
    A link longer than a context line can hold (names far beyond Airflow's limits) is left out."""
    runbook = runbook_link(links.runbook_url or RUNBOOK_URL, alert)
    grid = grid_url(ui_url, dag_id) if dag_id else None
    parts = [f"<{runbook}|Runbook: {alert}>" if _fits(runbook) else f"Runbook: `docs/runbooks.md#{alert}`"]
    parts += [
        f"<{url}|{label}>"
        for url, label in ((links.grafana_url, "Grafana dashboard"), (grid, "DAG grid view"))
        if _fits(url)
    ]
    return context(" · ".join(parts))


def runbook_link(base: str, alert: str) -> str:
    """``alert``'s section of the runbook page at ``base`` (any fragment of the setting replaced)."""
    return f"{base.split('#', 1)[0]}#{alert}"


def _fits(url: str | None) -> bool:
    return url is not None and len(url) <= _LINK_LIMIT
