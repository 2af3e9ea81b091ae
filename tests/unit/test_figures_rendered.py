"""The figures in README.md and docs/ are what scripts/render_figures.py renders from their results.

A figure quoted in the docs must match the result it names, and that result must be of the code that
ships: the renderer refuses a result whose measured code changed since its commit, or had uncommitted
changes. After a change to such code, re-measure: scripts/remeasure_figures.sh.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_figures", ROOT / "scripts" / "render_figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["render_figures"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


rf = load_renderer()


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def shallow() -> bool:
    return git("rev-parse", "--is-shallow-repository") == "true"


def copied() -> bool:
    """Whether this tree is a copy inside another checkout (mutmut's mutants/): its files have no history."""
    return Path(git("rev-parse", "--show-toplevel")).resolve() != ROOT.resolve()


def test_the_docs_carry_what_their_results_render() -> None:
    changed, errors, notes = rf.render_all()
    assert not errors, "\n".join(errors)
    assert not changed, "figures differ from their results; run scripts/render_figures.py: " + ", ".join(
        str(p.relative_to(ROOT)) for p in changed
    )
    for note in notes:  # a shallow clone: the comparison with HEAD was skipped, say so
        print(note)


def test_every_figure_in_the_docs_is_known_and_every_known_figure_is_shown() -> None:
    used = {m.group(1) for path in rf.docs() for m in rf.MARKER.finditer(path.read_text())}
    known = set(rf.FIGURES) | {f"{r}.{extra}" for r in rf.RECORDS for extra in ("file", "date", "load")}
    assert used <= known, used - known
    assert set(rf.FIGURES) <= used, set(rf.FIGURES) - used


def test_a_stale_figure_is_rewritten(tmp_path: Path) -> None:
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    head = git("rev-parse", "--short=12", "HEAD")
    doc = {
        "provenance": {"commit": head, "uncommitted_code": []},
        "summary": {"guard": {"in_guard_ms_per_run": 3.64}},
    }
    (results / "guard_cost-20990101.json").write_text(json.dumps(doc))
    (results / "guard_cost-20000101.json").write_text("{}")  # older: not read
    records = {"guard": rf.load("guard", results, ROOT, [])}
    errors: list[str] = []
    page = ROOT / "docs" / "page.md"
    text = "Guard: <!-- fig:guard_per_run -->2.0 ms<!-- /fig --> (<!-- fig:guard.file -->x<!-- /fig -->)."
    rendered = rf.render(text, page, records, ROOT, errors)
    assert not errors
    link = os.path.relpath(results / "guard_cost-20990101.json", page.parent)
    assert rendered == (
        "Guard: <!-- fig:guard_per_run -->3.6 ms<!-- /fig --> "
        f"(<!-- fig:guard.file -->[guard_cost-20990101.json]({link})<!-- /fig -->)."
    )


def test_a_result_of_uncommitted_code_is_refused() -> None:
    head = git("rev-parse", "--short=12", "HEAD")
    dirty = {"commit": head, "uncommitted_code": [" M detector/guard/policy.py"]}
    errors, _ = rf.refusals("guard", rf.RECORDS["guard"], dirty)
    assert len(errors) == 1 and head in errors[0] and "guard" in errors[0], errors
    # older results stored the first porcelain line without its leading space
    unpadded = {"commit": head, "uncommitted_code": ["M detector/guard/policy.py"]}
    assert rf.refusals("guard", rf.RECORDS["guard"], unpadded)[0]
    elsewhere = {"commit": head, "uncommitted_code": [" M detector/actions/alerts/dispatch.py"]}
    assert rf.refusals("guard", rf.RECORDS["guard"], elsewhere)[0] == []
    assert rf.refusals("guard", rf.RECORDS["guard"], {"commit": head})[0]  # says nothing of its tree


def test_a_result_of_code_changed_since_is_refused() -> None:
    if shallow():
        pytest.skip("a shallow clone: the commits a result was measured on are not here")
    if copied():
        pytest.skip("a copy of the tree inside a checkout (make mutation): its files have no history")
    # The first commit that touched detector/core: that code changed since, certainly.
    first = git("log", "--reverse", "--format=%h", "--", "detector/core").splitlines()[0]
    errors, _ = rf.refusals("detection", rf.RECORDS["detection"], {"commit": first, "uncommitted_code": []})
    assert len(errors) == 1 and first in errors[0] and "detection" in errors[0], errors
    head = git("rev-parse", "HEAD")
    assert rf.refusals("detection", rf.RECORDS["detection"], {"commit": head, "uncommitted_code": []}) == ([], [])
    unknown = {"commit": "0" * 12, "uncommitted_code": []}
    assert rf.refusals("detection", rf.RECORDS["detection"], unknown)[0]
