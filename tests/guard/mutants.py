"""The guard's mutants, each run through the guard tests' scenarios inside ONE Airflow process.

Run with an Airflow venv's python by ``scripts/mutation_guard.py`` (benchmarks/results/mutation.md, "The guard's
decision"); never by CI. mutmut 3 writes every mutant of a function into the mutated ``policy.py``
behind a trampoline that picks the active one from ``MUTANT_UNDER_TEST`` at each call, so one
import of Airflow and of the mutated file serves every mutant. mutmut itself is not installed in
Airflow's venv: the trampoline module the mutated file imports is written into this process's
temporary home (``SHIM``, same dispatch as mutmut's ``wrap_in_trampoline``; ``stats`` records which
functions the scenarios reach).

Per mutant: ``MUTANT_UNDER_TEST`` is set, a fresh database is cloned from a template holding the
scenarios' DAGs (Airflow's ORM re-pointed at it), a fresh ``_DupguardGuard`` is made (its
``__init__`` runs mutated too), the scenarios run as ``driver.py`` runs them (new scheduler jobs),
and the JSON they produce is judged by ``tests/guard/test_guard.py`` itself, in the repo's venv
(``DUPGUARD_GUARD_RESULTS``: its ``runs`` fixture loads the results instead of running Airflow).
The mutant is killed when a test fails, a scenario raises, or it runs longer than ``--timeout``
(the process then exits; the caller restarts it on the remaining mutants).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import driver  # this directory, put on sys.path above (the script runs by its path)

SHIM = """\
import functools
import os

HITS = set()
MutantDict = dict


def wrap_in_trampoline(mutants_dict, is_classmethod=False):
    def mutmut_mutated(decorated):
        def trampoline(*args, **kwargs):
            active = os.environ.get("MUTANT_UNDER_TEST", "")
            orig = mutants_dict["_mutmut_orig"]
            if active == "stats":
                HITS.add(orig.__name__.rsplit("__mutmut_", 1)[0])
                return orig(*args, **kwargs)
            return mutants_dict.get(active.rpartition(".")[2], orig)(*args, **kwargs)

        return functools.update_wrapper(trampoline, decorated)

    return mutmut_mutated
