"""The project explains itself: no file sends a maintainer to notes outside the checkout.

Code comments and docs used to cite ``shared/airflow-facts.md`` (or "facts §2.3"), a file a maintainer
who clones the project does not have. What the code relies on in Airflow is in
docs/explanation/airflow-internals.md, cited by the section's title or its anchor.

Nor does a file cite our issue tracker (an issue's number or a section sign), which a reader does not have: it says
the reason, or links the doc or the upstream Airflow issue (apache/airflow#NNNN is public).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# ../shared/anything, or shared/ and a name of what that folder held (so "a shared/exclusive lock" is fine)
_OUTSIDE = re.compile(r"airflow-facts|\.\./shared/|(?<![\w./-])shared/(?:seed|charts|hooks|STYLE)|\bfacts (?:§|\d\.\d)")
# The one path into ../shared that is not a citation: an optional local copy of the official Airflow
# chart that tests/deploy looks for before pulling it (tests/deploy/support.py); a clone without it
# pulls the chart.
_ALLOWED = re.compile(r"\.\./shared/charts/airflow-\d")
# Our tracker: the word issue(s) with a number ("#3" too), and any section sign. "an issue with",
# version numbers and apache/airflow#54491 (public) are not citations of it.
ISSUE = "issue"  # the examples below build the citations, so this file cites no issue itself
_TRACKER = re.compile(r"\bissues? #?\d+|§", re.IGNORECASE)
# Files that hold the tracker pattern itself as data: the checks of commit messages, of the changelog
# and this one.
_HOLD_THE_PATTERN = {
    "tests/unit/test_commit_messages.py",
    "tests/unit/test_release_version.py",
    "tests/unit/test_self_contained.py",
}
# Stored records of earlier runs, kept as they were written.
_RECORDS = "benchmarks/results/"
_TEXT = {".py", ".md", ".yaml", ".yml", ".sh", ".toml", ".txt", ".json", ".tpl", ".cfg", ".ini", ""}


def _project_files() -> list[Path]:
    """Every file git tracks or would track (untracked but not ignored), as a fresh clone would have it."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    files = [ROOT / name for name in listed.split("\0") if name]
    return [f for f in files if f.suffix in _TEXT and f.is_file() and f != Path(__file__).resolve()]


def outside_citations(text: str) -> list[str]:
    """The lines of ``text`` that cite notes outside the checkout."""
    return [line.strip() for line in text.splitlines() if _OUTSIDE.search(_ALLOWED.sub("", line))]


def test_no_file_cites_notes_outside_the_checkout() -> None:
    """No code, test, script, doc or manifest cites shared/ or ../shared (or the shared facts file by
    section): the project's own docs hold what the code relies on."""
    found = {}
    for path in _project_files():
        try:
            lines = outside_citations(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}


def test_the_check_sees_each_form() -> None:
    """Each way the shared notes were cited is caught; the chart lookup and ordinary words are not."""
    cited = [
        "on is named beside it (shared/airflow-facts.md §1.5).",
        "see ../shared/seed for the DAGs",
        "Airflow's ``set_dag_run_state_to_failed`` then marks the TIs (facts §4.2)",
        "runs (facts 2.1): the guard does it itself",
        "The user's producer (shared/seed), with the sleep shortened",
    ]
    fine = [
        "else ``../shared/charts/airflow-1.18.0``",
        "DAG: `orders_consumer`  Cluster: prod-eu   ← facts section",
        "a shared/exclusive lock",
        'docs/explanation/airflow-internals.md, "What marking a run failed does"',
    ]
    assert outside_citations("\n".join(cited)) == cited
    assert outside_citations("\n".join(fine)) == []


def tracker_citations(text: str) -> list[str]:
    """The lines of ``text`` that cite our issue tracker (an issue number or a section sign)."""
    return [line.strip() for line in text.splitlines() if _TRACKER.search(line)]


def files_citing_the_tracker() -> dict[str, list[str]]:
    """Each project file (but the records of runs and the files holding the pattern) with its lines
    that cite the tracker."""
    found = {}
    for path in _project_files():
        name = str(path.relative_to(ROOT))
        if name in _HOLD_THE_PATTERN or name.startswith(_RECORDS):
            continue
        try:
            lines = tracker_citations(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
        if lines:
            found[name] = lines
    return found


def test_no_file_cites_the_tracker() -> None:
    """No code, test, script, doc or manifest cites our issue tracker: a reader does not have it."""
    assert files_citing_the_tracker() == {}


def test_the_tracker_check_sees_each_form() -> None:
    """Each way the tracker was cited is caught; upstream issues, ordinary words and versions are not."""
    cited = [
        f"End to end on the reporter's stack ({ISSUE} 17): a real HA Airflow",
        f"Catch rate: a matrix of end-to-end runs ({ISSUE}s 8 and 17, benchmarks/results/e2e.md).",
        f"{ISSUE.capitalize()} 22 §7: Airflow's own ``DagRun.set_state`` raises",
        "a decision is final (see issue #11)",
        "docs/explanation/airflow-internals.md §2.3",
        "[airflow-internals §2.4-2.5](../explanation/airflow-internals.md#24-the-32-fix)",
        "Figures, not tests (STYLE.md §11).",
    ]
    fine = [
        "the guard does it itself (apache/airflow#54491, #63507)",
        "an issue with the lock: two replicas both hold it",
        "issues noticed while reading Airflow 3.1.2 and 3.2.0",
        'docs/explanation/airflow-internals.md, "The 3.0/3.1 race"',
        "[2.5](airflow-internals.md#25-partitioned-runs-32)",
        "fixed in 3.2.2 (apache/airflow PR #65792)",
    ]
    assert tracker_citations("\n".join(cited)) == [line.strip() for line in cited]
    assert tracker_citations("\n".join(fine)) == []
