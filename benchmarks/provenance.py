"""Which code a result was measured on: stored in every result file, so a figure can be traced to it."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.rstrip()  # not strip(): porcelain lines start with a space


def provenance() -> dict[str, Any]:
    """The commit, the measured code's uncommitted changes (a result of a dirty tree says so) and the load."""
    return {
        "commit": _git("rev-parse", "--short=12", "HEAD").strip(),
        # Only the shipped code counts: uncommitted tests or docs do not change a figure.
        "uncommitted_code": _git("status", "--porcelain", "--", "detector").splitlines(),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
