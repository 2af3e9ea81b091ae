"""``dupguard guard print-local-settings``: the guard's source, for Airflow's ``airflow_local_settings.py``.

The text is ``detector/guard/policy.py`` exactly, read from the installed package (so the image and
a source checkout print the same thing). It is valid as a whole ``airflow_local_settings.py`` and
as a block appended to an existing one (docs/how-to/guard.md says how to chain an existing
``task_instance_mutation_hook``). It never contains ``{{``: the official chart passes
``airflowLocalSettings`` through ``tpl``.
"""

from __future__ import annotations

from importlib.resources import files

POLICY_RESOURCE = ("detector.guard", "policy.py")


def print_local_settings() -> str:
    """The snippet for the official chart's ``airflowLocalSettings`` value (or airflow_local_settings.py)."""
    package, name = POLICY_RESOURCE
    text = files(package).joinpath(name).read_text(encoding="utf-8")
    if "{{" in text:  # pragma: no cover - guarded by tests/guard; the chart would mangle it
        raise RuntimeError("the guard source contains '{{', which the Airflow chart's tpl would render")
    return text
