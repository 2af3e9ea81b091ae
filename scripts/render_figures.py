"""Render the measured figures in README.md and docs/ from the results they come from.

A figure in the docs sits between markers, ``<!-- fig:NAME -->20 ms<!-- /fig -->``; FIGURES below maps
NAME to a record (a results file of benchmarks/results/), a path into its JSON and a format. Besides the
figures, every record offers ``RECORD.file`` (a link to the results file), ``RECORD.date`` and
``RECORD.load`` (the load average when it was measured).

A record is the newest ``<stem>-YYYYMMDD.json`` of its stem (scripts/remeasure_figures.sh writes them).
Its result is refused, naming the figure and the commit, when the code it measured (RECORD's ``code``)
changed between the commit it records and HEAD, or had uncommitted changes when it was measured: such a
figure describes code that no longer ships. Without the git history of that commit (a shallow clone) the
comparison is skipped and said so; the uncommitted-changes check still runs.

    .venv/bin/python scripts/render_figures.py           # rewrite the docs
    .venv/bin/python scripts/render_figures.py --check   # exit 1 when a doc differs or a result is refused
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# The daemon's idle loop and detection pass: what a detection or an idle figure measures.
DAEMON = (
    "detector/core",
    "detector/sources/database",
    "detector/metadb",
    "detector/checks",
    "detector/app",
    "detector/config",
    "detector/settings.py",
    "detector/deadline.py",
    "detector/durations.py",
)


@dataclass(frozen=True)
class Record:
    stem: str  # benchmarks/results/<stem>-YYYYMMDD.json, the newest
    code: tuple[str, ...]  # the paths it measured
    provenance: str = "provenance"  # where in the JSON the provenance is


@dataclass(frozen=True)
class Figure:
    record: str
    path: str  # dots between keys; ``key=value&key=value`` picks the item of a list that matches
    fmt: str


RECORDS = {
    "detection": Record("detection_latency", DAEMON, "meta.provenance"),
    "scan": Record("scan_cost", ("detector/app/scan.py", "detector/core", "detector/metadb"), "sizes.1m.provenance"),
    "remediation": Record(
        "remediation_latency", ("detector/actions/remediation", "detector/airflowapi", "detector/metadb")
    ),
    "guard": Record("guard_cost", ("detector/guard/policy.py",)),  # the UI plugin beside it never runs per run
}

FIGURES = {
    "detection_p50": Figure("detection", "summary.mode=poll.pooled_p50_ms", "{:.0f} ms"),
    "detection_p99": Figure("detection", "summary.mode=poll.pooled_p99_ms", "{:.0f} ms"),
    "detection_count": Figure("detection", "summary.mode=poll.detected", "{}"),
    "poll_interval": Figure("detection", "summary.mode=poll.interval", "{}"),
    "detection_load": Figure("detection", "summary.mode=poll.load_during_mean.median", "{:.1f}"),
    "idle_cpu": Figure("detection", "summary.mode=poll.idle_cpu_pct_of_core.median", "{:.1f} %"),
    "idle_db_cpu": Figure("detection", "summary.mode=poll.idle_db_backend_cpu_pct_of_core.median", "{:.1f} %"),
    "rss": Figure("detection", "summary.mode=poll.rss_mb_after_load.median", "{:.0f} MB"),
    "scan_1m_cli": Figure("scan", "sizes.1m.cli_since_1d.median_s", "{:.2f} s"),
    "scan_1m_cli_cpu": Figure("scan", "sizes.1m.cli_since_1d.cpu_median_s", "{:.2f} s"),
    "scan_1m_naive": Figure("scan", "sizes.1m.naive.median_s", "{:.2f} s"),
    "remediation_db_p50": Figure("remediation", "rows.backend=db&mode=fail.p50_ms", "{:.0f} ms"),
    "remediation_db_p99": Figure("remediation", "rows.backend=db&mode=fail.p99_ms", "{:.0f} ms"),
    "remediation_api_p50": Figure("remediation", "rows.backend=api&mode=fail.p50_ms", "{:.0f} ms"),
    "remediation_api_p99": Figure("remediation", "rows.backend=api&mode=fail.p99_ms", "{:.0f} ms"),
    "guard_per_run": Figure("guard", "summary.guard.in_guard_ms_per_run", "{:.1f} ms"),
    "guard_whole_run": Figure("guard", "summary.guard.ms_per_run", "{:.0f} ms"),
}

MARKER = re.compile(r"<!-- fig:([\w.]+) -->(.*?)<!-- /fig -->", re.DOTALL)
DATED = re.compile(r"-(\d{8})\.json$")


class Refused(Exception):
    """A figure that cannot be rendered: its record is missing, unreadable or of other code."""


def git(*args: str, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)


def record_file(record: Record, results: Path = RESULTS) -> Path:
    dated = sorted(p for p in results.glob(f"{record.stem}-*.json") if DATED.search(p.name))
    if not dated:
        raise Refused(f"no benchmarks/results/{record.stem}-YYYYMMDD.json")
    return max(dated, key=lambda p: DATED.search(p.name).group(1))  # type: ignore[union-attr]


def lookup(doc: Any, path: str) -> Any:
    for key in path.split("."):
        if isinstance(doc, list):
            wanted = dict(part.split("=", 1) for part in key.split("&"))
            doc = next(item for item in doc if all(str(item.get(k)) == v for k, v in wanted.items()))
        else:
            doc = doc[key]
    return doc


def refusals(name: str, record: Record, provenance: dict[str, Any], root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(refusals, notes) for a result of ``record``: of code changed since, or of a dirty tree."""
    commit = provenance.get("commit")
    if not commit or "uncommitted_code" not in provenance:
        return [f"{name}: its result records no commit and no uncommitted changes"], []
    errors, notes = [], []
    dirty = [line for line in provenance["uncommitted_code"] if under(line[2:].strip().split(" -> ")[-1], record.code)]
    if dirty:
        errors.append(
            f"{name}: measured on commit {commit} with uncommitted changes in {', '.join(d.strip() for d in dirty)}"
        )
    if git("cat-file", "-e", f"{commit}^{{commit}}", root=root).returncode != 0:
        if git("rev-parse", "--is-shallow-repository", root=root).stdout.strip() == "true":
            notes.append(f"{name}: commit {commit} is not in this shallow clone; not compared with HEAD")
        else:
            errors.append(f"{name}: measured on commit {commit}, which this repository does not have")
        return errors, notes
    if git("diff", "--quiet", commit, "HEAD", "--", *record.code, root=root).returncode != 0:
        errors.append(
            f"{name}: measured on commit {commit}, and its code changed since "
            f"(git diff {commit} HEAD -- {' '.join(record.code)}): re-measure (scripts/remeasure_figures.sh)"
        )
    return errors, notes


