"""A real full filesystem for ledger tests (a full disk must lose nothing): a 256 KiB tmpfs mounted for the test.

Needs the right to mount (root, as the project's test machines and CI run); elsewhere the test
using it is skipped, saying why."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_volume(where: Path, size: str = "256k") -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def fill(volume: Path) -> Path:
    """Write a file until the volume is full; the file (delete it to free the space)."""
    filler = volume / "filler"
    with filler.open("wb", buffering=0) as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 4096)
    return filler
