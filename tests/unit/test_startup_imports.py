"""Start-up cost: a sidecar restarts with its scheduler at every deploy, and until it has
imported its code it cannot lead. The database source (the default) must not import Airflow's REST
client (apache-airflow-client: about a second and ~30 MB on the project's machine); only the REST
source and the ``api`` remediation backend do, when they are built."""

from __future__ import annotations

import subprocess
import sys


def test_the_database_daemon_does_not_import_the_rest_client() -> None:
    code = (
        "import sys, detector.app.cli, detector.app.run, detector.app.wiring, detector.app.daemon\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'airflow_client'))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()
    assert out == "[]", out
