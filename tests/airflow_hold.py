"""Hold real Airflow API servers for a mutation run (tests.airflow_server, "Held servers").

    python -m tests.airflow_hold OUT.json VERSION:JWT_SECONDS:SCENARIO[,SCENARIO...] ...

starts one server per spec with ``airflow_api_server`` (the tests' own helper), writes what the tests
need to find them to ``OUT.json`` once all answer, and keeps them until SIGTERM or SIGINT; then stops
them and drops their databases. Point ``DUPGUARD_TEST_AIRFLOW_SERVERS`` at ``OUT.json`` and every
pytest started meanwhile (one per mutant) uses these instead of starting its own. Each test still
re-creates the live database from its scenario, as with a server of its own.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.airflow_server import airflow_api_server
from tests.pg import Templates


def parse(spec: str) -> tuple[str, int, list[str]]:
    version, jwt, scenarios = spec.split(":", 2)
    return version, int(jwt), scenarios.split(",")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, specs = Path(argv[0]), [parse(s) for s in argv[1:]]
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    templates = Templates(made={})
    workdir = Path(tempfile.mkdtemp(prefix="airflow-hold-"))
    try:
        with contextlib.ExitStack() as stack:
            held: list[dict[str, Any]] = []
            for i, (version, jwt, scenarios) in enumerate(specs):
                home = workdir / str(i)  # two servers of one version must not share an AIRFLOW_HOME
                server = stack.enter_context(
                    airflow_api_server(version, scenarios, templates, home, jwt_expiration=jwt)
                )
                held.append(
                    {
                        "version": version,
                        "jwt_expiration": jwt,
                        "url": server.url,
                        "port": server.port,
                        "live_db": server.live_db,
                        "sources": server.sources,
                        "log_path": str(server.log_path),
                        "pid": server.process.pid,
                    }
                )
            out.write_text(json.dumps(held, indent=1))
            print(f"holding {len(held)} server(s): {out}", flush=True)
            stop.wait()
    finally:
        out.unlink(missing_ok=True)
        templates.drop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
