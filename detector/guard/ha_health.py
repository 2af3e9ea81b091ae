"""The "HA health" pages of dupguard's Airflow UI plugin (``ui_plugin.py``), as HTML: pure, documents in.

The findings are ``dupguard scan --format json``'s document (``detector/app/render.py``, format 1) and the
exposure summary ``dupguard doctor --format json``'s: the same rules as ``scan``, never a second copy of
them. This module only chooses what one user may see (``readable``: the DAGs Airflow's auth manager lets
them read) and lays it out. Standard library only: it runs inside Airflow's API server, as ``policy.py``.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

# The fixed beginnings of the notes dupguard and its guard write on a run they stop
# (detector/core/decisions.py, detector/core/model.py; not imported: this module runs without dupguard's
# dependencies, and importing policy.py would arm the guard in the API server).
# tests/unit/test_ui_plugin.py keeps them equal.
REMEDIATION_NOTE_PREFIX = "dupguard stopped this run as a duplicate of "
GUARD_NOTE_PREFIX = "dupguard guard skipped this run as a duplicate of "

GROUPS = "duplicate_group"  # the kind under which scan's ``groups`` are listed on the nav page
STYLE = """
body{font-family:system-ui,sans-serif;font-size:14px;margin:16px;color:#1a202c}
h1{font-size:20px}h2{font-size:16px;margin-top:20px}table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #cbd5e0;padding:4px 8px;text-align:left;vertical-align:top}th{background:#edf2f7}
.kind{font-family:monospace}.bad{color:#c53030;font-weight:600}.ok{color:#2f855a;font-weight:600}
.advice{color:#4a5568}.card{border:1px solid #cbd5e0;border-radius:6px;padding:8px 12px;margin:8px 0}
form{margin:8px 0}select{margin-right:8px}
"""


def readable(doc: Mapping[str, Any], allowed: set[str] | None) -> dict[str, Any]:
    """``doc`` with only what a user who may read ``allowed`` DAGs (None: every DAG) may see.

    A periodic check's finding that names several DAGs is shown only to a user who may read all of them.
    """
    if allowed is None:
        return dict(doc)
    groups = [g for g in doc.get("groups") or [] if g["dag_id"] in allowed]
    checks = {
        kind: [o for o in found if set(o.get("dag_ids") or []) <= allowed]
        for kind, found in (doc.get("checks") or {}).items()
    }
    return dict(doc) | {"groups": groups, "checks": checks}


def note_agrees(run: Mapping[str, Any]) -> bool:
    """Whether Airflow's record agrees that the run was stopped (detector/core/decisions.py ``note_agrees``,
    from the scan document's fields): it failed, or it ended with tasks of which none started (skipped)."""
    return run.get("state") == "failed" or (
        run.get("state") == "success" and bool(run.get("tasks_total")) and not run.get("tasks_started")
    )


def what_dupguard_did(run: Mapping[str, Any], note: str | None) -> str:
    """One duplicate run's fate, from the note dupguard (or its guard) writes on a run it stops."""
    ours = note is not None and note.startswith((GUARD_NOTE_PREFIX, REMEDIATION_NOTE_PREFIX))
    if ours and not note_agrees(run):
        return (
            "its note says dupguard stopped it, but Airflow shows it was not stopped (the note is disputed)"
        )
    if note and note.startswith(GUARD_NOTE_PREFIX):
        return "prevented by the in-scheduler guard (its tasks were skipped before they started)"
    if note and note.startswith(REMEDIATION_NOTE_PREFIX):
        if run.get("tasks_started"):
            return "stopped by dupguard, too late: some of its tasks had started"
        return "stopped by dupguard before its tasks started"
    if run.get("tasks_started"):
        return "not stopped: its tasks ran (dupguard alerts only, runs as a dry run, or came too late)"
    return "not stopped yet (dupguard alerts only, runs as a dry run, or has not polled since)"


def groups_of_run(doc: Mapping[str, Any], dag_id: str, run_id: str) -> list[dict[str, Any]]:
    return [
        g
        for g in doc.get("groups") or []
        if g["dag_id"] == dag_id and any(r["run_id"] == run_id for r in g["runs"])
    ]


def run_ids_of(groups: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted({r["run_id"] for g in groups for r in g["runs"]})


class Links:
    """Addresses of a run or DAG: in Airflow's UI (under its base path, ``[api] base_url``'s path) and in
    this plugin's own pages (``prefix``), which a link opens when it cannot move Airflow's page."""

    def __init__(self, base: str, prefix: str = "/dupguard", url_route: str = "") -> None:
        self.base = base.rstrip("/")
        self.prefix = self.base + prefix
        self.url_route = url_route  # the run tab's route, so a run's link opens its HA health tab

    def run(self, dag_id: str, run_id: str, label: object) -> str:
        dag, run = quote(dag_id, safe=""), quote(run_id, safe="")
        tab = f"/plugin/{self.url_route}" if self.url_route else ""
        return _a(f"{self.prefix}/runs/{dag}/{run}", f"{self.base}/dags/{dag}/runs/{run}{tab}", label)

    def dag(self, dag_id: str) -> str:
        dag = quote(dag_id, safe="")
        return _a(f"{self.prefix}/health?dag={dag}", f"{self.base}/dags/{dag}", dag_id)


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value))


def _a(href: str, top: str, label: object) -> str:
    """A link that moves Airflow's page to ``top`` (FOLLOW below), else opens ``href`` in the frame."""
    return f'<a href="{_e(href)}" data-top="{_e(top)}">{_e(label)}</a>'


# Airflow shows these pages in an iframe sandboxed without allow-top-navigation, so a plain link cannot
# leave the frame; the frame is same-origin (allow-same-origin), so it tells Airflow's router to go there.
FOLLOW = """
document.addEventListener("click", function (e) {
  var a = e.target.closest("a[data-top]");
  if (!a || window.top === window) return;
  try {
    window.top.history.pushState(null, "", a.dataset.top);
    window.top.dispatchEvent(new PopStateEvent("popstate"));
    e.preventDefault();
  } catch (err) { /* not the same origin: the link opens in the frame */ }
});
"""


def _page(title: str, body: Sequence[str], head: str = "") -> str:
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{head}<title>{_e(title)}</title>'
        f"<style>{STYLE}</style><script>{FOLLOW}</script></head><body>{''.join(body)}</body></html>"
    )


def render_pending(title: str, every: int = 3) -> str:
    """Before the first scan since the API server started is in: say so, and reload in ``every`` seconds."""
    body = [
        f"<h1>{_e(title)}</h1>",
        "<p>dupguard is reading Airflow's database; this page reloads itself.</p>",
    ]
    return _page(title, body, f'<meta http-equiv="refresh" content="{every}">')


def _error(doc: Mapping[str, Any]) -> list[str]:
    err = doc.get("error")
    if not err:
        return []
    return [f'<p class="bad">dupguard could not scan: {_e(err.get("message"))}</p>']


def render_run(
    doc: Mapping[str, Any], dag_id: str, run_id: str, notes: Mapping[str, str], links: Links
) -> str:
    """The run tab: is this run a duplicate (of which kept run, why, what dupguard did) or a kept run
    with duplicates; "nothing found" when it is clean."""
    body = [f"<h1>HA health of run {_e(run_id)}</h1>", *_error(doc)]
    groups = groups_of_run(doc, dag_id, run_id)
    if not groups and not doc.get("error"):
        body.append(f'<p class="ok">dupguard found no duplicate of this run{_window(doc)}.</p>')
    for g in groups:
        me = next(r for r in g["runs"] if r["run_id"] == run_id)
        kept = g["kept_run_id"]
        if me["kept"]:
            count = len(g["duplicate_run_ids"])
            body.append(
                f'<p class="bad">This run is the kept run of a duplicate group: {count} duplicate(s) of it.'
                "</p>"
            )
        else:
            body.append(
                f'<p class="bad">This run is a duplicate of '
                f"{links.run(dag_id, kept, kept)}"
                f": {_e(what_dupguard_did(me, notes.get(run_id)))}.</p>"
            )
        body.append(_group_table(g, notes, links))
    return _page(f"HA health: {run_id}", body)


def _why(g: Mapping[str, Any]) -> str:
    events = ", ".join(str(e) for e in g.get("shared_event_ids") or [])
    why = f"{g['kind']} ({g['confidence']})"
    if events:
        why += f"; consumed the same asset event(s) {events}"
    if g.get("partition_key"):
        why += f"; partition {g['partition_key']}"
    return why


def _group_table(g: Mapping[str, Any], notes: Mapping[str, str], links: Links) -> str:
    hosts = ", ".join(h or "?" for h in g.get("creator_hostnames") or [])
    head = "".join(f"<th>{h}</th>" for h in ("run", "role", "state", "tasks started", "what dupguard did"))
    rows = [f"<p>Why: {_e(_why(g))}. Created by: {_e(hosts)}.</p>", f"<table><tr>{head}</tr>"]
    for r in g["runs"]:
        fate = "kept" if r["kept"] else what_dupguard_did(r, notes.get(r["run_id"]))
        rows.append(
            f"<tr><td>{links.run(g['dag_id'], r['run_id'], r['run_id'])}</td>"
            f"<td>{'kept' if r['kept'] else 'duplicate'}</td><td>{_e(r['state'])}</td>"
            f"<td>{_e(r['tasks_started'])}/{_e(r['tasks_total'])}</td><td>{_e(fate)}</td></tr>"
        )
    return "".join(rows) + "</table>"


def _window(doc: Mapping[str, Any]) -> str:
    return f" since {_e(doc['since'])}" if doc.get("since") else ""


def kinds(doc: Mapping[str, Any]) -> list[str]:
    return [GROUPS, *sorted(doc.get("checks") or {})]


def dag_ids(doc: Mapping[str, Any]) -> list[str]:
    found = {g["dag_id"] for g in doc.get("groups") or []}
    found |= {d for obs in (doc.get("checks") or {}).values() for o in obs for d in o.get("dag_ids") or []}
    return sorted(found)


def render_nav(
    doc: Mapping[str, Any],
    doctor: Mapping[str, Any] | None,
    links: Links,
    *,
    dag: str = "",
    kind: str = "",
) -> str:
    """The nav page: every open finding this user may read, filterable by DAG and kind, and the exposure
    summary of ``doctor`` (release, code paths, schedulers and triggerers alive, guard)."""
    body = ["<h1>HA health</h1>", *_error(doc), _filters(doc, dag, kind)]
    shown = 0
    if kind in ("", GROUPS):
        for g in doc.get("groups") or []:
            if dag and g["dag_id"] != dag:
                continue
            shown += 1
            body.append(
                f'<div class="card"><b class="kind">{GROUPS}</b> {links.dag(g["dag_id"])}'
                ": "
                f"{len(g['duplicate_run_ids'])} duplicate(s) of run "
                f"{links.run(g['dag_id'], g['kept_run_id'], g['kept_run_id'])}"
                f"{_group_table(g, {}, links)}</div>"
            )
    for k, found in sorted((doc.get("checks") or {}).items()):
        if kind not in ("", k):
            continue
        for o in found:
            if dag and dag not in (o.get("dag_ids") or []):
                continue
            shown += 1
            body.append(_observation(o, links))
    if not shown and not doc.get("error"):
        body.append(f'<p class="ok">No open finding{_window(doc)}.</p>')
    body.append(
        f"<p>Scanned at {_e(doc.get('scanned_at'))}{_window(doc)}; "
        f"runs examined {_e(doc.get('runs_examined'))}.</p>"
    )
    if doctor is not None:
        body.append(_exposure(doctor))
    return _page("HA health", body)


def _filters(doc: Mapping[str, Any], dag: str, kind: str) -> str:
    def options(values: list[str], chosen: str, label: str) -> str:
        out = [f'<option value="">{_e(label)}</option>']
        out += [
            f'<option value="{_e(v)}"{" selected" if v == chosen else ""}>{_e(v)}</option>' for v in values
        ]
        return "".join(out)

    return (
        '<form method="get"><label>DAG <select name="dag">'
        + options(dag_ids(doc), dag, "every DAG")
        + '</select></label><label>Kind <select name="kind">'
        + options(kinds(doc), kind, "every kind")
        + '</select></label><button type="submit">Filter</button></form>'
    )


def _observation(o: Mapping[str, Any], links: Links) -> str:
    dags = ", ".join(links.dag(d) for d in o.get("dag_ids") or [])
    lines = "".join(f"<li>{_e(line)}</li>" for line in o.get("lines") or [])
    return (
        f'<div class="card"><b class="kind">{_e(o["kind"])}</b> ({_e(o.get("confidence"))}, '
        f"{_e(o.get('severity'))}) {dags}: {_e(o.get('title'))}<ul>{lines}</ul>"
        f'<p class="advice">Advice: {_e(o.get("advice"))}</p></div>'
    )


def _yes(value: object) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _exposure(doctor: Mapping[str, Any]) -> str:
    airflow = doctor.get("airflow") or {}
    rows = [("Airflow release", airflow.get("version"))]
    for path in doctor.get("code_paths") or []:
        state = path["status"] + (
            "" if path["status"] == "not_affected" else f", protected {_yes(path['protected'])}"
        )
        rows.append((f"code path: {path['name']}", f"{state}: {path['why']}"))
    rows.append(("schedulers alive", _yes(doctor.get("schedulers_alive"))))
    rows.append(("triggerers alive", _yes(doctor.get("triggerers_alive"))))
    guard = doctor.get("guard") or {}
    rows.append(("in-scheduler guard active", _yes(guard.get("active"))))
    left = doctor.get("at_risk_unprotected")
    if left is not None:
        rows.append(
            (
                "verdict",
                "AT RISK, unprotected: " + ", ".join(left) if left else "nothing at risk, or protected",
            )
        )
    cells = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
    return f"<h2>Exposure (dupguard doctor)</h2><table>{cells}</table>"
