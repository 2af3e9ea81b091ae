"""The guard's decision (detector/guard/policy.py) under mutation, inside real Airflow (benchmarks/results/mutation.md).

Called by scripts/mutation_guard.sh. mutmut 3 writes the mutants (into a scratch copy of policy.py,
never the working tree); tests/guard/mutants.py runs them inside one Airflow process per pass, each
judged by tests/guard/test_guard.py's own assertions. A pass is one PLAN entry of test_guard.py
(an Airflow version, its settings, its scenarios); a pass runs only the mutants of functions its
clean run reached ("stats") and not killed by an earlier pass. The functions the tests without
Airflow reach (NO_AIRFLOW) are first judged by those tests in this venv, with mutmut's own
trampoline. Writes ``mutmut results --all true``'s format to OUT ("not checked" for mutants no pass
reached), and each verdict to OUT.jsonl.

    .venv/bin/python scripts/mutation_guard.py OUT [GLOB ...]   # globs of mutant names: only those
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODULE = "detector.guard.policy"
GUARD_TESTS = ROOT / "tests" / "guard"
# (version, test_guard.py PLAN key, scenarios, extra arguments): the entries that load the guard
# from the file mutmut mutates (entry-point and pip-installed load the same text).
PASSES = [
    ("3.1.2", "local-settings", "race,broken-python,broken-sql,ordinary,overlap,disjoint,broken-finish,broken-note,"
     "small-cache,race-again,metrics,notasks,mapped-later,mapped-later-cold,late-event,second-consumer,race-three,bounds,"
     "empty-window-race,empty-window-lookalike,alias-overlap,alias-race", ()),
    ("3.1.2", "no-row-locking", "unlocked,unlocked-inverted,callback", ("--no-row-locking",)),
    ("3.2.2", "local-settings", "partitioned-serial,partitioned-overlap,partitioned-timeout,partitioned-stress,"
     "partitioned-inverted,partitioned-late-event,partitioned-again,partitioned-two-keys,"
     "partitioned-fresh-and-raced", ()),
]  # fmt: skip
FIXED = [("3.1.2", "race,overlap,metrics"), ("3.2.2", "partitioned-serial,partitioned-overlap")]  # mode none
TIMEOUT_EXIT = 3  # tests/guard/mutants.py: a mutant ran past its timeout, the process exited


def admin_url() -> str:
    return os.environ["DUPGUARD_TEST_DATABASE_URL"]


def admin(sql: str) -> str:
    return subprocess.run(["psql", admin_url(), "-Atqc", sql], check=True, capture_output=True, text=True).stdout


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "MUTANT"))}


def make_mutants(work: Path) -> tuple[Path, list[str]]:
    """mutmut's mutated policy.py and its mutant names, made in a scratch tree (mutmut reads its
    [tool.mutmut] from the working directory's pyproject.toml)."""
    tree = work / "gen"
    (tree / "detector" / "guard").mkdir(parents=True)
    shutil.copy(ROOT / "detector" / "guard" / "policy.py", tree / "detector" / "guard" / "policy.py")
    (tree / "pyproject.toml").write_text(
        '[tool.mutmut]\nsource_paths = ["detector"]\nonly_mutate = ["detector/guard/policy.py"]\n'
    )
    code = "from pathlib import Path; from mutmut.__main__ import create_file_mutants as c; " \
        "r = c(Path('detector/guard/policy.py')); assert r.error is None, r.error"  # fmt: skip
    subprocess.run([sys.executable, "-c", code], cwd=tree, check=True, capture_output=True)
    mutated = tree / "mutants" / "detector" / "guard" / "policy.py"
    meta = json.loads(mutated.with_name("policy.py.meta").read_text())
    return mutated, sorted(meta["exit_code_by_key"], key=lambda n: (function_of(n), int(n.rsplit("_", 1)[1])))


def function_of(name: str) -> str:
    """detector.guard.policy.xǁ_DupguardGuardǁ_decide__mutmut_3 -> xǁ_DupguardGuardǁ_decide"""
    return name.rpartition(".")[2].rsplit("__mutmut_", 1)[0]


