"""Commit messages can be skimmed and speak for themselves (CONTRIBUTING.md, "Commits").

Checked for every commit since the rule was written down (the history before it is what it is): a
subject of at most 72 characters, so ``git log --oneline`` stays one line a commit; and no citation
of a tracker the reader of the history does not have (an issue's number, a section sign). Upstream Airflow issues are
linked as ``apache/airflow#NNNN``. A checkout without that history (a shallow clone, an archive)
has nothing to check, and the test says so by skipping.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SINCE = "7717dd3"  # the last commit before the rule
MAX_SUBJECT = 72
_TRACKER = re.compile(r"\bissues? \d+\b|§", re.IGNORECASE)


def problems(message: str) -> list[str]:
    """What is wrong with one commit message."""
    subject = message.split("\n", 1)[0]
    found = []
    if len(subject) > MAX_SUBJECT:
        found.append(f"subject of {len(subject)} characters (at most {MAX_SUBJECT}): {subject[:60]}…")
    if _TRACKER.search(message):
        found.append(f"cites a tracker the reader does not have: {_TRACKER.search(message).group(0)!r}")  # type: ignore[union-attr]
    return found


def _messages() -> list[tuple[str, str]]:
    known = subprocess.run(["git", "cat-file", "-e", f"{SINCE}^{{commit}}"], cwd=ROOT, capture_output=True, check=False)
    if known.returncode != 0:
        pytest.skip(f"this checkout lacks the history since {SINCE} (shallow clone or archive)")
    out = subprocess.run(
        ["git", "log", "--no-merges", "--format=%h%x00%B%x01", f"{SINCE}..HEAD"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [tuple(entry.strip("\n").split("\0", 1)) for entry in out.split("\x01") if entry.strip()]  # type: ignore[misc]


def test_commit_messages_since_the_rule() -> None:
    bad = {sha: found for sha, message in _messages() if (found := problems(message))}
    assert bad == {}


def test_the_rule_sees_each_fault() -> None:
    assert problems("scan: exit 141 on a closed pipe\n\nDetails.") == []
    assert problems("x" * 73) and not problems("x" * 72)
    issue = "issue"  # built here, so this file cites no issue itself
    assert problems(f"fix ({issue} 25 §3)\n") and problems(f"a\n\nas {issue} 33 asked") and problems("b\n\nsee §2")
    assert problems("guard: skip the duplicate\n\nSee apache/airflow#54491.") == []
