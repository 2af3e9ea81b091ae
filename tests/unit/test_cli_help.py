"""The command line a person reads: short grouped help, metavars that say what a value is, one spelling per
option (old ones still work), a suggestion for a typo and errors that name the flag that was typed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from detector.app import demo
from detector.app.cli import build_parser, main
from detector.app.cli_help import ALIASES
from detector.config import SETTINGS
from detector.settings import GROUPS

# A screenful: 80 lines of 80 columns. What --help leaves out, `dupguard settings` lists.
HELP_BUDGET = 80
COMMANDS = ("scan", "run", "doctor", "check-config", "settings", "init-db", "guard", "demo")
SETTINGS_COMMANDS = ("run", "doctor", "check-config")


def _sub(command: str) -> argparse.ArgumentParser:
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    parser: argparse.ArgumentParser = choices[command]
    return parser


@pytest.fixture
def columns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal; tests see the common 80


@pytest.fixture
def demo_db(tmp_path: Path) -> str:
    path = tmp_path / "airflow.db"
    demo.build(path)
    return f"sqlite:///{path}"


@pytest.mark.usefixtures("columns")
@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_fits_a_screen_with_examples_and_exit_codes(command: str) -> None:
    text = (_sub(command) if command else build_parser()).format_help()
    assert len(text.splitlines()) <= HELP_BUDGET, (command, len(text.splitlines()))
    assert "examples:" in text and "exit codes:" in text and "\n  2  " in text, command
    assert text.count("\n\n") >= 2  # a description, then options, then the epilog


@pytest.mark.usefixtures("columns")
@pytest.mark.parametrize("command", SETTINGS_COMMANDS)
def test_settings_help_is_grouped_and_says_what_each_value_is(command: str) -> None:
    parser = _sub(command)
    text = parser.format_help()
    for title in GROUPS:
        assert f"\n{title}" in text, (command, title)
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    for s in SETTINGS:
        assert s.group in GROUPS, s.name
        assert by_flag[s.flag].metavar == s.value_name != "VALUE", s.name
    body = text.split("\n", 1)[1]  # the usage line says [--SETTING VALUE ...]
    assert "VALUE" not in body
    assert "--remediation {off,dry-run,fail,skip}" in text and "DURATION" in _sub("doctor").format_help()
    assert "dupguard settings --group 'alerts'" in text


def test_old_spellings_work_and_stay_hidden(demo_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`--dags` and `--exclude-dags` (the settings' names) on scan, repeatable or comma-separated; `--dag`
    and `--exclude-dag` give the same answer and are not in the help."""
    answers = []
    for dag, exclude in (("--dags", "--exclude-dags"), ("--dag", "--exclude-dag")):
        argv = ["scan", "--database-url", demo_db, "--format", "json", dag, "nothing_*,*orders*", exclude, "archive_*"]
        assert main(argv) == 1
        answers.append([g["dag_id"] for g in json.loads(capsys.readouterr().out)["groups"]])
    assert answers == [["load_orders"], ["load_orders"]]
    for command in ("scan", *SETTINGS_COMMANDS):
        text = _sub(command).format_help()
        assert not any(f"{alias} " in text for alias in ALIASES), command


@pytest.mark.parametrize("command", ["scan", "check-config"])
def test_disabled_checks_error_names_the_flag(
    command: str, demo_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown check kind, given on the command line (old spelling too), is blamed on the flag."""
    monkeypatch.delenv("DUPGUARD_DISABLED_CHECKS", raising=False)
    for flag in ("--disabled-checks", "--disable-check"):
        assert main([command, "--database-url", demo_db, flag, "nope"]) == 2
        err = capsys.readouterr().err
        assert "--disabled-checks: unknown check nope" in err and "DUPGUARD_DISABLED_CHECKS" not in err


def test_cross_check_names_the_typed_flag(
    demo_db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    assert main(["check-config", "--database-url", demo_db, "--remediation", "fail"]) == 2
    assert "--remediation=fail/skip with the api backend needs" in capsys.readouterr().err
    monkeypatch.setenv("DUPGUARD_REMEDIATION", "fail")  # set in the environment: named as such
    assert main(["check-config", "--database-url", demo_db]) == 2
    assert "DUPGUARD_REMEDIATION=fail/skip" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "typed", "meant"),
    [
        (["run", "--databse-url", "x"], "--databse-url", "--database-url"),
        (["check-config", "--remediaton=fail"], "--remediaton", "--remediation"),
        (["scan", "--sinse", "1d"], "--sinse", "--since"),
        (["doctor", "--log-levl", "debug"], "--log-levl", "--log-level"),
    ],
)
def test_typo_gets_a_suggestion(argv: list[str], typed: str, meant: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"{typed}: did you mean {meant}" in capsys.readouterr().err


def test_settings_command_lists_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["name"] for r in rows) == sorted(s.name for s in SETTINGS)
    assert all(r["group"] in GROUPS and r["metavar"] != "VALUE" for r in rows)
    assert main(["settings", "--group", "alerts", "--format", "json"]) == 0
    alerts = json.loads(capsys.readouterr().out)
    assert {r["group"] for r in alerts} == {"alerts"} and len(alerts) == sum(s.group == "alerts" for s in SETTINGS)
