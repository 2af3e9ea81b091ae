"""``dupguard doctor``: is this deployment at risk of duplicate runs, and is dupguard set up right?

Read-only, with the settings of ``run`` (both sources). It reads what it can and says what it could
not (a missing grant makes a figure ``null``, never a failure); the judgement is
``detector.core.exposure``; the document is docs/reference/doctor.md's contract (``format_version``).
Nothing is written anywhere: the REST permission is probed with the task-instance *dry-run*
endpoint on a DAG that does not exist (Airflow checks the permission before it looks the DAG up, and
that route writes no audit-log row), and the database is read on a read-only engine.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from detector import __version__, logs
from detector.actions.remediation import choice
from detector.actions.remediation.choice import DB_BACKEND
from detector.app.ledger import SCHEMA
from detector.app.scan import scan
from detector.checks import enabled
from detector.config import Config
from detector.core.detect import DagFilter
from detector.core.exposure import Observed, PathRisk, assess, assess_family, unprotected
from detector.core.model import Finding, Kind
from detector.errors import AirflowApiError, AirflowAuthError, DatabaseError
from detector.metadb import catalog, doctor_reads
from detector.metadb.engine import AirflowDb, connect, is_pinned, make_engine, open_airflow_db, parse_url, server_role
from detector.metrics import Metrics

if TYPE_CHECKING:
    from sqlalchemy import Connection

FORMAT_VERSION = 1
LOOKBACK = timedelta(days=30)
# Airflow's [scheduler] scheduler_health_check_threshold default: a scheduler whose heartbeat is
# older is no longer counted as alive by Airflow itself (its /health and the job table's readers).
SCHEDULER_HEALTH_THRESHOLD = timedelta(seconds=30)
TRIGGERER_HEALTH_THRESHOLD = timedelta(seconds=30)  # Airflow's [triggerer] triggerer_health_check_threshold
PROBE_DAG = "dupguard-doctor-permission-probe"  # never a real DAG: the probe must reach the 404
GUARD_HOW_TO_CHECK = (
    "no guard note seen: the guard is not installed, or had nothing to stop; in a scheduler container "
    "check `pip show airflow-dupguard-guard`, or that airflow_local_settings.py holds the snippet "
    "`dupguard guard print-local-settings` prints (docs/how-to/guard.md)"
)

# Grants per need (docs/how-to/deploy-kubernetes.md, section 2: Database role;
# docs/explanation/remediation.md for the db backend).
DETECT_TABLES: tuple[str, ...] = ("alembic_version", "dag_run", "task_instance", "dagrun_asset_event", "asset_event")
DETECT_TABLES += ("asset", "job", "dag_run_note")
PARTITION_TABLES = ("asset_partition_dag_run", "partitioned_asset_key_log")
# The periodic checks' reads (docs/explanation/checks.md), those that exist in this version: asset_trigger (3.0/3.1) or
# asset_watcher and callback (3.2+).
CHECK_TABLES: tuple[str, ...] = (
    "task_instance_history",
    "asset_dag_run_queue",
    "dag_schedule_asset_reference",
    "dag",
    "trigger",
)
CHECK_TABLES += ("asset_alias_asset_event", "deadline", "asset_trigger", "asset_watcher", "callback")
# DUPGUARD_REPAIR_STRANDED=requeue writes the queue row Airflow left out (docs/runbooks.md#DupguardStrandedEvents).
REPAIR_STRANDED = (("asset_dag_run_queue", "INSERT"),)
JOB_HEARTBEAT_COLUMNS = ("job_type", "state", "latest_heartbeat")  # the alive schedulers and triggerers
LEDGER_TABLES = tuple(f"{SCHEMA}.{name}" for name in ("claims", "notes", "state"))
LEDGER_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


@dataclass
class Findings:
    """What was read, filled in as far as possible; ``problems`` says what could not be read."""

    doc: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    seen: dict[str, Any] = field(default_factory=dict)  # Observed's fields
    lookback: timedelta = LOOKBACK  # how far back duplicates and guard notes are counted


def doctor(cfg: Config, *, now: datetime, lookback: timedelta = LOOKBACK) -> dict[str, Any]:
    """The document (docs/reference/doctor.md). Raises DatabaseError / AirflowApiError when the source itself
    cannot be read (exit 3), ConfigError for settings ``run`` would refuse (exit 2)."""
    out = Findings(lookback=lookback)
    if cfg.source == "api":
        _from_api(cfg, out, now)
    else:
        _from_database(cfg, out, now)
    seen = Observed(**out.seen)
    risks = assess(seen)
    left = unprotected(risks)
    return {
        "format_version": FORMAT_VERSION,
        "dupguard_version": __version__,
        "source": cfg.source,
        "checked_at": now.isoformat(),
        "lookback_days": lookback / timedelta(days=1),
        **out.doc,
        "code_paths": [_risk(r) for r in risks],
        "at_risk_unprotected": [r.name.value for r in left],
        "family": [asdict(r) | {"issues": list(r.issues), "status": r.status.value} for r in assess_family(seen)],
        "problems": out.problems,
        "exit_code": 1 if left else 0,
    }


def _risk(r: PathRisk) -> dict[str, Any]:
    return {
        "name": r.name.value,
        "issues": list(r.issues),
        "affected": r.affected,
        "status": r.status.value,
        "protected": r.protected,
        "why": r.why,
    }


def _duplicates(findings: list[Finding], splits: int, checks_found: dict[str, int], out: Findings) -> None:
    from detector.app.render import summary

    asset = sum(f.kind is Kind.ASSET for f in findings)
    partitioned = sum(f.kind is Kind.PARTITIONED for f in findings)  # trigger_event groups are neither path's
    out.seen |= {"asset_groups_found": asset, "partitioned_groups_found": partitioned, "splits_found": splits}
    out.doc["duplicates"] = summary(findings) | {"split_partitions": splits, "checks": checks_found}


# --- the database source ---------------------------------------------------------------------------


def _from_database(cfg: Config, out: Findings, now: datetime) -> None:
    assert cfg.database_url is not None  # config: required with --source database
    engine = make_engine(parse_url(cfg.database_url), read_only=True, call_timeout=cfg.db_timeout.total_seconds())
    try:
        db = open_airflow_db(engine)
        info = db.info
        out.seen["version"] = info.airflow_version
        out.doc["airflow"] = {"version": info.airflow_version, "schema_family": info.family.value, "exact": info.exact}
        with connect(engine) as conn:
            grants = _read_database(cfg, db, conn, out, now)
        out.doc["duplicates"] = None
        if info.can_duplicate:
            try:
                found_by = enabled.build(cfg, db, Metrics())  # the checks `run` would run here
                out.seen["checks_on"] = tuple(c.kind for c in found_by)
                report = scan(db, now=now, since=out.lookback, dag_filter=_filter(cfg), checks=found_by)
                counts = {k: len(v) for k, v in report.observations.items()}  # the periodic checks', by kind
                _duplicates(report.findings, len(report.observations.get("split_partition", [])), counts, out)
            except DatabaseError as exc:  # e.g. the grant lacks a table the scan reads: said, not fatal
                out.problems.append(f"the scan of the look-back failed: {exc}")
        else:
            out.seen |= {"asset_groups_found": 0, "partitioned_groups_found": 0, "splits_found": 0}
        out.doc["lock_database"] = _lock_database(cfg)
        _remediation(cfg, out, grants)
        _repair_stranded(cfg, out, grants)
    finally:
        engine.dispose()


def _grant_checks(db: AirflowDb, present: set[str], ledger: bool) -> list[tuple[str, str, str]]:
    """(need, table, privilege) for the tables that exist."""
    detect = [*DETECT_TABLES, *(PARTITION_TABLES if db.info.family.has_partitions else ())]
    checks = [("detection", t, "SELECT") for t in detect]
    checks += [("checks", t, "SELECT") for t in CHECK_TABLES]
    checks += [("remediation_backend_db", t, p) for t, p in DB_BACKEND]
    checks += [("repair_stranded", t, p) for t, p in REPAIR_STRANDED]
    if ledger:
        checks += [("ledger", t, p) for t in LEDGER_TABLES for p in LEDGER_PRIVILEGES]
    return [c for c in checks if c[1] in present]


def _read_database(cfg: Config, db: AirflowDb, conn: Connection, out: Findings, now: datetime) -> dict[str, bool]:
    postgres = conn.dialect.name == "postgresql"
    role = server_role(conn)
    out.doc["database"] = {
        "server": None if role is None else role.as_dict(),
        # False: a pooler in transaction or statement mode (PgBouncer) between dupguard and PostgreSQL
        "session_pinned": is_pinned(conn) if postgres else None,
    }
    wanted = {*DETECT_TABLES, *PARTITION_TABLES, *LEDGER_TABLES, "dag", *doctor_reads.SCHEDULE_TABLES}
    wanted |= {*CHECK_TABLES, *(t for t, _ in REPAIR_STRANDED)}  # else their grants are never checked
    present = catalog.existing_tables(conn, wanted | set(doctor_reads.ALIAS_TABLES) | set(doctor_reads.WATCHER_TABLES))
    ledger = set(LEDGER_TABLES) <= present
    grants = _grants(conn, _grant_checks(db, present, ledger), out)
    tables = sorted(present)
    selectable = catalog.table_privileges(conn, [(t, "SELECT") for t in tables])
    readable = {t for t, held in zip(tables, selectable, strict=True) if held}
    ledger_doc: dict[str, Any] = {"setting": cfg.ledger, "exists": ledger if postgres else None}
    if postgres and not ledger:
        ledger_doc["can_create"] = doctor_reads.can_create_schema(conn, SCHEMA)
    elif postgres:
        ledger_doc["schema_usage"] = doctor_reads.can_use_schema(conn, SCHEMA)
    out.doc["ledger"] = ledger_doc
    db_now = catalog.database_now(conn)
    alive = triggerers = None
    if "job" in readable and _has_columns(conn, "job", JOB_HEARTBEAT_COLUMNS, out):
        alive = doctor_reads.schedulers_alive(conn, db_now - SCHEDULER_HEALTH_THRESHOLD)
        triggerers = doctor_reads.triggerers_alive(conn, db_now - TRIGGERER_HEALTH_THRESHOLD)
    out.seen["schedulers_alive"] = out.doc["schedulers_alive"] = alive
    out.seen["triggerers_alive"] = out.doc["triggerers_alive"] = triggerers
    out.doc["dags"] = _dag_counts(conn, readable, out)
    notes = None
    if db.info.can_duplicate and "dag_run_note" in readable:
        notes = doctor_reads.guard_notes_since(conn, db.tables, db_now - out.lookback)
    out.seen["guard_notes"] = notes
    out.doc["guard"] = _guard(notes)
    return grants


def _has_columns(conn: Connection, table: str, wanted: tuple[str, ...], out: Findings) -> bool:
    """True if ``table`` has every column of ``wanted``; else the problem is said (a cut-down or
    foreign schema, e.g. an old demo database) and the figures that need them stay null."""
    missing = [c for c in wanted if c not in catalog.table_columns(conn, [table]).get(table, set())]
    if missing:
        out.problems.append(f"table {table} lacks column {', '.join(missing)}: the figures read from it are unknown")
    return not missing


def _grants(conn: Connection, checks: list[tuple[str, str, str]], out: Findings) -> dict[str, bool]:
    """Each needed privilege, held or not, into the document; ``{"table:PRIVILEGE": held}``."""
    held = catalog.table_privileges(conn, [(t, p) for _, t, p in checks])
    rows = [(n, t, p, h) for (n, t, p), h in zip(checks, held, strict=True)]
    out.doc["grants"] = [{"need": n, "table": t, "privilege": p, "held": h} for n, t, p, h in rows]
    for need in ("detection", "checks"):
        missing = [f"{p} on {t}" for n, t, p, h in rows if not h and n == need]
        if missing:
            out.problems.append(
                f"{need} lacks {', '.join(missing)} (docs/how-to/deploy-kubernetes.md, section 2: Database role)"
            )
    return {f"{t}:{p}": h for _, t, p, h in rows}


def _dag_counts(conn: Connection, readable: set[str], out: Findings) -> dict[str, int | None]:
    """Live (unpaused, not stale) DAGs per kind; None where a table is missing from the grant."""
    counts: dict[str, int | None] = {"asset_scheduled": None, "partitioned": None}
    counts |= {"partitioned_multi_asset": None, "watcher_fed": None}
    refs = [t for t in doctor_reads.SCHEDULE_TABLES if t in readable]
    aliases = [t for t in doctor_reads.ALIAS_TABLES if t in readable]
    if "dag" not in readable or not refs:
        out.problems.append("DAG counts need SELECT on dag and dag_schedule_asset_reference (docs/reference/doctor.md)")
    else:
        columns = catalog.table_columns(conn, ["dag"])["dag"]
        counts["asset_scheduled"] = doctor_reads.scheduled_dag_count(conn, columns, [*refs, *aliases])
        counts["partitioned"] = counts["partitioned_multi_asset"] = 0  # no partitioned assets before 3.2
        if "timetable_partitioned" in columns:
            partitioned = doctor_reads.partitioned_dag_counts(conn, columns, refs[0])
            counts["partitioned"], counts["partitioned_multi_asset"] = partitioned
        watchers = [t for t in doctor_reads.WATCHER_TABLES if t in readable]
        if "dataset" in refs[0]:
            counts["watcher_fed"] = 0  # Airflow 2 has no asset watchers
        elif watchers:
            counts["watcher_fed"] = doctor_reads.watcher_fed_dag_count(conn, columns, refs[0], watchers[0])
    out.seen |= {
        "asset_dags": counts["asset_scheduled"],
        "partitioned_dags": counts["partitioned"],
        "multi_asset_partitioned_dags": counts["partitioned_multi_asset"],
    }
    return counts


def _guard(notes: int | None) -> dict[str, Any]:
    return {
        "notes": notes,
        "active": True if notes else None,
        "how_to_check": None if notes else GUARD_HOW_TO_CHECK,
    }


def _lock_database(cfg: Config) -> dict[str, Any] | None:
    """The leader lock's own URL, when set: a standby or a transaction pooler there matters."""
    if not cfg.lock_database_url:
        return None
    engine = make_engine(parse_url(cfg.lock_database_url), pool_size=1, call_timeout=cfg.db_timeout.total_seconds())
    try:
        with connect(engine) as conn:
            role = server_role(conn)
            pinned = is_pinned(conn) if conn.dialect.name == "postgresql" else None
        return {"server": None if role is None else role.as_dict(), "session_pinned": pinned, "error": None}
    except DatabaseError as exc:
        return {"server": None, "session_pinned": None, "error": str(exc)}
    finally:
        engine.dispose()


