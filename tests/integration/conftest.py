"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon_harness import Running
from tests.integration.test_remediation_db import Db
from tests.pg import Templates


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
