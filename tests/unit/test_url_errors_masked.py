"""A URL setting whose value is refused is shown in the error without the password it holds.

Every URL-valued setting (and both database URLs), through each way a value arrives: flag, env,
``_FILE`` (secret settings) and the YAML file. The values are mistyped the ways people mistype them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from detector.app.cli import main
from detector.config import SETTINGS, load
from detector.errors import ConfigError
from detector.settings import url, urls

PASSWORD = "Pw7secretvalue"
URL_SETTINGS = [s for s in SETTINGS if s.parse in (url, urls) or s.name.endswith("database_url")]
BAD = [
    f"htps://user:{PASSWORD}@host",
    f"http//user:{PASSWORD}@host",
    f"user:{PASSWORD}@host",
    f"http://user:{PASSWORD}@host:port",
    f"http://user:{PASSWORD}@",
    f"postgresq://user:{PASSWORD}@host/db",
    f"postgresql://user:{PASSWORD}@host:port/db",
]


def test_the_settings_are_found() -> None:
    names = {s.name for s in URL_SETTINGS}
    assert {"airflow_api_url", "slack_api_url", "webhook_url", "alertmanager_urls", "lock_database_url"} <= names


def _problems(name: str, value: str, how: str, tmp_path: Path) -> str:
    setting = next(s for s in URL_SETTINGS if s.name == name)
    base = {} if name == "database_url" else {"database_url": "sqlite:////x/airflow.db"}
    flags: dict[str, str | None] = dict(base)
    env: dict[str, str] = {}
    config_file = None
    if how == "flag":
        flags[name] = value
    elif how == "env":
        env[setting.env] = value
    elif how == "file":
        (tmp_path / "secret").write_text(value)
        env[setting.env + "_FILE"] = str(tmp_path / "secret")
    else:
        config_file = tmp_path / "c.yaml"
        config_file.write_text(f"{name}: '{value}'\n")
    with pytest.raises(ConfigError) as caught:
        load(flags, env, str(config_file) if config_file else None)
    return "\n".join(caught.value.problems)


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("name", [s.name for s in URL_SETTINGS])
def test_refused_url_never_shows_its_password(name: str, value: str, tmp_path: Path) -> None:
    secret = next(s for s in URL_SETTINGS if s.name == name).secret
    for how in ("flag", "env", "yaml", *(("file",) if secret else ())):
        text = _problems(name, value, how, tmp_path)
        assert PASSWORD not in text, (how, text)
        assert "host" in text or "invalid value" in text or "URL" in text, text  # still says what is wrong


def test_check_config_names_the_setting_and_masks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
    monkeypatch.setenv("DUPGUARD_AIRFLOW_API_URL", f"htps://user:{PASSWORD}@host")
    assert main(["check-config", "--database-url", "sqlite:////x/airflow.db"]) == 2
    err = capsys.readouterr().err
    assert PASSWORD not in err
    assert "DUPGUARD_AIRFLOW_API_URL: invalid value 'htps://***@host': must start with http:// or https://" in err
