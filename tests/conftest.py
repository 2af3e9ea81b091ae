from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pg import Templates


@pytest.fixture(scope="session")
def pg_templates() -> Iterator[Templates]:
    templates = Templates(made={})
    yield templates
    templates.drop_all()
