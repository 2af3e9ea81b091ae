"""Every measured figure in README.md and docs/*.md names the stored result it comes from.

The rule, per block of Markdown (a paragraph, a list item, or a table together with the paragraph just
above it, its caption; fenced code is skipped):

- a block *quotes a figure* when it has a number with a unit (ms, s, µs, MB, GB, kB, %, or the times
  sign of a ratio) and a word that says it was measured (p50/p90/p95/p99, median, max, load average,
  CPU, of a core, RSS, catch rate, wall); such a block names a file of benchmarks/results/ that exists
  (``benchmarks/results/name.json``, a glob such as ``guard_cost*.json`` or ``name.{json,md}``, or the
  bare file name; a folder is not enough);
- every ``benchmarks/results/...`` path in the docs exists (a glob matches at least one file);
- a block that says p99 states no sample count below 100 (``--samples 50``, ``30 samples``, ``40/40``):
  below 100 samples the 99th percentile is the maximum, and the docs say "max".

Settings (``5s``, ``10ms``) are not figures: without a measuring word a number with a unit is not
checked, code spans are not read for either, and where a setting shares a block with a figure the
block names its result anyway.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]

FIGURE = re.compile(r"\d(?:[\d,.]*\d)?\s?(?:ms|s|µs|MB|GB|kB|%|\u00d7)(?!\w)")
MEASURED = re.compile(
    r"\b(?:p50|p90|p95|p99|median|max|load average|CPU|of a core|RSS|catch rate|wall)\b",
    re.IGNORECASE,
)
RESULT_PATH = re.compile(r"benchmarks/results/([\w.*{},/-]+)(?![\w.*{},/<-])")  # not a <placeholder>
BARE_NAME = re.compile(r"[\w*{},-]+(?:\.[\w*{},-]+)*\.(?:json|md|txt|\{[\w,]+\})")
SAMPLES = re.compile(r"--samples\s+(\d+)|\b(\d+) samples\b|\b(\d+)/(\d+)\b")


def expand(pattern: str) -> list[str]:
    """``a.{json,md}`` -> ``a.json``, ``a.md`` (the brace form the docs use for a result's pair of files)."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if not match:
        return [pattern]
    return [
        name
        for part in match.group(1).split(",")
        for name in expand(pattern[: match.start()] + part + pattern[match.end() :])
    ]


def existing(pattern: str) -> bool:
    pattern = pattern.rstrip(".,;:)")
    # a file (or a glob matching one): a folder such as plans/ does not say which run a figure is from
    return bool(pattern) and all(any(p.is_file() for p in RESULTS.glob(name)) for name in expand(pattern))


def blocks(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, text) of each block; a table's block starts with its caption paragraph."""
    current: list[str] = []
    start = 0
    previous = ""  # the last paragraph, if it ended right before the current table
    in_code = False
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            line = ""
        if in_code:
            continue
        is_table = line.lstrip().startswith("|")
        was_table = bool(current) and current[-1].lstrip().startswith("|")
        new_item = re.match(r"\s*(?:[-*]|\d+\.)\s", line) is not None
        boundary = not line.strip() or line.startswith("#") or new_item or (is_table != was_table and current)
        if boundary and current:
            body = "\n".join(current)
            if was_table:
                yield start, previous + "\n" + body
                previous = ""
            else:
                yield start, body
                previous = body if not line.strip() or is_table else ""
        if boundary:
            current = []
            if line.startswith("#"):
                previous = ""
        if line.strip() and not line.startswith("#"):
            if not current:
                start = number
            current.append(line)


def cites_a_result(block: str) -> bool:
    names = [m.group(1) for m in RESULT_PATH.finditer(block)] + BARE_NAME.findall(block)
    return any(existing(name) for name in names)


def violations(rel: str, text: str) -> list[str]:
    found = []
    for line, block in blocks(text):
        where = f"{rel}:{line}"
        for match in RESULT_PATH.finditer(block):
            if not existing(match.group(1)) and not match.group(1).endswith("/"):
                found.append(f"{where}: cites benchmarks/results/{match.group(1)}, which does not exist")
        prose = re.sub(r"`[^`]*`", "", block)  # code spans hold settings and commands, not figures
        if FIGURE.search(prose) and MEASURED.search(prose) and not cites_a_result(block):
            found.append(f"{where}: quotes a figure without naming its benchmarks/results/ file")
        if "p99" in block:
            counts = [int(n) for m in SAMPLES.finditer(block) for n in (m.group(1), m.group(2), m.group(4)) if n]
            small = [n for n in counts if n < 100]
            if small:
                found.append(f"{where}: a p99 over {min(small)} samples (say max below 100)")
    return found


def test_every_quoted_figure_names_an_existing_result_file() -> None:
    found = [v for path in DOCS for v in violations(str(path.relative_to(ROOT)), path.read_text())]
    assert not found, "\n".join(found)


def test_the_rule_catches_what_it_is_for() -> None:
    cases = {
        "Idle poll: 0.079 ms median of DB time.": 1,  # a figure, no result named
        "Idle poll: 0.079 ms median (benchmarks/results/poll_cost.json).": 0,
        "Idle poll: 0.079 ms median (plans in benchmarks/results/plans/).": 1,  # a folder is not a result
        "Idle poll: 0.079 ms median (benchmarks/results/no_such_result.json).": 2,  # missing, so unnamed too
        "The default timeout is 5 s.": 0,  # a setting, not a measurement
        "p99 450 ms over 40/40 detections (`api_source-20261130-1756.json`).": 1,
        "| poll | p50 |\n| --- | --- |\n| 10 ms | 22.1 ms |": 1,  # a table without a caption naming one
        "Raw: `benchmarks/results/guard_cost*.json`.\n\n| mode | median |\n| --- | --- |\n| guard | 15.5 ms |": 0,
        "```\nmedian 3 ms\n```": 0,
        "Retries with `wait(max=90)` for a 20 s outage.": 0,  # code, not a measurement
    }
    for text, expected in cases.items():
        assert len(violations("sample.md", text)) == expected, (text, violations("sample.md", text))
