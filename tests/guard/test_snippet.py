"""The guard's two deliverables that need no Airflow: the printed snippet and the package."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

import pytest

from detector.app.guard_cli import print_local_settings
from tests.guard.support import POLICY, build_guard_site


@pytest.fixture(scope="module")
def guard_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_guard_site(tmp_path_factory.mktemp("guard-package"))


def test_print_local_settings_is_the_policy_source_and_imports_only_stdlib_and_airflow() -> None:
    """`dupguard guard print-local-settings` prints detector/guard/policy.py: valid Python, a
    module-level task_instance_mutation_hook, no `{{` (the chart's tpl), and imports of the standard
    library, Airflow and Airflow's own ORM library (SQLAlchemy) only."""
    text = print_local_settings()
    assert text == POLICY.read_text()
    assert "{{" not in text
    tree = ast.parse(text)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    hook = functions["task_instance_mutation_hook"]
    assert [a.arg for a in hook.args.args] == ["task_instance", "dag_run"] and len(hook.args.defaults) == 1
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == {"airflow", "sqlalchemy"}, imported


def test_print_local_settings_runs_without_airflow() -> None:
    """The snippet imports cleanly where Airflow is absent (the hook marker falls back to a no-op)."""
    namespace: dict[str, Any] = {"__name__": "probe"}
    exec(compile(print_local_settings(), "airflow_local_settings.py", "exec"), namespace)  # noqa: S102
    assert callable(namespace["task_instance_mutation_hook"])


def test_guard_package_has_no_dependencies_and_the_entry_point(guard_site: Path) -> None:
    """The wheel declares no dependency (it must not pull dupguard's daemon stack into Airflow) and
    exposes dupguard_guard.policy under airflow.policy; its policy.py is detector/guard/policy.py."""
    (dist_info,) = guard_site.glob("airflow_dupguard_guard-*.dist-info")
    metadata = (dist_info / "METADATA").read_text()
    assert "Requires-Dist" not in metadata
    entry_points = (dist_info / "entry_points.txt").read_text()
    assert "[airflow.policy]" in entry_points and "dupguard = dupguard_guard.policy" in entry_points
    assert (guard_site / "dupguard_guard" / "policy.py").read_text() == POLICY.read_text()


def test_guard_note_starts_with_what_the_daemon_recognises() -> None:
    """The daemon reports a duplicate as "prevented" by the guard's note (GUARD_NOTE_PREFIX), so the
    note the guard writes must start with it."""
    from detector.core.model import GUARD_NOTE_PREFIX

    namespace: dict[str, Any] = {"__name__": "probe"}
    exec(compile(print_local_settings(), "airflow_local_settings.py", "exec"), namespace)  # noqa: S102
    assert namespace["_DUPGUARD_NOTE"].format(kept="k").startswith(GUARD_NOTE_PREFIX)


USER_SETTINGS = """from __future__ import annotations

__all__ = ["task_instance_mutation_hook", "pod_mutation_hook"]


def pod_mutation_hook(pod):
    pod.metadata.labels["team"] = "data"


def task_instance_mutation_hook(task_instance):
    task_instance.queue = "fast" if task_instance.task_id.startswith("q_") else task_instance.queue
"""


def test_merge_recipe_of_the_docs_gives_a_file_whose_hook_calls_dupguard() -> None:
    """docs/how-to/guard.md's merge recipe: the snippet first, then the user's settings without their
    `from __future__` line, their hook ending with dupguard's body. The file compiles, keeps the
    user's names, and its hook (the user's) calls dupguard's."""
    user = USER_SETTINGS.replace("from __future__ import annotations\n", "")
    user = user.replace(
        "task_instance.queue\n", "task_instance.queue\n    _dupguard_task_instance_mutation_hook(task_instance)\n"
    )
    namespace: dict[str, Any] = {"__name__": "probe"}
    exec(compile(print_local_settings() + "\n\n" + user, "airflow_local_settings.py", "exec"), namespace)  # noqa: S102
    hook = namespace["task_instance_mutation_hook"]
    assert hook.__module__ == "probe" and "_dupguard_task_instance_mutation_hook" in hook.__code__.co_names
    assert callable(namespace["pod_mutation_hook"]) and "task_instance_mutation_hook" in namespace["__all__"]
    with pytest.raises(SyntaxError):  # why step 2 removes the user's own __future__ line
        compile(print_local_settings() + "\n\n" + USER_SETTINGS, "airflow_local_settings.py", "exec")
