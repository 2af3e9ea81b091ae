"""Writes detector/metadb/airflow_revisions.json: Airflow version <-> alembic head revision.

dupguard reads `alembic_version.version_num` from the metadata DB to know which Airflow it watches.
Airflow itself keeps the mapping in `airflow/utils/db.py` as `_REVISION_HEADS_MAP`
("first Airflow version whose migrations end at this revision"). We read it with `ast` from the
newest installed Airflow (no Airflow import needed), derive the version range of each revision,
and add the heads actually measured by `regen_schema_fixtures.sh` for the versions we test.

    python scripts/airflow/extract_revisions.py [--airflow-version 3.3.2]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def read_heads_map(db_py: Path) -> dict[str, str]:
    tree = ast.parse(db_py.read_text())
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            target = node.target.id
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
        if target == "_REVISION_HEADS_MAP" and node.value is not None:
            value = ast.literal_eval(node.value)
            return {str(k): str(v) for k, v in value.items()}
    raise SystemExit(f"_REVISION_HEADS_MAP not found in {db_py}")


def version_key(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split("."))


def measured_heads() -> dict[str, str]:
    out = {}
    for f in sorted((ROOT / "tests/fixtures/schema").glob("airflow-*.sql")):
        ver = f.stem.removeprefix("airflow-")
        pattern = r"INSERT INTO public\.alembic_version \(version_num\) VALUES \('(\w+)'\);"
        m = re.search(pattern, f.read_text())
        if m:
            out[ver] = m.group(1)
    return dict(sorted(out.items(), key=lambda kv: version_key(kv[0])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--airflow-version", default="3.3.2")
    ap.add_argument("--out", default=str(ROOT / "detector/metadb/airflow_revisions.json"))
    args = ap.parse_args()
    venv = ROOT / ".airflow-venvs" / args.airflow_version
    candidates = sorted(venv.glob("lib/python3*/site-packages/airflow/utils/db.py"))
    if not candidates:
        raise SystemExit(f"no airflow/utils/db.py under {venv}; run scripts/airflow/venv.sh {args.airflow_version}")
    heads = dict(sorted(read_heads_map(candidates[0]).items(), key=lambda kv: version_key(kv[0])))
    versions = list(heads)
    revisions = {}
    for i, ver in enumerate(versions):
        nxt = versions[i + 1] if i + 1 < len(versions) else None
        revisions[heads[ver]] = {"first_version": ver, "next_head_version": nxt}
    doc = {
        "source": f"airflow/utils/db.py _REVISION_HEADS_MAP of apache-airflow {args.airflow_version}",
        "note": (
            "heads: first Airflow version whose migrations end at that revision; a DB at revision R "
            "runs Airflow >= revisions[R].first_version and < revisions[R].next_head_version "
            "(null = newest known). measured: heads seen after `airflow db migrate` per tested version."
        ),
        "heads": heads,
        "revisions": revisions,
        "measured": measured_heads(),
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}: {len(heads)} heads")


if __name__ == "__main__":
    main()
