"""The project explains itself: no file sends a maintainer to notes outside the checkout.

Code comments and docs used to cite ``shared/airflow-facts.md`` (or "facts §2.3"), a file a maintainer
who clones the project does not have (issue 24). What the code relies on in Airflow is in
docs/explanation/airflow-internals.md, cited by section.
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
        "docs/explanation/airflow-internals.md §4.2",
    ]
    assert outside_citations("\n".join(cited)) == cited
    assert outside_citations("\n".join(fine)) == []