def airflow_python(version: str) -> str:
    subprocess.run([str(ROOT / "scripts" / "airflow" / "venv.sh"), version], check=True, capture_output=True)
    return str(ROOT / ".airflow-venvs" / version / "bin" / "python")


def migrate(version: str, prefix: str, work: Path) -> str:
    name = f"{prefix}tpl_{version.replace('.', '_')}"
    admin(f'CREATE DATABASE "{name}"')
    url = admin_url().rsplit("/", 1)[0] + "/" + name
    home = work / f"migrate-{version}"
    home.mkdir()
    env = clean_env() | {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url.replace("postgresql://", "postgresql+psycopg2://", 1),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS": "False",
    }
    cmd = [airflow_python(version), "-m", "airflow", "db", "migrate"]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return name


def fixed_entries(templates: dict[str, str], prefix: str, work: Path) -> Path:
    """The runs without the guard that test_guard.py compares with (Airflow alone: no mutant changes them)."""
    entries = []
    for version, scenarios in FIXED:
        db = f"{prefix}none_{version.replace('.', '_')}"
        admin(f'CREATE DATABASE "{db}" TEMPLATE "{templates[version]}"')
        out = work / f"none-{version}.json"
        cmd = [airflow_python(version), str(GUARD_TESTS / "driver.py"), "--scenarios", scenarios, "--mode", "none",
               "--db-url", admin_url().rsplit("/", 1)[0] + "/" + db, "--out", str(out)]  # fmt: skip
        if version.startswith("3.1"):
            (work / "als.py").write_text((ROOT / "detector" / "guard" / "policy.py").read_text())
            cmd += ["--snippet-names", str(work / "als.py")]
        subprocess.run(cmd, cwd=ROOT, env=clean_env(), check=True, capture_output=True)
        entries.append({"version": version, "key": "none", "result": str(out), "database": db})
    path = work / "fixed.json"
    path.write_text(json.dumps(entries))
    return path


