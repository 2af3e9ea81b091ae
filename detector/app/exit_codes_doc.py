"""docs/reference/exit-codes.md: every command's exit codes, generated from what its ``--help`` says
(``cli_help.epilog`` of each command in ``cli_parser.build_parser``, which builds them from
``cli_help.EXIT_CODES``); the test compares them, ``python -m detector.app.exit_codes_doc`` prints the block."""

from __future__ import annotations

import argparse
import re

from detector.app.cli_parser import build_parser

BEGIN = "<!-- exit-codes:begin -->"
END = "<!-- exit-codes:end -->"
_CODE = re.compile(r"^\s+(\d+)\s+(.+)$")


def codes_of(parser: argparse.ArgumentParser) -> dict[int, str]:
    """The ``exit codes:`` section of a parser's epilog (``cli_help.epilog`` writes it)."""
    epilog = parser.epilog or ""
    if "exit codes:" not in epilog:
        return {}
    section = epilog.split("exit codes:", 1)[1].split("\n\n", 1)[0]
    return {int(m[1]): m[2] for line in section.splitlines() if (m := _CODE.match(line))}


def commands() -> dict[str, dict[int, str]]:
    """``dupguard`` itself, then each command in ``--help`` order, with its exit codes."""
    parser = build_parser()
    out = {"dupguard": codes_of(parser)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out |= {f"dupguard {name}": codes_of(sub) for name, sub in action.choices.items()}
    return out


def table() -> str:
    rows = ["| command | exit code | meaning |", "| --- | --- | --- |"]
    for command, codes in commands().items():
        for code, meaning in codes.items():
            rows.append(f"| `{command}` | `{code}` | {meaning.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def block() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


if __name__ == "__main__":
    print(block())
