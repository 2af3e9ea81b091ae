"""The token command's stderr is the command's own text: it may echo a secret dupguard never knew
(``password=hunter2``), so it is quoted only when nothing in it looks secret, else withheld with a
pointer to where it can be read. Real ``/bin/sh`` commands; no request is sent."""

from __future__ import annotations

import pytest

from detector.airflowapi.client import make_client
from detector.airflowapi.tokens import Budget, TokenSource
from detector.config import Config
from detector.errors import AirflowAuthError


def _failure(stderr: str) -> str:
    config = Config.of(airflow_api_url="http://127.0.0.1:9")
    tokens = TokenSource(
        make_client(config),
        "http://127.0.0.1:9",
        username=None,
        password=None,
        static_token=None,
        timeout=1.0,
        command=f"printf '%s\\n' {stderr!r} >&2; exit 4",
    )
    with pytest.raises(AirflowAuthError) as failed:
        tokens.get(Budget())
    return str(failed.value)


@pytest.mark.parametrize(
    "stderr",
    [
        "login failed: password=Mk1hunter2",
        'error: {"client_secret": "Mk1hunter2"}',
        "aws: --secret-access-key Mk1hunter2 rejected",
        "Authorization: Bearer Mk1hunter2",
        "refreshed eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJNazFodW50ZXIyIn0.c2lnbmF0dXJl",
        "the key AKIAMk1hunter2Mk1hunter2XYZ is not valid",
        "login failed: the password is Mk1hunter2",  # said in words, not as a field
        "Token was 'Mk1hunter2'",
    ],
)
def test_stderr_that_looks_secret_is_withheld_and_says_where_to_look(stderr: str) -> None:
    message = _failure(stderr)
    assert "Mk1hunter2" not in message and "eyJ" not in message, message
    assert "exit code 4" in message and "run the command by hand" in message, message


def test_plain_stderr_is_quoted_once_and_capped() -> None:
    assert "exit code 4: gcloud: no credentialed accounts" in _failure("gcloud: no credentialed accounts")
    long = _failure("x " * 500)
    assert len(long) < 400 and "x x" in long and "…" in long, long
