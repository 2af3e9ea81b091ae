from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog

from tests.pg import Templates


@pytest.fixture(scope="session")
def pg_templates() -> Iterator[Templates]:
    templates = Templates(made={})
    yield templates
    templates.drop_all()


@pytest.fixture(autouse=True)
def _fresh_structlog() -> Iterator[None]:
    """structlog's configuration is process-global and `dupguard` commands set it (level, renderer):
    each test starts from the defaults so no test depends on which ran before it."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()