# --- remediation readiness ---------------------------------------------------------------------------


def _remediation(cfg: Config, out: Findings, grants: dict[str, bool] | None) -> None:
    acting = cfg.remediation in ("fail", "skip")
    dialect = "postgresql" if grants is not None and out.doc.get("database", {}).get("server") else None
    picked = choice.choose(cfg.remediation_backend, source=cfg.source, dialect=dialect, held=grants)
    doc: dict[str, Any] = {"mode": cfg.remediation, "backend": cfg.remediation_backend, "problems": []}
    if cfg.remediation_backend == "auto":
        # what auto takes on this role, and what that costs (docs/explanation/remediation.md)
        doc["auto"] = {"picks": picked.backend, "why_not_db": picked.why_not_db}
        doc["auto"]["consequence"] = choice.warning(picked) if picked.why_not_db else None
    if picked.backend == "db":
        lacking = choice.lacking(grants or {})
        standby = (out.doc.get("database", {}).get("server") or {}).get("role") == "standby"
        doc["problems"] += [f"the db backend lacks {', '.join(lacking)}"] if lacking else []
        doc["problems"] += ["the database URL reaches a standby: the db backend never writes there"] if standby else []
    else:
        doc["api"] = api_readiness(cfg)
        doc["problems"] += [v for k, v in doc["api"].items() if k == "error" and v]
    if not acting:
        doc["problems"].append(f"DUPGUARD_REMEDIATION={cfg.remediation}: duplicates are not stopped")
    doc["can_act"] = acting and not doc["problems"]
    out.seen["remediation_acts"] = doc["can_act"]
    out.doc["remediation"] = doc


