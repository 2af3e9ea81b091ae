"""Configuration: precedence, secrets from files, every problem at once, redaction, the settings page in step."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from detector.app.settings_doc import BEGIN, END, block
from detector.config import SETTINGS, Config, load
from detector.errors import ConfigError

SETTINGS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "settings.md"
URL = "postgresql://airflow:pw-in-url@db:5432/airflow"


def test_precedence_flags_over_env_over_file(tmp_path: Path) -> None:
    """A flag beats the env var, which beats the YAML file, which beats the default."""
    cfg_file = tmp_path / "dupguard.yaml"
    cfg_file.write_text("database_url: sqlite:///f.db\ncluster_name: from-file\nhttp_port: 1111\npoll_interval: 50ms\n")
    env = {"DUPGUARD_CLUSTER_NAME": "from-env", "DUPGUARD_HTTP_PORT": "2222"}
    cfg = load({"http_port": "3333"}, env, str(cfg_file))
    assert (cfg.cluster_name, cfg.http_port, cfg.poll_interval) == ("from-env", 3333, timedelta(milliseconds=50))
    assert cfg.log_format == "auto"  # default


def test_secret_from_file(tmp_path: Path) -> None:
    """Every secret can come from a mounted file via <NAME>_FILE."""
    secret = tmp_path / "url"
    secret.write_text(URL + "\n")
    cfg = load({}, {"DUPGUARD_DATABASE_URL_FILE": str(secret)})
    assert cfg.database_url == URL


def test_every_problem_is_listed_and_no_secret_leaks() -> None:
    """Bad values, a missing URL and inconsistent settings are all reported in one error."""
    env = {
        "DUPGUARD_HTTP_PORT": "99999",
        "DUPGUARD_POLL_INTERVAL": "soon",
        "DUPGUARD_REMEDIATION": "nuke",
        "DUPGUARD_SLACK_BOT_TOKEN": "xoxb-very-secret",
        "DUPGUARD_AIRFLOW_TOKEN": "",
    }
    with pytest.raises(ConfigError) as err:
        load({}, env)
    text = str(err.value)
    for expected in ("DUPGUARD_HTTP_PORT", "DUPGUARD_POLL_INTERVAL", "DUPGUARD_REMEDIATION", "DATABASE_URL",
                     "SLACK_CHANNEL"):  # fmt: skip
        assert expected in text
    assert len(err.value.problems) == 5
    assert "xoxb-very-secret" not in text


def test_remediation_needs_api_credentials() -> None:
    """fail/skip through the API without a URL or credentials is a start-up error (auto on the database
    decides at start: it may take db, tests/unit/test_backend_choice.py)."""
    with pytest.raises(ConfigError) as err:
        load({}, {"DUPGUARD_DATABASE_URL": URL, "DUPGUARD_REMEDIATION": "fail", "DUPGUARD_REMEDIATION_BACKEND": "api"})
    assert len(err.value.problems) == 2


@pytest.mark.parametrize(
    ("auth", "problem"),
    [
        ({}, "needs DUPGUARD_AIRFLOW_TOKEN, DUPGUARD_AIRFLOW_TOKEN_COMMAND, or DUPGUARD_AIRFLOW_USERNAME"),
        ({"DUPGUARD_AIRFLOW_USERNAME": "u"}, "needs DUPGUARD_AIRFLOW_TOKEN"),  # a user without a password
        (
            {"DUPGUARD_AIRFLOW_TOKEN": "t", "DUPGUARD_AIRFLOW_TOKEN_COMMAND": "cat t"},
            "TOKEN_COMMAND or DUPGUARD_AIRFLOW_TOKEN, not both",
        ),
        (
            {"DUPGUARD_AIRFLOW_USERNAME": "u", "DUPGUARD_AIRFLOW_PASSWORD": "p", "DUPGUARD_AIRFLOW_TOKEN_COMMAND": "x"},
            "TOKEN_COMMAND or DUPGUARD_AIRFLOW_PASSWORD, not both",
        ),
        ({"DUPGUARD_AIRFLOW_TOKEN_COMMAND": "cat t"}, None),
        ({"DUPGUARD_AIRFLOW_TOKEN": "t"}, None),
        ({"DUPGUARD_AIRFLOW_TOKEN": "t", "DUPGUARD_AIRFLOW_USERNAME": "u", "DUPGUARD_AIRFLOW_PASSWORD": "p"}, None),
    ],
)
def test_exactly_one_way_to_authenticate_to_the_api(auth: dict[str, str], problem: str | None) -> None:
    """The api backend needs one way in; a token command next to a token or a password is ambiguous.
    (A static token next to username/password is accepted: the token wins, as before.)"""
    env = {"DUPGUARD_DATABASE_URL": URL, "DUPGUARD_REMEDIATION": "fail", "DUPGUARD_AIRFLOW_API_URL": "http://af:8080"}
    env["DUPGUARD_REMEDIATION_BACKEND"] = "api"
    if problem is None:
        assert load({}, env | auth).remediation == "fail"
        return
    with pytest.raises(ConfigError) as err:
        load({}, env | auth)
    assert [p for p in err.value.problems if problem in p], err.value.problems
    assert "cat t" not in str(err.value)  # the command is a secret setting


def test_unknown_file_keys_and_bad_yaml(tmp_path: Path) -> None:
    """Typos in the file are errors, not silently ignored."""
    f = tmp_path / "c.yaml"
    f.write_text("database_url: sqlite:///x.db\npoll_intervall: 1s\n")
    with pytest.raises(ConfigError, match="unknown setting 'poll_intervall'"):
        load({}, {}, str(f))
    f.write_text("database_url: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load({}, {}, str(f))


def test_redacted_hides_secrets() -> None:
    """The effective config logged at start has no password, token or webhook URL."""
    cfg = Config.of(
        database_url=URL,
        slack_bot_token="xoxb-secret-token",
        slack_webhook_url="https://hooks.example/T000/B000/XXXX",
        airflow_password="hunter2",
    )
    shown = str(cfg.redacted())
    for secret in ("pw-in-url", "xoxb-secret-token", "XXXX", "hunter2"):
        assert secret not in shown
    assert "db:5432" in shown
    assert "hunter2" not in repr(cfg)


def test_settings_page_table_matches_code() -> None:
    """docs/reference/settings.md's table is exactly what SETTINGS generates (`python -m detector.app.settings_doc`)."""
    text = SETTINGS_PAGE.read_text()
    assert BEGIN in text and END in text, "docs/reference/settings.md lacks the settings table markers"
    current = text[text.index(BEGIN) : text.index(END) + len(END)]
    assert current == block()
    assert len(SETTINGS) == len(Config.__dataclass_fields__)
