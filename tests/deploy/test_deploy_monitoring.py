"""The monitoring kit: alert rules (promtool), Prometheus Operator and Grafana objects of the companion
chart, and the dashboard checked against the /metrics of a real ``dupguard run``.

promtool comes from Debian's ``prometheus`` package (scripts/promtool.sh installs it; scripts/test.sh
runs that first). A missing promtool fails these tests; it never skips them. The ServiceMonitor,
PodMonitor and PrometheusRule are custom resources whose schemas kubernetes-validate does not bundle:
their shape is checked against the objects they select instead, and the rules inside with promtool.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import CHART, DEPLOY, REPO, load_documents, require_module, validate_objects

RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"
RULES_TEST = Path(__file__).parent / "promtool" / "rules-test.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
RUNBOOK_PARTS = ("What it means", "How to check", "What to do", "How to silence")
MONITORING_ON = {
    "monitoring": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "podMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboard": {"enabled": True, "folder": "Airflow"},
    }
}
# Grafana's built-in variables, replaced by a duration so that promtool can parse the expression.
GRAFANA_VARIABLES = re.compile(r"\$__(rate_interval|interval|range)|\$\{__(rate_interval|interval|range)\}")
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:  # pragma: no cover - only on a machine set up without scripts/promtool.sh
        pytest.fail("promtool not found: install Debian's `prometheus` package (scripts/promtool.sh does)")
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> str:
    result = subprocess.run([promtool(), *args], capture_output=True, text=True, check=False, cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def render_companion(values: dict[str, Any], release: str = "dupguard") -> list[dict[str, Any]]:
    rendered = require_module("helm_python").Chart.load(CHART).render(values, name=release, namespace="airflow")
    return [d for path, text in rendered.items() if not path.endswith("NOTES.txt") for d in load_documents(text)]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [d for d in docs if d["kind"] == kind]
    return obj


def dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            out.append((f"variable {variable['name']}", re.sub(r"^label_values\((.+), \w+\)$", r"\1", query)))
    return out


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords or labels."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\boffset\s+\S+", "", text)  # offsets
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if match.group() not in PROMQL_WORDS and not rest.startswith("("):
            names.add(match.group())
    return names


def runbook_sections() -> dict[str, str]:
    """docs/runbooks.md: anchor (an ``<a id>`` before each ``## <alert>`` heading) -> its section."""
    text = RUNBOOKS.read_text()
    parts = re.split(r'^<a id="(\w+)"></a>\n', text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def released_runbooks(version: str | None = None) -> str:
    """docs/runbooks.md as released with ``version`` (default: the package's, pyproject.toml): what
    on-call can click, unlike a path relative to nothing."""
    version = version or tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return f"https://github.com/airflow-dupguard/airflow-dupguard/blob/v{version}/docs/runbooks.md"


def test_alert_rules_pass_promtool_check_and_have_runbooks() -> None:
    """promtool check rules accepts the rule file; every alert's runbook_url names its own section of
    docs/runbooks.md (as the kube-prometheus mixins do), and that section says what the alert means,
    how to check, what to do and how to silence it."""
    run_promtool("check", "rules", str(RULES))
    sections = runbook_sections()
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            alert = rule["alert"]
            assert rule["annotations"].get("runbook_url") == f"{released_runbooks()}#{alert}", alert
            assert rule["labels"]["severity"] in {"critical", "warning"}
            section = sections.get(alert, "")
            assert section.startswith(f"## {alert}\n"), f"{alert}: no section in docs/runbooks.md"
            for part in RUNBOOK_PARTS:
                assert f"**{part}.**" in section, f"{alert}: runbook section lacks {part!r}"
    # The Alertmanager sink's alerts (DupguardDuplicateRun, DupguardSplitPartition) have theirs too.
    assert {"DupguardDuplicateRun", "DupguardSplitPartition"} <= sections.keys()


def test_dashboard_filters_every_query_by_cluster_and_namespace() -> None:
    """The dashboard's cluster and namespace variables (namespace values within the chosen clusters)
    reach every panel query: each metric selector carries both matchers, so no panel mixes clusters."""
    variables = {v["name"]: v for v in json.loads(DASHBOARD.read_text())["templating"]["list"]}
    assert variables["cluster"]["query"]["query"] == "label_values(dupguard_build_info, cluster)"
    namespace_query = 'label_values(dupguard_build_info{cluster=~"$cluster"}, namespace)'
    assert variables["namespace"]["query"]["query"] == namespace_query
    for name in ("cluster", "namespace"):  # a Prometheus without cluster labels: All matches the empty value
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    matchers = 'cluster=~"$cluster", namespace=~"$namespace"}'  # after a panel's own (kind="..."), if any
    for title, expr in dashboard_expressions():
        if title.startswith("variable "):
            continue
        for name in metric_names(expr):
            uses = re.findall(rf"\b{name}\b(\{{[^}}]*\}})?", expr)
            own = r'\{(\w+="[^"]*", )?' + re.escape(matchers)
            ok = uses and all(re.fullmatch(own, u) for u in uses)
            assert ok, f"panel {title!r}: {name} not filtered: {expr}"


def test_alert_rules_unit_tests(tmp_path: Path) -> None:
    """promtool test rules: each alert fires on the series that should page and stays quiet otherwise."""
    out = run_promtool("test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert "SUCCESS" in out
    tested = {
        t["alertname"] for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for t in test["alert_rule_test"]
    }
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert tested == alerts, f"alerts without a unit test: {alerts - tested}"


def test_companion_chart_monitoring_objects_standalone(tmp_path: Path) -> None:
    """Standalone: the ServiceMonitor selects the Service by its labels and port name, the PodMonitor the
    Deployment's pods and container port, the PrometheusRule holds exactly the rule file (promtool
    checks it as rendered), and the dashboard ConfigMap carries the Grafana sidecar's label."""
    docs = render_companion({"mode": "standalone", **MONITORING_ON})
    service, deployment = one(docs, "Service"), one(docs, "Deployment")
    monitor = one(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    pod_monitor = one(docs, "PodMonitor")
    pod = deployment["spec"]["template"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c["ports"]}
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    rule = one(docs, "PrometheusRule")
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert app_version == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert rule["spec"] == yaml.safe_load(
        RULES.read_text().replace(released_runbooks(), released_runbooks(app_version))
    )
    rendered_rules = tmp_path / "rendered-rules.yaml"
    rendered_rules.write_text(yaml.safe_dump(rule["spec"]))
    run_promtool("check", "rules", str(rendered_rules))
    (dashboard,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Airflow"}
    assert json.loads(dashboard["data"]["dupguard.json"]) == json.loads(DASHBOARD.read_text())
    validate_objects([dashboard, service, deployment], "monitoring (core objects)")


def test_companion_chart_rules_link_the_runbook_base_and_follow_the_unstopped_severity() -> None:
    """monitoring.prometheusRule.runbookBaseUrl moves every runbook_url (its anchor kept), and
    config.DUPGUARD_UNSTOPPED_SEVERITY lowers the rules of a duplicate that will run or ran, as it does
    the alerts dupguard pushes; the other rules keep their severity."""
    base = "https://wiki.example/dupguard/runbooks.md"
    values = {
        "mode": "standalone",
        "config": {"DUPGUARD_UNSTOPPED_SEVERITY": "warning"},
        "monitoring": {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}},
    }
    rendered = {
        r["alert"]: r for g in one(render_companion(values), "PrometheusRule")["spec"]["groups"] for r in g["rules"]
    }
    original = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert rendered.keys() == original.keys()
    unstopped = {a for a, r in original.items() if r["labels"].get("harm") == "unstopped"}
    assert unstopped == {
        "DupguardDuplicateNotStopped",
        "DupguardRemediationFailing",
        "DupguardRemediationUnconfirmed",
        "DupguardDuplicateCaughtAfterStart",
    }
    for alert, rule in rendered.items():
        assert rule["annotations"]["runbook_url"] == f"{base}#{alert}"
        expected = "warning" if alert in unstopped else original[alert]["labels"]["severity"]
        assert rule["labels"]["severity"] == expected, alert
        assert original[alert]["labels"]["severity"] == "critical" or alert not in unstopped


def test_companion_chart_pod_monitor_sidecar_selects_the_overlay_port() -> None:
    """Sidecar: the PodMonitor selects the scheduler pods and the overlay container's named port; the
    ServiceMonitor (no Service in sidecar mode) is not rendered; all toggles off render none of them."""
    docs = render_companion({"mode": "sidecar", **MONITORING_ON})
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    pod_monitor = one(docs, "PodMonitor")
    overlay = yaml.safe_load((DEPLOY / "helm" / "values-airflow-sidecar.yaml").read_text())["scheduler"]
    (container,) = overlay["extraContainers"]
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == container["ports"][0]["name"]
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {
        "tier": "airflow",
        "component": "scheduler",
        "release": "airflow",
    }
    kinds = {d["kind"] for d in render_companion({"mode": "standalone"})}
    assert not kinds & {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def test_metric_names_extraction() -> None:
    """The helper that reads metric names out of PromQL (so the dashboard test can fail)."""
    expr = 'histogram_quantile(0.99, sum by (le) (rate(a_bucket{x="y"}[5m]))) / on (pod) b and c offset 5m'
    assert metric_names(expr) == {"a_bucket", "b", "c"}
    assert metric_names('time() - max by (pod) (g{namespace=~"$namespace"})') == {"g"}


@pytest.mark.integration
def test_dashboard_and_metrics_hygiene_against_a_running_daemon(pg_templates: Any, tmp_path: Path) -> None:
    """Scrape a real `dupguard run` on the 3.1.2 schema: every dashboard expression parses (promtool)
    and names only metrics it exports; process_* metrics; labelled counters start at 0; no _created
    series; dupguard_build_info carries dupguard's version and an Airflow version, not a range; the
    health endpoints answer HEAD."""
    from prometheus_client.parser import text_string_to_metric_families

    from detector import __version__
    from tests.daemon_harness import wait_for
    from tests.integration.test_run_process import free_port, metric, spawn
    from tests.writer import AirflowWriter

    port = free_port()
    url = pg_templates.clone("3.1.2")
    proc = spawn(
        url,
        tmp_path / "run.log",
        DUPGUARD_HTTP_PORT=str(port),
        DUPGUARD_REMEDIATION="fail",
        DUPGUARD_REMEDIATION_BACKEND="db",
        DUPGUARD_WEBHOOK_URL="http://127.0.0.1:9/hook",
    )
    try:
        wait_for(lambda: metric(port, "dupguard_leader") == 1.0, what="leadership")
        before = scrape(port)
        # One duplicate, so that the per-DAG counter has a series and the histograms observations.
        writer = AirflowWriter(url)
        writer.duplicate_pair("consumer")
        writer.close()
        wait_for(
            lambda: 'dupguard_duplicate_groups_by_dag_total{dag_id="consumer"} 1.0' in scrape(port), what="detection"
        )
        body = scrape(port)
        for path in ("/livez", "/readyz", "/metrics"):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="HEAD")
            with urllib.request.urlopen(request, timeout=5) as resp:  # noqa: S310
                assert resp.status == 200 and resp.read() == b"", path
    finally:
        proc.terminate()
        proc.wait(10)

    initial = [s for family in text_string_to_metric_families(before) for s in family.samples]
    samples = [s for family in text_string_to_metric_families(body) for s in family.samples]
    exported = {s.name for s in samples}
    assert not [n for n in exported if n.endswith("_created")], "no _created series"
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_start_time_seconds"} <= exported

    def zero(name: str, **labels: str) -> None:
        found = [s for s in initial if s.name == name and labels.items() <= s.labels.items()]
        assert found and all(s.value == 0 for s in found), f"{name}{labels} must exist at 0: {found}"

    for kind in ("asset", "partitioned"):
        for confidence in ("confirmed", "suspected"):
            zero("dupguard_duplicate_groups_detected_total", kind=kind, confidence=confidence)
    for result in ("done", "failed", "too_late", "already"):
        zero("dupguard_remediations_total", mode="fail", backend="db", result=result)
    for outcome in ("sent", "failed", "retried", "deduplicated"):
        zero("dupguard_alerts_total", channel="webhook", outcome=outcome)
    (build,) = [s for s in samples if s.name == "dupguard_build_info"]
    assert build.labels["version"] == __version__ and re.fullmatch(r"\d+\.\d+\.\d+.*", __version__)
    assert build.labels["airflow_version"] == "3.1", build.labels
    assert [s.value for s in samples if s.name == "dupguard_config_missing"] == [0.0]

    rules: list[dict[str, str]] = []
    for n, (title, expr) in enumerate(dashboard_expressions()):
        unknown = metric_names(expr) - exported
        assert not unknown, f"dashboard panel {title!r} names metrics dupguard does not export: {unknown}"
        rules.append({"record": f"dashboard:expr_{n}", "expr": GRAFANA_VARIABLES.sub("5m", expr)})
    as_rules = tmp_path / "dashboard-rules.yaml"
    as_rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool("check", "rules", str(as_rules))


@pytest.mark.integration
@pytest.mark.parametrize("source", [None, "configmap/dupguard-old"])
def test_sidecar_without_its_configuration_says_so(pg_templates: Any, tmp_path: Path, source: str | None) -> None:
    """A sidecar whose expected ConfigMap is absent (or another one) logs config_missing at start and
    exports dupguard_config_missing 1; it still runs (on defaults)."""
    from tests.daemon_harness import wait_for
    from tests.integration.test_run_process import events, free_port, metric, spawn

    port = free_port()
    log = tmp_path / "run.log"
    extra = {"DUPGUARD_CONFIG_SOURCE": source} if source else {}
    proc = spawn(
        pg_templates.clone("3.1.2"),
        log,
        DUPGUARD_HTTP_PORT=str(port),
        DUPGUARD_CONFIG_EXPECTED="configmap/dupguard",
        **extra,
    )
    try:
        wait_for(lambda: metric(port, "dupguard_leader") == 1.0, what="leadership")
        assert metric(port, "dupguard_config_missing") == 1.0
    finally:
        proc.terminate()
        proc.wait(10)
    (warning,) = [e for e in events(log) if e["event"] == "config_missing"]
    assert warning["level"] == "warning" and warning["expected"] == "configmap/dupguard"
    assert warning["loaded"] == source
