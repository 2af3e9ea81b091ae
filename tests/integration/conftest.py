"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.daemon_harness import Running


@pytest.fixture
def daemons() -> Iterator[list[Running]]:
    """Daemons a test started (in threads); each is stopped when the test ends, pass or fail."""
    started: list[Running] = []
    yield started
    for d in started:
        d.stop()