def run_pass(
    spec: tuple[str, str, str, tuple[str, ...]], names: list[str], ctx: dict[str, object], record: Any = None
) -> list[dict]:
    """tests/guard/mutants.py over ``names`` (restarted after a mutant that timed out)."""
    version, key, scenarios, extra = spec
    work: Path = ctx["work"]  # type: ignore[assignment]
    verdicts = work / f"verdicts-{version}-{key}.jsonl"
    done: list[dict] = []
    todo = list(names)
    while todo:
        listing = work / "todo.txt"
        listing.write_text("\n".join(todo) + "\n")
        seen = len(verdicts.read_text().splitlines()) if verdicts.exists() else 0
        cmd = [airflow_python(version), str(GUARD_TESTS / "mutants.py"), "--scenarios", scenarios,
               "--version", version, "--key", key, "--policy", str(ctx["policy"]), "--admin-url", admin_url(),
               "--template", str(ctx[version]), "--fixed", str(ctx["fixed"]), "--mutants", str(listing),
               "--verdicts", str(verdicts), "--prefix", str(ctx["prefix"]), *extra]  # fmt: skip
        proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True)
        new = [json.loads(line) for line in verdicts.read_text().splitlines()[seen:]] if verdicts.exists() else []
        done += new
        for verdict in new:
            if record is not None:
                record(verdict)
            detail = verdict.get("detail", "")[:160]
            print(f"{version} {key}: {verdict['name']}: {verdict['status']} {detail}", flush=True)
        judged = {v["name"] for v in new}
        if proc.returncode not in (0, TIMEOUT_EXIT) or not judged:
            raise SystemExit(f"tests/guard/mutants.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        todo = [n for n in todo if n not in judged]
    return done


# Functions the guard's tests without Airflow reach (policy.py loaded from its file): the wait read
# from the environment at start (never varied by a scenario), the lock ids, the decision cache.
NO_AIRFLOW = {"x__dupguard_lock_wait", "x__dupguard_lock_id", "xǁ_DupguardGuardǁ_remember"}
NO_AIRFLOW_TESTS = ["tests/guard/test_lock_wait.py", "tests/guard/test_guard_state.py"]


def no_airflow_pass(mutated: Path, names: list[str], work: Path) -> list[dict]:
    """NO_AIRFLOW_TESTS on each mutant, in a tree whose policy.py is the mutated one."""
    tree = work / "no-airflow"
    shutil.copytree(ROOT / "tests", tree / "tests", ignore=shutil.ignore_patterns("__pycache__", "fixtures"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    (tree / "detector" / "guard").mkdir(parents=True)
    shutil.copy(mutated, tree / "detector" / "guard" / "policy.py")
    out = []
    for name in names:
        # test_lock_wait loads the file as module dupguard_policy_under_test: mutmut's trampoline
        # activates a mutant of the module it was loaded as.
        env = clean_env() | {"MUTANT_UNDER_TEST": "dupguard_policy_under_test." + name.rpartition(".")[2]}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *NO_AIRFLOW_TESTS],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
        )
        status = {0: "survived", 1: "killed"}.get(proc.returncode, "error")
        failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
        out.append({"name": name, "status": status, "detail": (failed or [proc.stdout[-300:]])[0][:300]})
        print(f"no-airflow: {name}: {status}", flush=True)
    return out


# The order the passes run in: the partitioned-only functions first on 3.2.2 (no other pass reaches
# them), then every mutant on the cheapest pass that reaches it, the survivors on the next ones.
PARTITIONED_ONLY = {"stale_partition_rows", "partitioned_precheck", "partitioned_statement"}
STAGES = [(2, PARTITIONED_ONLY), (0, None), (1, None), (2, None)]


def main(argv: list[str]) -> int:
    out_path, globs = Path(argv[0]), argv[1:] or ["*"]
    work = Path(tempfile.mkdtemp(prefix="dupguard-mutation-guard-"))
    prefix = f"mg{uuid.uuid4().hex[:6]}_"
    verdicts: dict[str, dict] = {}
    live = out_path.with_suffix(".jsonl").open("w")  # each verdict as it comes (a stopped run keeps them)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    selected: list[str] = []
    try:
        mutated, names = make_mutants(work)
        # In the order of the globs: a run stopped early has checked the first ones.
        selected = list(dict.fromkeys(n for g in globs for n in names if fnmatch.fnmatchcase(n, g)))
        ctx: dict[str, object] = {"work": work, "policy": mutated, "prefix": prefix}
        for version in sorted({p[0] for p in PASSES}):
            ctx[version] = migrate(version, prefix, work)
        ctx["fixed"] = fixed_entries(ctx, prefix, work)  # type: ignore[arg-type]

        def record(verdict: dict) -> None:
            verdicts[verdict["name"]] = verdict
            live.write(json.dumps(verdict) + "\n")
            live.flush()

        for verdict in no_airflow_pass(mutated, [n for n in selected if function_of(n) in NO_AIRFLOW], work):
            record(verdict)
        reached: dict[int, set[str]] = {}
        judged: set[tuple[int, str]] = set()
        for index, only in STAGES:
            if only is not None and not any(function_of(n).rpartition("ǁ")[2] in only for n in selected):
                continue
            if index not in reached:
                (stats,) = run_pass(PASSES[index], ["stats"], ctx)
                reached[index] = set(stats["reached"])
            todo = [
                n for n in selected
                if function_of(n) in reached[index] and (only is None or function_of(n).rpartition("ǁ")[2] in only)
                and (index, n) not in judged and verdicts.get(n, {}).get("status") not in ("killed", "timeout")
            ]  # fmt: skip
            judged |= {(index, n) for n in todo}
            run_pass(PASSES[index], todo, ctx, record)
    finally:
        live.close()
        for db in admin("SELECT datname FROM pg_database").split():
            if db.startswith(prefix):
                admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)
        with out_path.open("w") as f:
            for name in selected:
                status = verdicts.get(name, {}).get("status", "not checked")
                f.write(f"    {MODULE}.{name.rpartition('.')[2]}: {status}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
