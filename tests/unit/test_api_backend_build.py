"""The ``api`` remediation backend as dupguard builds it (benchmarks/results/mutation.md: api.py's
``from_config`` and ``__init__``): the settings it refuses, each with its whole message; the retry
schedule docs/explanation/remediation.md documents (4 attempts, back-off 0.2 s doubling to 2 s); the leader's
fence it writes under; the read-back it is given. Nothing here sends a request: building the backend
opens no connection, and the static token needs none."""

from __future__ import annotations

import time
from typing import Any

import pytest
from structlog.testing import capture_logs

from detector.actions.remediation.api import ApiBackend
from detector.actions.remediation.guarded import DbRunStates, GuardedRemediator
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.fence import Fence, LeadershipLost
from detector.errors import AirflowApiError, ConfigError
from detector.metadb.engine import make_engine, parse_url
from detector.metadb.schema import Family, airflow_tables
from detector.metrics import Metrics

# Never connected to: nothing in these tests reads the metadata database.
DB = "postgresql://dupguard@127.0.0.1:1/airflow"
ENGINE = make_engine(parse_url(DB))
URL = "http://127.0.0.1:1"


def _config(mode: str = "fail", **settings: Any) -> Config:
    return Config.of(database_url=DB, remediation=mode, remediation_backend="api", **settings)


def _backend(mode: str = "fail", family: Family = Family.AIRFLOW_3_1, **options: Any) -> ApiBackend:
    config = _config(mode, airflow_api_url=URL, airflow_token="a-token")
    remediator = build_remediator(config, ENGINE, airflow_tables(family), Metrics(), **options)
    assert isinstance(remediator, GuardedRemediator) and isinstance(remediator.backend, ApiBackend)
    return remediator.backend


def test_the_api_backend_needs_the_api_url() -> None:
    with pytest.raises(AirflowApiError) as refused:
        ApiBackend.from_config(_config(), ENGINE, airflow_tables(Family.AIRFLOW_3_1))
    assert str(refused.value) == "the api backend needs DUPGUARD_AIRFLOW_API_URL"


def _skip_refused(version: str) -> list[str]:
    return [
        f"DUPGUARD_REMEDIATION=skip with DUPGUARD_REMEDIATION_BACKEND=api is refused on Airflow {version}: its "
        "scheduler can put the skipped tasks back (DagRun.schedule_tis); use DUPGUARD_REMEDIATION=fail, or "
        "skip with DUPGUARD_REMEDIATION_BACKEND=db"
    ]


@pytest.mark.parametrize("family", [Family.AIRFLOW_3_0, Family.AIRFLOW_3_1], ids=["3.0", "3.1"])
@pytest.mark.parametrize("source", ["database", "api"])
def test_skip_through_the_api_is_refused_where_the_scheduler_can_undo_it(family: Family, source: str) -> None:
    """The family is the database's schema's (``--source database``) or the one the API reported
    (``--source api``, no tables): refused either way, naming the version and what to use instead."""
    config = _config("skip", airflow_api_url=URL, airflow_token="a-token")
    tables, given = (airflow_tables(family), None) if source == "database" else (None, family)
    with pytest.raises(ConfigError) as refused:
        ApiBackend.from_config(config, ENGINE if tables else None, tables, family=given, states=None)
    assert refused.value.problems == _skip_refused(family.value)


def test_the_schemas_family_decides_over_the_one_passed() -> None:
    """With the database's tables at hand their family is the one that counts."""
    config = _config("skip", airflow_api_url=URL, airflow_token="a-token")
    with pytest.raises(ConfigError) as refused:
        ApiBackend.from_config(config, ENGINE, airflow_tables(Family.AIRFLOW_3_1), family=Family.AIRFLOW_3_2)
    assert refused.value.problems == _skip_refused("3.1")
    built = ApiBackend.from_config(config, ENGINE, airflow_tables(Family.AIRFLOW_3_2), family=Family.AIRFLOW_3_1)
    built.close()


@pytest.mark.parametrize(
    ("mode", "family"), [("skip", Family.AIRFLOW_3_2), ("fail", Family.AIRFLOW_3_1), ("fail", Family.AIRFLOW_3_0)]
)
def test_skip_on_3_2_and_fail_everywhere_are_accepted(mode: str, family: Family) -> None:
    backend = _backend(mode, family)
    try:
        assert isinstance(backend.states, DbRunStates)  # the read-back reads the metadata database
    finally:
        backend.close()


def test_with_the_api_source_the_read_back_goes_through_the_states_given() -> None:
    """``--source api``: no database; the guard's re-reads and the read-back use the states passed."""
    states = DbRunStates(ENGINE, airflow_tables(Family.AIRFLOW_3_2))  # any RunStates; never read here
    config = _config("skip", airflow_api_url=URL, airflow_token="a-token")
    backend = ApiBackend.from_config(config, None, None, family=Family.AIRFLOW_3_2, states=states)
    try:
        assert backend.states is states
    finally:
        backend.close()


def test_the_retry_schedule_is_the_documented_one() -> None:
    """docs/explanation/remediation.md: 4 attempts with exponential back-off from 0.2 s to 2 s, slept for real.
    Only its lengths are read here: asserting them by timing would be a timed test."""
    backend = _backend()
    try:
        assert (backend.attempts, backend.backoff, backend.max_backoff) == (4, 0.2, 2.0)
        assert backend.sleep is time.sleep
    finally:
        backend.close()


def test_every_write_is_fenced_by_the_leaders_lease() -> None:
    """The daemon's fence reaches the backend: none (the lease ended) refuses the write before anything
    is sent; a lease with 1.5 s left clips the 5 s call timeout to 1.5 s; a long one leaves it."""
    lease: list[Fence | None] = [None]
    backend = _backend(fence=lambda: lease[0])
    try:
        with pytest.raises(LeadershipLost) as lost:
            backend.write_timeout()
        assert str(lost.value) == "this replica's leader lease ended (or it is waiting to act): nothing sent"
        lease[0] = Fence(term=1, ends=10.0, clock=lambda: 10.0)  # ends now: not valid any more
        with pytest.raises(LeadershipLost):
            backend.write_timeout()
        lease[0] = Fence(term=1, ends=11.5, clock=lambda: 10.0)
        assert backend.write_timeout() == 1.5
        lease[0] = Fence(term=1, ends=100.0, clock=lambda: 10.0)
        assert backend.write_timeout() == backend.timeout == 5.0  # --airflow-timeout's default
    finally:
        backend.close()


def test_the_first_token_held_logs_nothing() -> None:
    """``airflow_token_available`` says a token is held again after a failure: never on the first one."""
    backend = _backend()
    try:
        with capture_logs() as logs:
            assert backend.prepare() is None
        assert logs == []
    finally:
        backend.close()
