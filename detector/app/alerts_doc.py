"""docs/reference/alerts.md: every alert on-call can receive, generated from the code that raises it; the
test compares them, ``python -m detector.app.alerts_doc`` prints the block.

- A duplicate group's alert (``oncall.DUPLICATE_ALERT``): its severity per remediation status, from
  ``oncall.guidance`` run on the demo's first group.
- A periodic check's alerts: every ``Observation(...)`` the check packages build, read with ``ast``: its
  kind, its alertname (``alertname=``, else ``notice.alertname_of(kind)``) and its ``severity=`` as the
  code says it (a module's table of severities is shown resolved).
- The channels: the registered ones (``channels.CHANNELS``) get every alert; the log always.
- The Prometheus rules the chart installs (deploy/helm/dupguard/files/prometheus-rules.yaml).
Each alert's runbook is its name's section of docs/runbooks.md.
"""

from __future__ import annotations

import ast
import importlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from detector.actions.alerts import channels
from detector.actions.alerts.notice import alertname_of
from detector.actions.alerts.oncall import DUPLICATE_ALERT, guidance
from detector.app import demo

BEGIN = "<!-- alerts:begin -->"
END = "<!-- alerts:end -->"
ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "helm" / "dupguard" / "files" / "prometheus-rules.yaml"
RUNBOOKS = "../runbooks.md"
AM_SEVERITY = {"error": "critical", "warning": "warning", "info": "info"}  # as notice.py maps a check's
# (status, mode) pairs ``oncall.guidance`` decides without remediation results
STATUSES = (
    ("pending", "fail"),
    ("pending", "dry-run"),
    ("pending", "off"),
    ("dry_run", "dry-run"),
    ("failed", "fail"),
    ("unknown", "fail"),
    ("too_late", "fail"),
    ("caught_after_start", "fail"),
)


@dataclass(frozen=True)
class CheckAlert:
    alertname: str
    kind: str
    module: str
    when: str  # the condition that picks this alertname, or "" for the kind's own
    severity: str  # the code's expression, or a resolved table


def _value(module: Any, node: ast.expr) -> Any:
    """A constant, or a module-level name's value in the imported module (None when it is neither)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return getattr(module, node.id, None)
    return None


def _severity(module: Any, node: ast.expr, source: str) -> str:
    if isinstance(node, ast.Subscript) and isinstance(table := _value(module, node.value), dict):
        by_level: dict[str, list[str]] = {}
        for key, level in table.items():
            by_level.setdefault(AM_SEVERITY[level], []).append(f"`{key}`")
        return "; ".join(f"{level} for {', '.join(keys)}" for level, keys in by_level.items())
    text = ast.get_source_segment(source, node) or ""
    for word, level in AM_SEVERITY.items():  # the check's words, as Alertmanager and the rules say them
        text = text.replace(f'"{word}"', f'"{level}"')
    return f"`{text}`"


def check_alerts() -> Iterator[CheckAlert]:
    for path in sorted((ROOT / "detector" / "checks").glob("*/*.py")):
        source = path.read_text()
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module = importlib.import_module(name)
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Observation"):
                continue
            args = {k.arg: k.value for k in node.keywords if k.arg}
            kind = str(_value(module, args["kind"]))
            severity = _severity(module, args["severity"], source)
            where = str(path.relative_to(ROOT))
            chosen = args.get("alertname")
            own = alertname_of(kind)
            if chosen is None:
                yield CheckAlert(own, kind, where, "", severity)
                continue
            when = f"`alertname={ast.get_source_segment(source, chosen)}`"
            names = {_value(module, n) for n in ast.walk(chosen) if isinstance(n, ast.Name | ast.Constant)}
            for alertname in sorted(str(n) if n else own for n in names):
                yield CheckAlert(alertname, kind, where, when, severity)


def duplicate_rows() -> list[str]:
    """What ``oncall.guidance`` says of the demo's first group in each status it decides alone."""
    with tempfile.TemporaryDirectory(prefix="dupguard-alerts-") as folder:
        finding = demo.incident_report(Path(folder) / "airflow.db").findings[0]
    rows = ["| status | remediation mode | severity | headline |", "| --- | --- | --- | --- |"]
    for status, mode in STATUSES:
        g = guidance(finding, mode, status, (), None)
        rows.append(f"| `{status}` | `{mode}` | {g.severity} | {g.headline} |")
    return rows


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def rule_rows() -> list[str]:
    rows = ["| alert | severity | for | expression | what it means |", "| --- | --- | --- | --- | --- |"]
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            labels = rule.get("labels", {})
            severity = labels.get("severity", "")
            if labels.get("harm") == "unstopped":
                severity += " (`DUPGUARD_UNSTOPPED_SEVERITY`)"
            name = rule["alert"]
            rows.append(
                f"| [{name}]({RUNBOOKS}#{name.lower()}) | {severity} | {rule.get('for', '—')} | "
                f"`{_cell(rule['expr'])}` | {_cell(rule['annotations'].get('description', ''))} |"
            )
    return rows


def page() -> str:
    names = [make.__module__.rpartition(".")[2] for make in channels.CHANNELS]
    parts = [
        "## Where alerts go",
        "",
        "Every alert below goes to every configured channel ("
        + ", ".join(f"`{n}`" for n in names)
        + "), once per channel, and to the log. A duplicate group's alerts can be gathered into a storm digest; "
        "a periodic check's never are.",
        "",
        f"## [{DUPLICATE_ALERT}]({RUNBOOKS}#{DUPLICATE_ALERT.lower()}): a duplicate run group",
        "",
        "Its severity follows the group's remediation status (`detector/actions/alerts/oncall.py`, `guidance`); "
        "`critical` is `DUPGUARD_UNSTOPPED_SEVERITY`'s default. `remediated` (stopped in time) is `info`; "
        "`no_action` depends on why the planner left the duplicate alone.",
        "",
        *duplicate_rows(),
        "",
        "## The periodic checks' alerts",
        "",
        "Severity as the code picks it, in Alertmanager's and Slack's words (the webhook's `dupguard.alert/v1` "
        "says `error` for `critical`).",
        "",
        "| alert | kind | when | severity | built in |",
        "| --- | --- | --- | --- | --- |",
    ]
    for a in check_alerts():
        link = f"[{a.alertname}]({RUNBOOKS}#{a.alertname.lower()})"
        parts.append(f"| {link} | `{a.kind}` | {_cell(a.when) or '—'} | {_cell(a.severity)} | {a.module} |")
    parts += ["", "## Prometheus rules (the chart's PrometheusRule)", "", *rule_rows()]
    return "\n".join(parts)


def block() -> str:
    return f"{BEGIN}\n{page()}\n{END}"


if __name__ == "__main__":
    print(block())
