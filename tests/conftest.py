from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from tests.pg import Templates

# scripts/test.sh runs pytest -n N --dist loadfile: each module runs on one worker, so its module-scoped
# fixtures (an Airflow API server, a PgBouncer, an image build) start once. The modules of one group
# below share a session fixture (tests/integration/conftest.py) and run on one worker together, so it
# starts once for all of them. (xdist's own ``xdist_group`` mark is ignored under pytest 9.)
WORKER_GROUPS = {
    "replica": ("test_standby", "test_guarded_reads", "test_doctor"),
    "airflow-3.1.2": ("test_keep_final", "test_remediation_dispatch", "test_fencing"),
    "airflow-remediation": ("test_remediation_api", "test_api_backend_mutants"),
}
_GROUP_OF = {f"tests/integration/{m}.py": group for group, modules in WORKER_GROUPS.items() for m in modules}

# Modules whose tests hold the product to a real-time bound (a lease, a call timeout, a shutdown
# deadline, a digest window) or kill processes on a schedule: beside other workers on a busy machine
# they can miss that bound for want of a CPU, which says nothing about the product. They carry the
# ``timing`` mark; scripts/test.sh runs them after the parallel part, one at a time, on a quiet machine.
TIMING_MODULES = frozenset(
    f"tests/integration/{m}.py"
    for m in (
        "test_fencing",
        "test_alerts",
        "test_sigterm",
        "test_slow_peers",
        "test_pgbouncer",
        "test_rules_scraped",
        "test_storm",
    )
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.split("::", 1)[0] in TIMING_MODULES:
            item.add_marker(pytest.mark.timing)


# The longest modules (and groups), longest first, start before everything else: xdist orders the work by
# test count, which put test_e2e.py (one test, ~200 s) last and test_release.py (five tests, a ~280 s
# image build) near the end, where a worker starting them alone sets the wall time. Estimated from
# the --durations table of a CI run (scripts/test.sh prints it); the rest keeps xdist's order.
LONGEST_FIRST = (
    "tests/guard/test_guard.py",
    "replica",  # also early: its base backup copies the whole test server, which grows all run long
    "tests/deploy/test_release.py",
    "tests/e2e/test_e2e.py",
    "tests/integration/test_api_source.py",
    "tests/integration/test_api_trigger_event.py",
    "airflow-3.1.2",
    "tests/deploy/test_deploy_helm.py",
    "tests/integration/test_secrets.py",
    "tests/integration/test_pgbouncer.py",
    "tests/deploy/test_deploy_render_checks.py",
    "tests/integration/test_stranded_repair_airflow.py",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    rank = {scope: i for i, scope in enumerate(LONGEST_FIRST)}

    class ModuleGroups(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return _GROUP_OF.get(module, module)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the first call sees the whole work queue, before anything is sent
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: rank.get(unit[0], len(rank)))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return ModuleGroups(config, log)


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
