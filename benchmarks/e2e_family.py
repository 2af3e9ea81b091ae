"""The rest of the HA family end to end (docs/explanation/checks.md): a real HA Airflow with two triggerers, and
dupguard's periodic checks against what Airflow recorded.

One cluster (``tests/e2e/harness.py``): two schedulers (LocalExecutor), **two triggerers** with the
AssetWatcher consumer (``tests/e2e/dags_watcher``: the harness writes the file the watcher's
``FileDeleteTrigger`` waits for every ``--watch-interval`` s), the producer feeding ``consumer_serial``
(``max_active_runs=1``) and the other consumers in bursts, one ``dupguard run`` replica in dry-run with
every check on. The truth (``tests/e2e/family.py``): triggers each triggerer logged starting, the
watcher's asset events against the files written, and events no run of their DAG consumed though a
later run was queued, with no queue row left.

    .venv/bin/python -m benchmarks.e2e_family --airflow 3.1.2 --duration 120 --tag 20261201

With ``--bursts N`` the bursts of ``tests/e2e/dags_bursts`` (N events every ``--burst-gap`` s, a
``max_active_runs=1`` consumer and a default one) run too, and the report's ``stranded_judged`` holds
every event passed over by a run of its DAG (Airflow's records) against dupguard's stranded events:

    .venv/bin/python -m benchmarks.e2e_family --airflow 3.1.2 --duration 180 --bursts 6 --burst-gap 20 \
        --stranded-poll 5 --tag 20261201-stranded

With ``--sqs-messages N`` the watcher is the AWS provider's ``SqsSensorTrigger`` on moto's SQS server instead
(``tests/e2e/dags_sqs``): N messages over ``--duration``, each receive with ``--sqs-visibility-timeout``
(0: a copy that polls before the other deleted the message receives it too; ``queue``: the queue's
30 s), ``consumer_sqs``'s task ``--sqs-task-seconds``; the report's ``family.sqs`` holds the truth per
message id from Airflow's records against dupguard's ``trigger_event`` groups (``tests/e2e/family_sqs.py``):

    .venv/bin/python -m benchmarks.e2e_family --airflow 3.1.2 --duration 120 --sqs-messages 60 --tag 20261202-sqs

Writes ``benchmarks/results/e2e_family-<airflow>-<tag>.json`` (the harness's report with its
``family`` section, and provenance).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.provenance import provenance
from tests.e2e.harness import RunSpec, run

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--airflow", default="3.1.2")
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--watch-interval", type=float, default=2.0)
    parser.add_argument("--serial-seconds", type=float, default=8.0, help="consumer_serial's task duration")
    parser.add_argument("--bursts", type=int, default=0, help="events per burst of producer_bursts (0: none)")
    parser.add_argument("--burst-gap", type=float, default=20.0, help="seconds producer_bursts waits before each")
    parser.add_argument("--burst-serial-seconds", type=float, default=6.0, help="consumer_burst_serial's task")
    parser.add_argument("--stranded-poll", type=float, default=0.0, help="DUPGUARD_STRANDED_POLL_INTERVAL, s")
    parser.add_argument("--sqs-messages", type=int, default=0, help="SQS watcher instead of the file one (0: file)")
    parser.add_argument("--sqs-visibility-timeout", default="0", help="seconds, or 'queue' for the queue's own")
    parser.add_argument("--sqs-task-seconds", type=float, default=8.0, help="consumer_sqs's task duration")
    parser.add_argument("--mode", default="dry-run", help="dupguard's remediation mode")
    parser.add_argument("--backend", default="api", help="dupguard's remediation backend (api | db)")
    parser.add_argument("--tag", default="run")
    args = parser.parse_args()
    spec = RunSpec(
        name=f"family-{args.airflow}",
        airflow_version=args.airflow,
        watcher=not args.sqs_messages,
        triggerers=2,
        watch_interval=args.watch_interval,
        serial_task_seconds=args.serial_seconds,
        bursts=args.bursts,
        burst_gap=args.burst_gap,
        burst_serial_seconds=args.burst_serial_seconds,
        stranded_poll_interval=args.stranded_poll,
        sqs_messages=args.sqs_messages,
        sqs_visibility_timeout=None if args.sqs_visibility_timeout == "queue" else int(args.sqs_visibility_timeout),
        sqs_task_seconds=args.sqs_task_seconds,
        mode=args.mode,
        backend=args.backend,
        duration=args.duration,
    )
    with tempfile.TemporaryDirectory(prefix="dupguard-family-") as tmp:
        report = run(spec, Path(tmp) / "run")
    out = RESULTS / f"e2e_family-{args.airflow}-{args.tag}.json"
    out.write_text(json.dumps({"provenance": provenance(), "report": report}, indent=2, default=str))
    family = dict(report.get("family") or {})
    family.get("truth", {}).pop("passed_over_events", None)  # in the file; too long for the terminal
    print(json.dumps(family, indent=2, default=str))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
