"""``benchmarks.e2e_catch_rate --report``: the docs' tables pool one cell's runs across stored tags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import e2e_catch_rate


def _run(name: str, *, backend: str, duplicates: int, stopped: int, seed: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "executor": "celery",
        "backend": backend,
        "source": "database",
        "mode": "fail",
    }
    spec |= {"pickup_delay": 0.0, "guard": False, "fault_max_ms": 0.0, "watcher": True, "seed": seed}
    return {
        "spec": spec,
        "duplicate_groups": duplicates,
        "groups_detected": duplicates,
        "duplicate_runs": duplicates,
        "stopped_before_start": stopped,
        "detected_but_ran": duplicates - stopped,
        "catch_rate": stopped / duplicates,
        "samples_ms": {"detection": [10.0, 30.0]},
    }


def test_report_pools_one_cell_across_tags_and_keeps_cells_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(e2e_catch_rate, "RESULTS", tmp_path)
    first = [_run("a-rep1", backend="api", duplicates=4, stopped=4, seed=1)]
    second = [
        _run("a", backend="api", duplicates=6, stopped=5, seed=2),
        _run("b", backend="db", duplicates=3, stopped=3, seed=3),
    ]
    for tag, runs in (("one", first), ("two", second)):
        (tmp_path / f"e2e_{tag}.json").write_text(json.dumps({"meta": {"tag": tag}, "runs": runs}))

    assert e2e_catch_rate.main(["--report", "one,two"]) == 0

    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| database")]
    assert len(rows) == 2
    api = next(r for r in rows if r.startswith("| database | api "))
    cells = [c.strip() for c in api.split("|")]
    assert cells[8] == "2"  # n: the api cell's runs of both tags
    assert cells[10] == "10" and cells[16] == "9"  # groups, stopped before start: summed
    assert "90 %" in cells[20] and "(83 %-100 %)" in cells[20]  # pooled rate, per-run range


def test_a_tail_over_fewer_than_100_samples_is_called_max(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nearest-rank p99 of n < 100 values is the largest one: the table says max."""
    monkeypatch.setattr(e2e_catch_rate, "RESULTS", tmp_path)
    few = _run("few", backend="api", duplicates=40, stopped=40, seed=1)
    few["samples_ms"] = {"detection": [float(x) for x in range(1, 41)]}
    many = _run("many", backend="db", duplicates=200, stopped=200, seed=2)
    many["samples_ms"] = {"detection": [float(x) for x in range(1, 201)]}
    (tmp_path / "e2e_t.json").write_text(json.dumps({"meta": {"tag": "t"}, "runs": [few, many]}))

    assert e2e_catch_rate.main(["--report", "t"]) == 0

    out = capsys.readouterr().out
    assert "p50 / p99 or max ms" in out  # the header says which
    rows = {
        line.split("|")[2].strip(): [c.strip() for c in line.split("|")]
        for line in out.splitlines()
        if line.startswith("| database")
    }
    assert rows["api"][21] == "20 / max 40"
    assert rows["db"][21] == "100 / 198"