def _repair_stranded(cfg: Config, out: Findings, grants: dict[str, bool] | None) -> None:
    """What the stranded-events repair can do here: it writes only with ``requeue`` and its grant."""
    doc: dict[str, Any] = {"mode": cfg.repair_stranded, "problems": []}
    lacking = [key.replace(":", " ") for t, p in REPAIR_STRANDED if not (grants or {}).get(key := f"{t}:{p}", False)]
    if cfg.repair_stranded == "requeue" and lacking:
        doc["problems"].append(f"DUPGUARD_REPAIR_STRANDED=requeue lacks {', '.join(lacking)}: nothing is re-queued")
    doc["can_act"] = cfg.repair_stranded == "requeue" and not doc["problems"]
    out.doc["repair_stranded"] = doc


def api_readiness(cfg: Config) -> dict[str, Any]:
    """API reachable, credentials accepted, the edit permission held; each None when not reached."""
    from detector.airflowapi.client import Gone, Transient
    from detector.airflowapi.permissions import EDIT_TASK_INSTANCES, READ_RUNS
    from detector.airflowapi.session import Session
    from detector.airflowapi.tokens import Budget

    state: dict[str, Any] = {"url": None, "reachable": None, "credentials": None, "permission": None, "error": None}
    if not cfg.airflow_api_url:
        state["error"] = "DUPGUARD_AIRFLOW_API_URL is not set"
        return state
    session = Session.from_config(cfg)
    state["url"] = session.shown_url
    try:
        session.tokens.get(Budget())  # first: GET /api/v2/version needs a token too
        state["reachable"] = state["credentials"] = True
        session.request("GET", "/api/v2/version", needs=READ_RUNS)
        path = f"/api/v2/dags/{PROBE_DAG}/dagRuns/{PROBE_DAG}/taskInstances/{PROBE_DAG}/dry_run"
        session.request("PATCH", path, body={"new_state": "skipped"}, needs=EDIT_TASK_INSTANCES)
        state["error"] = f"PATCH {path}: answered 2xx for a DAG that should not exist"
    except Gone:
        state["permission"] = True  # past the permission check, the DAG was not found
    except Transient as exc:
        if state["reachable"] is None:
            state["reachable"] = False
        state["error"] = str(exc)
    except AirflowAuthError as exc:
        key = "permission" if "HTTP 403" in str(exc) and state["credentials"] else "credentials"
        state[key] = False
        state["error"] = str(exc)
    except AirflowApiError as exc:
        state["error"] = str(exc)
    finally:
        session.close()
    return state