def under(path: str, code: tuple[str, ...]) -> bool:
    return any(path == c or path.startswith(c.rstrip("/") + "/") for c in code)


@dataclass
class Loaded:
    path: Path
    doc: Any
    errors: list[str]


def load(name: str, results: Path, root: Path, notes: list[str]) -> Loaded:
    record = RECORDS[name]
    try:
        path = record_file(record, results)
        doc = json.loads(path.read_text())
        errors, said = refusals(f"{name} ({path.name})", record, lookup(doc, record.provenance), root)
    except (Refused, KeyError, StopIteration, ValueError) as exc:
        return Loaded(results / record.stem, None, [f"{name}: {exc!r}"])
    notes.extend(said)
    return Loaded(path, doc, errors)


def value(name: str, doc_path: Path, records: dict[str, Loaded], root: Path) -> str:
    """The text of figure ``name`` in the doc at ``doc_path``; raises Refused."""
    record, _, extra = name.partition(".")
    if extra:  # RECORD.file / .date / .load
        if record not in RECORDS:
            raise Refused(f"unknown figure {name}")
        loaded = records[record]
        if loaded.errors:
            raise Refused("; ".join(loaded.errors))
        provenance = lookup(loaded.doc, RECORDS[record].provenance)
        if extra == "file":
            link = os.path.relpath(loaded.path, doc_path.parent)
            return f"[{loaded.path.name}]({link})"
        if extra == "date":
            return str(provenance["measured_at"])[:10]
        if extra == "load":
            return f"{provenance['load_average'][0]:.1f}"
        raise Refused(f"unknown figure {name}")
    if name not in FIGURES:
        raise Refused(f"unknown figure {name}")
    figure = FIGURES[name]
    loaded = records[figure.record]
    if loaded.errors:
        raise Refused("; ".join(f"figure {name}: {e}" for e in loaded.errors))
    try:
        return figure.fmt.format(lookup(loaded.doc, figure.path))
    except (KeyError, StopIteration, TypeError, ValueError) as exc:
        raise Refused(f"figure {name}: {figure.path} not in {loaded.path.name} ({exc!r})") from exc


def render(text: str, doc_path: Path, records: dict[str, Loaded], root: Path, errors: list[str]) -> str:
    def one(match: re.Match[str]) -> str:
        try:
            return f"<!-- fig:{match.group(1)} -->{value(match.group(1), doc_path, records, root)}<!-- /fig -->"
        except Refused as exc:
            errors.append(f"{doc_path.relative_to(root)}: {exc}")
            return match.group(0)

    return MARKER.sub(one, text)


def docs(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def render_all(root: Path = ROOT, results: Path = RESULTS) -> tuple[dict[Path, str], list[str], list[str]]:
    """({doc: rendered text} of the docs that change, errors, notes)."""
    errors: list[str] = []
    notes: list[str] = []
    records = {name: load(name, results, root, notes) for name in RECORDS}
    changed = {}
    for path in docs(root):
        text = path.read_text()
        rendered = render(text, path, records, root, errors)
        if rendered != text:
            changed[path] = rendered
    return changed, list(dict.fromkeys(errors)), notes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a doc differs")
    args = parser.parse_args()
    changed, errors, notes = render_all()
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for error in errors:
        print(f"refused: {error}", file=sys.stderr)
    for path, text in changed.items():
        if args.check:
            print(f"{path.relative_to(ROOT)}: figures differ from their results", file=sys.stderr)
        else:
            path.write_text(text)
            print(f"rendered {path.relative_to(ROOT)}")
    return 1 if errors or (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
