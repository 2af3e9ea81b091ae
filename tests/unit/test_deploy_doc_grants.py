"""docs/how-to/deploy-kubernetes.md's grants per use are the privileges `dupguard doctor` checks for that use, so the
statements an admin copies and the report that says whether they took agree."""

from __future__ import annotations

import re
from pathlib import Path

from detector.app import doctor

DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "deploy-kubernetes.md"


def documented(use: str) -> set[tuple[str, str]]:
    """(table, privilege) pairs of the GRANT statements in the table row of ``use``."""
    (row,) = [line for line in DOC.read_text().splitlines() if line.startswith(f"| {use} |")]
    pairs = set()
    for privileges, tables in re.findall(r"GRANT ([A-Z, ]+) ON ([a-z_, ]+) TO", row):
        for table in tables.split(","):
            pairs |= {(table.strip(), p.strip()) for p in privileges.split(",")}
    return pairs


def test_the_db_backend_grants_are_what_doctor_checks() -> None:
    assert documented("`db` remediation backend") == set(doctor.DB_BACKEND)


def test_the_stranded_repair_grant_is_what_doctor_checks() -> None:
    assert documented("Stranded-event repair") == set(doctor.REPAIR_STRANDED)