# --- the REST source -----------------------------------------------------------------------------------


def _from_api(cfg: Config, out: Findings, now: datetime) -> None:
    from detector.airflowapi.client import Gone, Transient
    from detector.app.wiring import api_reader
    from detector.errors import AirflowUnreachable
    from detector.metadb.versions import family_of_version
    from detector.sources.api.scan import scan_api

    reader = api_reader(cfg)
    try:
        try:
            version = reader.version()
            out.seen["version"] = version
            family = family_of_version(version)
            out.doc["airflow"] = {"version": version, "schema_family": family.value, "exact": True}
            result = scan_api(reader, now=now, since=reader.server_now(now) - out.lookback, dag_filter=_filter(cfg))
        except (Transient, Gone) as exc:
            raise AirflowUnreachable(str(exc)) from None
        _duplicates(result.findings, 0, {}, out)  # the periodic checks read the database
        notes = sum(p.guarded for f in result.findings for p in f.progress.values())
        out.seen |= {"guard_notes": notes, "splits_found": None}
        out.doc["guard"] = _guard(notes)
        for name in ("database", "lock_database", "schedulers_alive", "triggerers_alive", "grants", "ledger"):
            out.doc[name] = None
        out.doc["dags"] = dict.fromkeys(("asset_scheduled", "partitioned", "partitioned_multi_asset", "watcher_fed"))
        out.doc["duplicates"]["split_partitions"] = None  # the REST API does not show pending partition rows
        out.problems.append("--source api: schedulers alive, DAG counts and split keys need the database")
        _remediation(cfg, out, None)
    finally:
        reader.http.close()


