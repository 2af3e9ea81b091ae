"""Which code a result was measured on: stored in every result file, so a figure can be traced to it."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The measured code and the code that measures it; results, docs and tests do not change a figure.
CODE = ("detector", "benchmarks", ":(exclude)benchmarks/results")


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.rstrip()  # not strip(): porcelain lines start with a space


def provenance() -> dict[str, Any]:
    """The commit, whether its code was clean, the command, the time and the machine's load."""
    uncommitted = _git("status", "--porcelain", "--", *CODE).splitlines()
    return {
        "commit": _git("rev-parse", "--short=12", "HEAD").strip(),
        "clean": not uncommitted,
        # Each line is `XY path`: a renderer refuses a figure whose measured paths appear here.
        "uncommitted_code": uncommitted,
        "command": shlex.join(sys.orig_argv),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
