"""docs/reference/json-formats.md shows what the real renderers print, and is what the code generates."""

from __future__ import annotations

from detector.app import render
from detector.app.formats_doc import documents, fields


def test_the_documents_are_the_real_ones() -> None:
    """The scan document holds the demo's six groups with their runs, the CSV starts with the renderer's
    header, and doctor's names the demo's duplicates."""
    docs = documents()
    scan = docs["scan --format json"]
    assert scan["format_version"] == 1 and len(scan["groups"]) == 6
    assert docs["scan --format csv"].splitlines()[0] == render.csv_header().strip()
    assert docs["doctor --format json"]["duplicates"]["groups"] == 6
    assert docs["webhook payload (dupguard.alert/v1, type detected)"]["schema"] == "dupguard.alert/v1"


def test_fields_lists_every_path_with_list_items() -> None:
    assert list(fields({"a": [{"b": None}], "c": 1.5})) == [
        ("(document)", "object"),
        ("a", "array"),
        ("a[]", "object"),
        ("a[].b", "null"),
        ("c", "number"),
    ]
