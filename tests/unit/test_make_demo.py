"""`make demo`: installs the package alone (not the test tools), and its closing hint names a
`dupguard` that works as printed, on PATH or not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DUPGUARD = Path(sys.executable).parent / "dupguard"


def _recipe(target: str) -> str:
    lines = (ROOT / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return "\n".join(body)


def test_make_demo_installs_the_package_without_the_test_extra() -> None:
    recipe = _recipe("demo")
    assert 'scripts/bootstrap.sh ""' in recipe and "bootstrap.sh test" not in recipe
    bootstrap = (ROOT / "scripts/bootstrap.sh").read_text(encoding="utf-8")
    assert 'EXTRAS="${1-test}"' in bootstrap  # "" stays empty; no argument still means the test tools


def _hint(path_env: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {"PATH": path_env}
    db = tmp_path / "demo.db"
    done = subprocess.run(
        [str(DUPGUARD), "demo", "--db", str(db)], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    hint = next(line for line in done.stdout.splitlines() if line.startswith("Try: "))
    return hint.removeprefix("Try: "), env


def test_hint_works_as_printed_when_dupguard_is_not_on_path(tmp_path: Path) -> None:
    command, env = _hint("/usr/bin:/bin", tmp_path)
    assert not command.startswith("dupguard ")
    ran = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert ran.returncode == 1, ran.stderr  # 1: it found the demo's duplicates


def test_hint_says_dupguard_when_it_is_on_path(tmp_path: Path) -> None:
    command, _ = _hint(f"{DUPGUARD.parent}:/usr/bin:/bin", tmp_path)
    assert command.startswith("dupguard scan --database-url sqlite:///")