"""


def admin(args: argparse.Namespace, sql: str) -> None:
    import psycopg2

    conn = psycopg2.connect(args.admin_url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def db_url(args: argparse.Namespace, name: str) -> str:
    return args.admin_url.rsplit("/", 1)[0] + "/" + name


def point_airflow_at(url: str) -> None:
    from airflow import settings

    settings.dispose_orm()
    settings.SQL_ALCHEMY_CONN = url.replace("postgresql://", "postgresql+psycopg2://", 1)
    settings.configure_orm()


def scenarios(args: argparse.Namespace, prepared: Any) -> dict[str, Any]:
    import airflow

    result: dict[str, Any] = {"airflow_version": airflow.__version__, "mode": "local-settings"}
    if args.scenarios[0] in driver.PARTITIONED_SCENARIOS:
        driver.run_partitioned_scenarios(args, result, prepared)
    else:
        driver.run_asset_scenarios(args, result, prepared)
    return result


def judge(args: argparse.Namespace, result: dict[str, Any], database: str, work: Path) -> tuple[str, str]:
    """tests/guard/test_guard.py on this result (and the fixed entries), in the repo's venv."""
    out = work / "result.json"
    out.write_text(json.dumps(result, default=str))
    entries = [*json.loads(args.fixed.read_text()), {"version": args.version, "key": args.key,
                                                       "result": str(out), "database": database}]  # fmt: skip
    held = work / "held.json"
    held.write_text(json.dumps(entries))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "MUTANT"))}
    env["DUPGUARD_GUARD_RESULTS"] = str(held)
    proc = subprocess.run(
        [str(driver.ROOT / ".venv" / "bin" / "python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
         "-p", "no:randomly", "tests/guard/test_guard.py"],
        cwd=driver.ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode == 0:
        return "survived", ""
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if proc.returncode != 1 or not failed:  # not a test failure: the harness broke, say so loudly
        return "error", (proc.stdout + proc.stderr)[-3000:]
    return "killed", failed[0][:300]


def run_one(args: argparse.Namespace, name: str, prepared: Any, work: Path) -> dict[str, Any]:
    guard = driver.loaded_guard()
    os.environ["MUTANT_UNDER_TEST"] = name
    database = f"{args.prefix}m_{uuid.uuid4().hex[:10]}"
    admin(args, f'CREATE DATABASE "{database}" TEMPLATE "{args.snapshot}"')
    started = time.monotonic()
    verdict: dict[str, Any] = {"name": name}
    try:
        point_airflow_at(db_url(args, database))
        guard._dupguard_guard = guard._DupguardGuard()  # constructed under the mutant
        try:
            result = scenarios(args, prepared)
        except BaseException as err:  # noqa: BLE001 - a scenario that raises kills the mutant
            verdict.update(status="killed", detail=f"scenario raised {type(err).__name__}: {str(err)[:300]}")
        else:
            from airflow import settings

            settings.dispose_orm()  # the judge's daemon scan reads the database meanwhile
            verdict["status"], verdict["detail"] = judge(args, result, database, work)
        if name == "stats":
            verdict["reached"] = sorted(sys.modules["mutmut.mutation.trampoline"].HITS)
    finally:
        os.environ["MUTANT_UNDER_TEST"] = ""
        from airflow import settings

        settings.dispose_orm()
        admin(args, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    verdict["seconds"] = round(time.monotonic() - started, 1)
    return verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", required=True, type=lambda text: text.split(","))
    parser.add_argument("--version", required=True)
    parser.add_argument("--key", required=True, help="the PLAN entry of test_guard.py these results stand for")
    parser.add_argument("--no-row-locking", action="store_true")
    parser.add_argument("--policy", required=True, type=Path, help="mutmut's mutated policy.py")
    parser.add_argument("--admin-url", required=True)
    parser.add_argument("--template", required=True, help="a database Airflow migrated")
    parser.add_argument("--fixed", required=True, type=Path, help="JSON list of entries judged along (mode none)")
    parser.add_argument("--mutants", required=True, type=Path, help="names, one a line ('stats': the clean run)")
    parser.add_argument("--verdicts", required=True, type=Path, help="JSON lines appended, one per mutant")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--prefix", required=True, help="of every database made (the caller drops what is left)")
    args = parser.parse_args()
    args.snippet_names = None  # driver.run_asset_scenarios reads it (mode none only)
    names = [n for n in args.mutants.read_text().split() if n]

    home = Path(tempfile.mkdtemp(prefix="dupguard-guard-mutants-"))
    shim = home / "shim" / "mutmut" / "mutation"
    shim.mkdir(parents=True)
    (shim.parent / "__init__.py").write_text("")
    (shim / "__init__.py").write_text("")
    (shim / "trampoline.py").write_text(SHIM)
    sys.path.insert(0, str(home / "shim"))
    base = f"{args.prefix}b_{uuid.uuid4().hex[:10]}"
    args.snapshot = f"{args.prefix}s_{uuid.uuid4().hex[:10]}"
    admin(args, f'CREATE DATABASE "{base}" TEMPLATE "{args.template}"')
    setup = argparse.Namespace(
        mode="local-settings", local_settings=args.policy, db_url=db_url(args, base), no_row_locking=args.no_row_locking
    )
    try:
        driver.setup_environment(setup, home / "airflow")
        import airflow  # noqa: F401 - loads the mutated policy as airflow_local_settings

        os.environ["MUTANT_UNDER_TEST"] = ""
        if args.scenarios[0] in driver.PARTITIONED_SCENARIOS:
            prepared = driver.prepare_partitioned_dags()
        else:
            prepared = driver.prepare_asset_dags()
        from airflow import settings

        settings.dispose_orm()
        admin(args, f'CREATE DATABASE "{args.snapshot}" TEMPLATE "{base}"')
        for name in names:
            # A mutant that hangs a scheduler thread leaves this process unusable: record it, exit.
            def timed_out(name: str = name) -> None:
                with args.verdicts.open("a") as f:
                    f.write(json.dumps({"name": name, "status": "timeout", "detail": f"> {args.timeout} s"}) + "\n")
                os._exit(3)

            watchdog = threading.Timer(args.timeout, timed_out)
            watchdog.daemon = True
            watchdog.start()
            verdict = run_one(args, name, prepared, home)
            watchdog.cancel()
            with args.verdicts.open("a") as f:
                f.write(json.dumps(verdict) + "\n")
            if name == "stats" and verdict["status"] != "survived":
                raise SystemExit(f"the clean run fails the guard tests: {verdict}")
    finally:
        for db in (args.snapshot, base):
            admin(args, f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
