"""What ``dupguard --help`` shows and how a mistyped command line is answered (the parser's side of the CLI).

Settings come from ``SETTINGS`` alone: each one's group, metavar and whether ``--help`` shows it (``common``)
live on the Setting; ``dupguard settings`` lists every one. Old spellings stay accepted, hidden from help.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from typing import Any

from detector.config import SETTINGS
from detector.settings import GROUPS

# Old spelling -> setting name. The setting's name wins because it is also the env var and config key
# (DUPGUARD_DAGS, `dags:`), which `run` always read; `scan`'s singular flags stay working, unlisted.
ALIASES: dict[str, str] = {"--dag": "dags", "--exclude-dag": "exclude_dags", "--disable-check": "disabled_checks"}

EXIT_OK, EXIT_FOUND, EXIT_CONFIG, EXIT_DB = 0, 1, 2, 3
EXIT_CODES: dict[int, str] = {
    0: "done; nothing found",
    1: "found something",
    2: "bad usage or configuration (every problem listed)",
    3: "the database is unreachable, failed a query or is not an Airflow metadata database",
}


def epilog(examples: Sequence[str], codes: dict[int, str]) -> str:
    """Examples and exit codes, as the end of a command's ``--help``."""
    lines = ["examples:", *(f"  {e}" for e in examples), "", "exit codes:"]
    lines += [f"  {code}  {meaning}" for code, meaning in codes.items()]
    return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a mistyped flag (Python < 3.14 has no ``suggest_on_error``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        typos = [a.split("=", 1)[0] for a in extras if a.startswith("-")]
        if typos:  # this (sub)command knows its flags: answer here rather than in the top-level parser
            hints = [f"{t}: did you mean {', '.join(m)}?" for t in typos if (m := self.suggest(t))]
            self.error(f"unrecognized arguments: {' '.join(extras)}" + "".join(f"\n  {h}" for h in hints))
        return parsed, extras

    def suggest(self, typed: str) -> list[str]:
        known = [o for o in self._option_string_actions if o.startswith("--") and o not in ALIASES]
        return difflib.get_close_matches(typed, known, n=3, cutoff=0.75)


def add_settings(parser: argparse.ArgumentParser) -> None:
    """Every setting as a flag, grouped; ``--help`` describes the common ones and counts the rest."""
    parser.add_argument("--config", metavar="FILE", help="YAML file of settings [env DUPGUARD_CONFIG; default none]")
    for title in GROUPS:
        members = [s for s in SETTINGS if s.group == title]
        hidden = sum(not s.common for s in members)
        # One line per group: its title says what --help leaves out and where to find it (argparse shows
        # a group without a shown flag only if it has a description).
        more = f" (+{hidden}: dupguard settings --group '{title}')" if hidden else ""
        shown = hidden < len(members)
        group = parser.add_argument_group(title + (more if shown else ""), None if shown else more.strip(" ()"))
        for s in members:
            help_ = s.help_text if s.common else argparse.SUPPRESS
            group.add_argument(s.flag, dest=f"setting_{s.name}", metavar=s.value_name, help=help_)
    for alias, name in ALIASES.items():
        parser.add_argument(alias, dest=f"setting_{name}", help=argparse.SUPPRESS)
