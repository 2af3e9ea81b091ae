"""Merge dupguard's overlays into the values you already give the official Airflow chart, losing nothing.

    helm get values airflow -n airflow -o yaml > mine.yaml
    python deploy/helm/merge_values.py mine.yaml dupguard-airflow-values.yaml \\
        deploy/helm/values-airflow-guard.yaml > merged.yaml
    helm upgrade airflow apache-airflow/airflow -n airflow -f merged.yaml

(dupguard-airflow-values.yaml: the sidecar's values the companion chart renders, docs/how-to/deploy-kubernetes.md 4a.)
Why: Helm merges maps but *replaces* lists and strings, so ``-f dupguard-airflow-values.yaml`` on top of
your values drops your own ``scheduler.extraContainers`` / ``extraVolumes`` / ``extraInitContainers``,
and ``-f values-airflow-guard.yaml`` drops your own ``airflowLocalSettings``, without a word. This
script merges instead:

* maps: deep merge, the overlay's scalar wins only for keys it sets;
* lists of named objects (containers, volumes): your entries first, then the overlay's; an entry of
  yours with the same ``name`` as an overlay entry is replaced by it, so re-running after an upgrade of
  dupguard updates the dupguard container instead of adding a second one;
* ``airflowLocalSettings``: the dupguard guard snippet first (it starts with ``from __future__``, which
  Python accepts only at the top), then your code, with an earlier copy of the snippet removed.

An overlay may also be the dupguard chart's ConfigMap ``<fullname>-airflow-values`` as ``helm template
... --show-only templates/airflow-values.yaml`` prints it (GitOps, no cluster access): its ``values.yaml``
is the overlay.

It refuses, with a one-line error and exit 2, what it cannot merge safely: your code defining its own
``task_instance_mutation_hook`` without calling ``_dupguard_task_instance_mutation_hook`` (the later
definition wins, so the guard would be silently off), your code's own ``from __future__`` imports, or a
list of unnamed entries. Needs PyYAML (in dupguard's environment).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

SNIPPET_END = "_dupguard_enable_on_creation()\n"
SNIPPET_START = '"""dupguard in-scheduler guard'
SEPARATOR = "# --- your own airflow_local_settings ---\n"


class MergeError(Exception):
    pass


def _without_snippet(code: str) -> str:
    start = code.find(SNIPPET_START)
    if start < 0:
        return code
    end = code.find(SNIPPET_END, start)
    if end < 0:
        raise MergeError("airflowLocalSettings holds a truncated dupguard snippet: remove it by hand first")
    rest = code[end + len(SNIPPET_END) :].lstrip("\n").removeprefix(SEPARATOR)
    return (code[:start] + rest).strip("\n")


def merge_local_settings(mine: str | None, snippet: str) -> str:
    """The guard snippet, then the user's own airflow_local_settings code."""
    own = _without_snippet(mine or "").strip("\n")
    if not own:
        return snippet
    if re.search(r"^from __future__ import", own, re.MULTILINE):
        raise MergeError(
            "your airflowLocalSettings has `from __future__` imports, which Python accepts only at the top: "
            "remove them (the dupguard snippet already starts with `from __future__ import annotations`)"
        )
    if re.search(r"^def task_instance_mutation_hook\b", own, re.MULTILINE) and (
        "_dupguard_task_instance_mutation_hook(" not in own
    ):
        raise MergeError(
            "your airflowLocalSettings defines task_instance_mutation_hook, which would replace dupguard's: "
            "call _dupguard_task_instance_mutation_hook(task_instance) from it, last (docs/how-to/guard.md)"
        )
    return snippet.rstrip("\n") + "\n\n\n" + SEPARATOR + own + "\n"


def _merge_named(mine: list[Any], overlay: list[Any], where: str) -> list[Any]:
    entries = [*mine, *overlay]
    if not all(isinstance(e, dict) and e.get("name") for e in entries):
        raise MergeError(f"{where}: every list entry needs a name to be merged")
    names = {e["name"] for e in overlay}
    return [e for e in mine if e["name"] not in names] + overlay


def merge(mine: Any, overlay: Any, where: str = "") -> Any:
    """``overlay`` merged into ``mine`` (neither is modified)."""
    if isinstance(mine, dict) and isinstance(overlay, dict):
        out = dict(mine)
        for key, value in overlay.items():
            path = f"{where}.{key}" if where else str(key)
            if path == "airflowLocalSettings" and isinstance(value, str):
                out[key] = merge_local_settings(mine.get(key), value)
            elif key in mine:
                out[key] = merge(mine[key], value, path)
            else:
                out[key] = value
        return out
    if isinstance(mine, list) and isinstance(overlay, list):
        return _merge_named(mine, overlay, where)
    return overlay


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (airflow_local_settings code) as readable `|` blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def load_overlay(text: str) -> Any:
    """An overlay file's values: the file itself, or the values.yaml of the dupguard chart's ConfigMap."""
    values = yaml.safe_load(text) or {}
    if isinstance(values, dict) and values.get("kind") == "ConfigMap" and "values.yaml" in values.get("data", {}):
        return yaml.safe_load(values["data"]["values.yaml"]) or {}
    return values


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: merge_values.py YOUR_VALUES.yaml OVERLAY.yaml [OVERLAY.yaml ...]", file=sys.stderr)
        return 2
    try:
        merged: Any = yaml.safe_load(Path(argv[0]).read_text()) or {}
        for name in argv[1:]:
            merged = merge(merged, load_overlay(Path(name).read_text()))
    except (OSError, yaml.YAMLError, MergeError) as exc:
        print(f"merge_values.py: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.dump(merged, Dumper=_Dumper, sort_keys=False, width=100))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
