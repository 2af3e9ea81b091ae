"""docs/reference/exit-codes.md lists every command's exit codes, and is what the code generates."""

from __future__ import annotations

from detector.app.cli_help import EXIT_CODES
from detector.app.exit_codes_doc import commands


def test_every_command_is_listed_with_codes_from_its_help() -> None:
    """Each command of the parser is on the page with at least its 0 and 2; scan's 3 is its own wording,
    run's 4 only its; the top line is cli_help.EXIT_CODES."""
    found = commands()
    assert found["dupguard"] == EXIT_CODES
    assert {"dupguard scan", "dupguard run", "dupguard doctor", "dupguard demo", "dupguard init-db"} <= found.keys()
    assert all({0, 2} <= codes.keys() for codes in found.values())
    assert "periodic check failed" in found["dupguard scan"][3]
    assert [c for c, codes in found.items() if 4 in codes] == ["dupguard run"]
