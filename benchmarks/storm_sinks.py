"""Requests per alert sink per minute in a storm, on each path that sends them: real daemons
(``tests.daemon_harness``: the real source, ledger, leader lock and ``db`` remediation in ``fail`` mode,
as benchmarks/storm.py) whose alerter is the real dispatcher with the real channels (Slack bot, Slack
incoming webhook, JSON webhook, Alertmanager; the log always), sending to local servers that speak
those APIs (``tests.sinks``: the Slack stand-in and a real Alertmanager behind a counting proxy).

    .venv/bin/python -m benchmarks.storm_sinks --path first|pickup|restart --groups 1000 [--name NAME]
        [--requests-per-minute N]   # DUPGUARD_ALERT_REQUESTS_PER_MINUTE; 100000: no bound, as before it

- ``first``: one replica leads through the whole storm.
- ``pickup``: two replicas; once every group was detected and a tenth of the duplicates were stopped,
  the leader stops; the standby takes over and picks up the pending stops.
- ``restart``: one replica; at the same moment it is stopped and started again, and the new process
  picks up its own pending stops.

Each sink's requests are counted where they arrive; ``max_per_60s`` is the most in any 60 s window
of the whole run, ``max_per_60s_on_path`` the same from the failover or restart on (the path
measured). The run goes on ``--tail`` seconds after the last duplicate was stopped or reported, so
the late digests and Alertmanager's re-sends are counted. ``log_events_max_per_60s``: the log sink
writes one line per group by design (every group is logged at once); it sends no requests.

Writes benchmarks/results/<name>.json (default storm-sinks-<path>-<groups>) with its provenance.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.provenance import provenance
from benchmarks.storm import SETTINGS
from detector.actions.alerts.dispatch import Dispatcher
from detector.config import Config
from detector.core.ports import Ledger
from detector.metrics import Metrics
from tests.daemon_harness import ForwardingAlerter, Running, failed_runs, start_daemon
from tests.pg import Templates
from tests.sinks import SINKS, Sinks, per_minute
from tests.writer import AirflowWriter

RESULTS = Path(__file__).resolve().parent / "results"
PATHS = ("first", "pickup", "restart")


def _counts(daemons: list[Running], outcome: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for d in daemons:
        for channel in ("slack", "slack_webhook", "webhook", "alertmanager"):
            value = d.metrics.registry.get_sample_value(
                "dupguard_alerts_total", {"channel": channel, "outcome": outcome}
            )
            found[channel] = found.get(channel, 0) + int(value or 0)
    return found


def run(path: str, groups: int, limit: float, tail: float, bound: int = 20) -> dict[str, Any]:
    templates = Templates(made={})
    url = templates.clone("3.1.2")
    writer = AirflowWriter(url)
    sinks = Sinks()
    every: list[Running] = []  # every daemon this run started, for its counters
    daemons: list[Running] = []

    def factory(config: Config, ledger: Ledger, metrics: Metrics) -> Dispatcher:
        return sinks.alerter(config, ledger, metrics)

    def start() -> Running:
        settings = SETTINGS | sinks.settings() | {"alert_requests_per_minute": bound}
        d = start_daemon(url, real_remediation=True, alerter_factory=factory, **settings)
        every.append(d)
        daemons.append(d)
        return d

    try:
        for _ in range(2 if path == "pickup" else 1):
            start()
        deadline = time.monotonic() + 30
        while not any(d.is_leader() and d.daemon.parts.leadership.waiting() is None for d in daemons):
            if time.monotonic() > deadline:
                raise RuntimeError("no leader")
            time.sleep(0.05)
        leader = next(d for d in daemons if d.is_leader())
        started = time.monotonic()
        pairs = writer.storm(groups)
        committed = datetime.now(UTC)
        dups = [dup for _, dup in pairs]
        detected_at = finished_at = switched_at = None
        while time.monotonic() - started < limit:
            seen = {r for d in every for e in d.alerter.detected() for r in (x.run_id for x in e.finding.runs)}
            if detected_at is None and all(dup in seen for dup in dups):
                detected_at = time.monotonic() - started
            stopped = failed_runs(url, dups)
            reported = {run for d in every for run in d.alerter.results()}
            if path != "first" and switched_at is None and detected_at is not None and stopped >= groups // 10:
                leader.stop()  # a clean stop, as SIGTERM does
                daemons.remove(leader)
                switched_at = time.monotonic()
                if path == "restart":
                    start()
            if detected_at is not None and (stopped == groups or set(dups) <= reported):
                finished_at = time.monotonic() - started
                break
            time.sleep(0.5)
        time.sleep(tail)  # the late digests and Alertmanager's re-sends
        times = sinks.times()
        log_times = [t for d in every if isinstance(d.alerter, ForwardingAlerter) for t in d.alerter.times]
        since = switched_at if switched_at is not None else started
        return {
            "path": path,
            "groups": groups,
            "alert_requests_per_minute": bound,
            "committed_at": committed.isoformat(),
            "all_detected_s": None if detected_at is None else round(detected_at, 2),
            "all_stopped_or_reported_s": None if finished_at is None else round(finished_at, 2),
            "switched_at_s": None if switched_at is None else round(switched_at - started, 2),
            "tail_s": tail,
            "stopped": failed_runs(url, dups),
            "requests": {sink: len(times[sink]) for sink in SINKS},
            "max_per_60s": {sink: per_minute(times[sink]) for sink in SINKS},
            "max_per_60s_on_path": {sink: per_minute(times[sink], since) for sink in SINKS},
            "log_events_max_per_60s": per_minute(log_times),
            "alerts_sent": _counts(every, "sent"),
            "alerts_failed": _counts(every, "failed"),
            "alerts_deduplicated": _counts(every, "deduplicated"),
            "slack_rejected": len(sinks.rejected()),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    finally:
        for d in daemons:
            d.stop()
        sinks.stop()
        writer.close()
        templates.drop_all()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", required=True, choices=PATHS)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--limit", type=float, default=600.0, help="seconds before giving up")
    parser.add_argument("--tail", type=float, default=75.0, help="seconds counted after the storm's end")
    parser.add_argument("--requests-per-minute", type=int, default=20, help="the bound; 100000: none")
    parser.add_argument("--name", default=None)
    args = parser.parse_args(argv)
    row = run(args.path, args.groups, args.limit, args.tail, args.requests_per_minute)
    settings = {k: str(v) for k, v in SETTINGS.items()} | {
        "alert_storm_threshold": "5 (default)",
        "alert_requests_per_minute": str(args.requests_per_minute),
        "digest_delay_s": "10 (production's)",
    }
    out = {"provenance": provenance(), "settings": settings, "rows": [row]}
    name = args.name or f"storm-sinks-{args.path}-{args.groups}" + (
        "" if args.requests_per_minute == 20 else f"-{args.requests_per_minute}rpm"
    )
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
