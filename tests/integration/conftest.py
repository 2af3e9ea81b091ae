"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.airflow_server import ServerPool
from tests.daemon_harness import Running
from tests.integration.test_remediation_db import Db
from tests.pg import Templates
from tests.pg_replica import Replica, streaming_replica


@pytest.fixture
def daemons() -> Iterator[list[Running]]:
    """Daemons a test started (in threads); each is stopped when the test ends, pass or fail."""
    started: list[Running] = []
    yield started
    for d in started:
        d.stop()


@pytest.fixture
def fanout(pg_templates: Templates) -> Iterator[Db]:
    """A clone of the 3.1.2 ``race_asset_fanout`` fixture (three Airflow-made duplicate pairs) and its
    ``Db`` handle; modules with a ``fanout`` of their own (an API server's) override it."""
    db = Db(pg_templates.clone("3.1.2", "race_asset_fanout"))
    yield db
    db.engine.dispose()


@pytest.fixture(scope="session")
def airflow_servers(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPool]:
    """The session's shared Airflow API servers (tests.airflow_server.ServerPool). The modules using it
    share an ``xdist_group``, so one worker starts the server once for all of them."""
    pool = ServerPool(pg_templates, tmp_path_factory.mktemp("airflow-servers"))
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def replica() -> Iterator[Replica]:
    """A hot standby of the test server (tests.pg_replica), one per session: its base backup copies the
    whole shared server, about a minute. The modules using it share an ``xdist_group``; a test that
    pauses its replay resumes it before it ends."""
    with streaming_replica() as r:
        yield r