def _filter(cfg: Config) -> DagFilter:
    return DagFilter(cfg.dags, cfg.exclude_dags)


# --- output ----------------------------------------------------------------------------------------------


def error_json(exit_code: int, message: str) -> str:
    """The document when the doctor could not run (bad settings: 2; the source unreadable: 3)."""
    return json.dumps({"format_version": FORMAT_VERSION, "exit_code": exit_code, "error": message}, indent=2)


def as_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2)


def _yes(value: object) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):  # counts are ints: only a real bool reads yes/NO
        return "yes" if value else "NO"
    return str(value)


def as_table(doc: dict[str, Any]) -> str:
    """Two columns, one line per check; every value escaped for the terminal (``logs.printable``)."""
    airflow = doc.get("airflow") or {}
    rows: list[tuple[str, str]] = [("Airflow", f"{airflow.get('version')} (source {doc['source']})")]
    for path in doc["code_paths"]:
        state = path["status"] + ("" if path["status"] == "not_affected" else f", protected {_yes(path['protected'])}")
        rows.append((f"  {path['name']} ({', '.join(path['issues'])})", f"{state}: {path['why']}"))
    rows.append(("The rest of the HA family", "named, watched by dupguard's checks; no effect on the verdict"))
    for risk in doc.get("family", []):
        state = risk["status"] + ("" if risk["status"] == "not_affected" else f", watched {_yes(risk['watched'])}")
        rows.append((f"  {risk['name']} ({', '.join(risk['issues'])})", f"{state}: {risk['why']}"))
    rows.append(("Schedulers alive", _yes(doc.get("schedulers_alive"))))
    rows.append(("Triggerers alive", _yes(doc.get("triggerers_alive"))))
    for kind, count in (doc.get("dags") or {}).items():
        rows.append((f"DAGs {kind}", _yes(count)))
    dups = doc.get("duplicates")
    if dups is not None:
        shown = f"{dups['groups']} group(s), {dups['duplicate_runs']} duplicate run(s)"
        rows.append(
            (
                f"Duplicates, {doc['lookback_days']:g} days",
                f"{shown}, {_yes(dups['split_partitions'])} split partition key(s)",
            )
        )
    database = doc.get("database")
    if database is not None:
        server = (database.get("server") or {}).get("role", "sqlite")
        rows.append(("Database server", f"{server}, session pinned {_yes(database['session_pinned'])}"))
    lacking = [f"{g['privilege']} {g['table']} ({g['need']})" for g in doc.get("grants") or [] if not g["held"]]
    if doc.get("grants") is not None:
        rows.append(("Grants missing", ", ".join(lacking) or "none"))
    if doc.get("ledger") is not None:
        rows.append(("Ledger", f"setting {doc['ledger']['setting']}, exists {_yes(doc['ledger']['exists'])}"))
    rem = doc["remediation"]
    rows.append(("Remediation", f"{rem['mode']} via {rem['backend']}, can act {_yes(rem['can_act'])}"))
    for key in ("reachable", "credentials", "permission"):
        if "api" in rem:
            rows.append((f"  API {key}", _yes(rem["api"][key])))
    rows += [("  problem", p) for p in rem["problems"]]
    guard = doc["guard"]
    how = "" if guard["active"] else f": {GUARD_HOW_TO_CHECK}"
    rows.append(("Guard", f"{_yes(guard['notes'])} note(s) in {doc['lookback_days']:g} days{how}"))
    rows += [("Could not read", p) for p in doc["problems"]]
    left = doc["at_risk_unprotected"]
    rows.append(("Verdict", "AT RISK, unprotected: " + ", ".join(left) if left else "nothing at risk, or protected"))
    width = max(len(k) for k, _ in rows)
    return "".join(logs.printable(f"{k.ljust(width)}  {v}") + "\n" for k, v in rows)
