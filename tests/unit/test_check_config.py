"""``dupguard check-config``: the effective configuration, secrets redacted, or every problem at once."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from detector.app.cli import build_parser, main
from detector.config import SETTINGS, load


def test_prints_effective_config_with_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 0; one YAML line per setting, commented with its origin; the output loads back as the same config."""
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("poll_interval: 50ms\ndags: [a_*, b]\n")
    monkeypatch.setenv("DUPGUARD_CLUSTER_NAME", "prod-eu")
    assert main(["check-config", "--config", str(cfg_file), "--database-url", "sqlite:////x/airflow.db"]) == 0
    out = capsys.readouterr().out
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    assert lines["poll_interval"] == "50ms  # config file key poll_interval"
    assert lines["cluster_name"] == "prod-eu  # DUPGUARD_CLUSTER_NAME"
    assert lines["database_url"].endswith("# --database-url")
    assert lines["lock_mode"] == "auto  # default"
    assert len(lines) == len(SETTINGS)
    again = tmp_path / "again.yaml"
    again.write_text(out)
    expected = load({"database_url": "sqlite:////x/airflow.db"}, {"DUPGUARD_CLUSTER_NAME": "prod-eu"}, str(cfg_file))
    assert load({}, {}, str(again)) == expected
    assert yaml.safe_load(out)["dags"] == "a_*,b"


def test_lists_every_problem_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 and every problem listed, no secret echoed."""
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    argv = ["check-config", "--poll-interval", "soon", "--http-port", "99999", "--slack-bot-token", "xoxb-marker-1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    for needle in ("--poll-interval", "--http-port", "DATABASE_URL", "SLACK_CHANNEL"):
        assert needle in err
    assert "xoxb-marker-1" not in err


def test_help_shows_env_var_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    """`run --help` and `check-config --help` name each common setting's env var (and _FILE for secrets) and
    default; `dupguard settings` names every setting's."""
    parser = build_parser()
    for command in ("run", "check-config"):
        sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
        text = " ".join(sub.format_help().split())
        for s in SETTINGS:
            assert (s.env in text) == s.common, (command, s.env)
            if s.secret and s.common:
                assert f"{s.env}_FILE" in text
        assert "default 9469" in text and "default dry-run" in text
    assert main(["settings"]) == 0
    text = capsys.readouterr().out
    for s in SETTINGS:
        assert s.env in text, s.env
        if s.secret:
            assert f"{s.env}_FILE" in text
    assert "default 5ms" in text and "default 9469" in text and "default dry-run" in text


def test_bare_number_durations_refused_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A duration without a unit, as a flag, an env var or in the config file, is refused: exit 2, each
    problem naming its setting and suggesting ms or s (`--poll-interval 10` was read as 10 s)."""
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("gap_grace: 60\nsplit_grace: 1.5\n")
    monkeypatch.setenv("DUPGUARD_DB_TIMEOUT", "5")
    argv = ["check-config", "--config", str(cfg_file), "--database-url", "sqlite:////x/airflow.db"]
    assert main([*argv, "--poll-interval", "10"]) == 2
    problems = capsys.readouterr().err.splitlines()
    for origin, number in [
        ("--poll-interval", "10"),
        ("DUPGUARD_DB_TIMEOUT", "5"),
        ("config file key gap_grace", "60"),
        ("config file key split_grace", "1.5"),
    ]:
        line = next((p for p in problems if origin in p), "")
        assert f"{number}ms" in line and f"{number}s" in line, (origin, problems)


@pytest.mark.parametrize("flag", ["--since", "--suspect-window", "--split-grace"])
def test_scan_refuses_bare_number_durations(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`scan`'s duration flags refuse a bare number too (argparse's usage error, exit 2)."""
    with pytest.raises(SystemExit) as exc:
        main(["scan", "--database-url", "sqlite:////x/airflow.db", flag, "10"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and "10ms" in err and "10s" in err


def test_init_db_help_names_only_its_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """`init-db --help` does not send the reader to a `--source` flag init-db does not have."""
    with pytest.raises(SystemExit) as exc:
        main(["init-db", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--source" not in text
    assert "--database-url" in text and "DUPGUARD_DATABASE_URL_FILE" in text and "Required." in text
