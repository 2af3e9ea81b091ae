from __future__ import annotations

import subprocess
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


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; any still running at the end are killed."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)
