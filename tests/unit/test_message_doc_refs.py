"""Messages and help that send the reader somewhere name a place that exists.

The README is a short front door that is rewritten often: a message that says "(README, Read-only
access)" sends the operator to a section that is gone. Messages name a page under docs/ instead, and
a "section N: Title" named with it is a heading of that page.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "detector").rglob("*.py"))


def test_no_message_points_at_the_readme() -> None:
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in SOURCES
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "README" in line
    ]
    assert hits == []


def test_named_docs_and_sections_exist() -> None:
    named = 0
    for p in SOURCES:
        for match in re.finditer(r"(docs/[\w/.-]+\.md)(?:, section (\d+): ([\w ]+))?", p.read_text(encoding="utf-8")):
            doc = ROOT / match[1]
            assert doc.is_file(), (p, match[1])
            if match[2]:
                heading = f"## {match[2]}. {match[3]}"
                assert heading in doc.read_text(encoding="utf-8").splitlines(), (p, heading)
                named += 1
    assert named >= 2  # the grant hints of the check runner and of doctor
