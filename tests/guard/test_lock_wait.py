"""``DUPGUARD_GUARD_LOCK_WAIT_SECONDS``: the guard waits that long inside the scheduler's
critical section, so only 0-10 s is taken; anything else is refused with one warning and the default
(5 s) is used. The policy module is loaded from its file, as Airflow loads it (no Airflow needed)."""

from __future__ import annotations

import logging

import pytest

from tests.guard.support import load_policy


@pytest.mark.parametrize(("raw", "expected"), [("0", 0.0), ("2.5", 2.5), ("10", 10.0), (" 7 ", 7.0)])
def test_a_wait_within_bounds_is_taken_silently(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, raw: str, expected: float
) -> None:
    monkeypatch.setenv("DUPGUARD_GUARD_LOCK_WAIT_SECONDS", raw)
    with caplog.at_level(logging.WARNING, logger="dupguard.guard"):
        policy = load_policy()
    assert policy._dupguard_guard.lock_wait == expected
    assert caplog.records == []


def test_no_setting_is_the_default(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("DUPGUARD_GUARD_LOCK_WAIT_SECONDS", raising=False)
    with caplog.at_level(logging.WARNING, logger="dupguard.guard"):
        policy = load_policy()
    assert policy._dupguard_guard.lock_wait == 5.0
    assert caplog.records == []


@pytest.mark.parametrize("raw", ["inf", "Infinity", "nan", "-1", "-inf", "10.5", "3600", "1e309", "five", ""])
def test_nonsense_is_refused_loudly_and_the_default_used(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, raw: str
) -> None:
    """inf would make the scheduler sleep for ever holding its locks; nan or a negative number would
    silently switch the wait off; an hour would make other schedulers declare this one dead."""
    monkeypatch.setenv("DUPGUARD_GUARD_LOCK_WAIT_SECONDS", raw)
    with caplog.at_level(logging.WARNING, logger="dupguard.guard"):
        policy = load_policy()
    assert policy._dupguard_guard.lock_wait == 5.0
    if raw:  # an empty value is no setting
        (record,) = caplog.records
        assert record.levelno == logging.WARNING
        assert "DUPGUARD_GUARD_LOCK_WAIT_SECONDS" in record.getMessage() and "refused" in record.getMessage()
    else:
        assert caplog.records == []


@pytest.mark.parametrize(
    ("raw", "shown"),
    [("five", "'five'"), ("9" * 50, repr("9" * 40))],  # the value is quoted, cut at 40 characters
)
def test_the_refusal_says_what_was_refused_and_what_is_used_instead(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, raw: str, shown: str
) -> None:
    """The warning, whole: the setting, the value as given (cut at 40 characters: it lands in the
    scheduler's log), the range taken and why, the value used."""
    monkeypatch.setenv("DUPGUARD_GUARD_LOCK_WAIT_SECONDS", raw)
    with caplog.at_level(logging.WARNING, logger="dupguard.guard"):
        load_policy()
    assert [r.getMessage() for r in caplog.records] == [
        f"dupguard guard: DUPGUARD_GUARD_LOCK_WAIT_SECONDS={shown} refused (a number of seconds from 0 to 10: "
        "the wait holds the scheduler's locks); using 5"
    ]
