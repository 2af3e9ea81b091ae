"""Bad input, fuzz-style: every flag, env var and config-file key fed malformed values.

Whatever the value, dupguard answers with exit 0 (the value is acceptable), 2 (bad usage, one
message naming the setting) or 3 (the database) — never an exception or a traceback, and never
exit 1, which ``scan`` reserves for "duplicates found". Values that pass validation are then given
to a real ``run --once`` on the demo database, where the rest of the faults used to surface
(a 100-year look-back overflowing ``now - lookback``).

A run's outcome is a function of the configuration it loads, so each distinct configuration is run once
per setting: a channel (env var, ``_FILE``, YAML key) that yields one already run is still parsed, but
not run again (the flag, env and YAML forms of one value mostly load the same Config; about a third of
the runs remain).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from detector import config
from detector.app import demo
from detector.app.cli import main
from detector.config import SETTINGS, Config
from detector.errors import ConfigError
from detector.settings import Setting

MALFORMED = (
    "",
    " ",
    "abc",
    "-1",
    "0",
    "1e999",
    "nan",
    "inf",
    "99999999999999999999999",
    "999999999d",
    "99999999999d",
    "-5s",
    "1h30x",
    "é☃💥",
    "x" * 5000,
    "[",
    "{a: b}",
    "%s%n%%",
    "http://",
    "https://h:abc/",
    "http://[::1",
    "postgresql://u:p@127.0.0.1:abc/db",
    "postgresql://u:p@ss@127.0.0.1:1/db",
    "postgresql://u@127.0.0.1:1/db?password=pw&sslmode=nonsense",
    "sqlite:///",
    "sqlite:////no/such/dir/x.db",
    "mysql://u:p@h/db",
    "://",
    "postgresql://[",
    "\t\n",
)
# Only a YAML file can hold these: structures, other scalar types, a NUL byte.
YAML_ONLY = ("[1, [2]]", "{a: 1}", "1.5", "true", "2024-01-01", "!!binary aGVsbG8=", '"a\\0b"', "null", "~")


@pytest.fixture(scope="module")
def demo_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("demo") / "airflow.db"
    demo.build(path)
    return f"sqlite:///{path}"


@pytest.fixture(autouse=True)
def _keep_signal_handlers() -> Iterator[None]:
    """``run`` installs SIGTERM/SIGINT handlers; give pytest its own back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def _outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``dupguard argv`` in-process: its exit code and stderr; an exception fails the test by itself."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def _check(argv: list[str], capsys: pytest.CaptureFixture[str], *, names: tuple[str, ...]) -> int:
    """Run ``dupguard argv`` in-process: 0, 2 or 3, a 2 names the setting, a 3 is one line."""
    code, err = _outcome(argv, capsys)
    assert "Traceback" not in err, err
    assert code in (0, 2, 3), (argv[:6], code, err[-500:])
    if code == 2 and "invalid configuration" in err:
        assert any(n in err for n in names), (names, err[-500:])  # the message names the culprit
    if code == 3:
        assert len(err.strip().splitlines()) == 1, err
    return code


def _names(s: Setting) -> tuple[str, ...]:
    return (s.flag, s.env, f"key {s.name}", "DUPGUARD_DATABASE_URL", "database URL")


class _Runs:
    """``run --once`` for each distinct configuration: a repeat is answered with the first run's exit code.

    The key is the Config that ``config.load`` builds from the same flags, environment and file the run
    is given; each real run is checked to have loaded that very Config (a spy on ``config.load``), so
    the key cannot drift from what ``run`` does. An input ``config.load`` rejects is always run (that
    costs a parse) to see exit 2 and the message naming the setting."""

    def __init__(self, run: list[str], names: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
        self.run, self.names, self.codes = run, names, dict[Config, int]()
        self.loaded: list[Config] = []
        real_load = config.load

        def spy(*args: Any, **kwargs: Any) -> Config:
            cfg = real_load(*args, **kwargs)
            self.loaded.append(cfg)
            return cfg

        self._load = real_load
        monkeypatch.setattr(config, "load", spy)

    def __call__(self, extra: list[str], flags: dict[str, str], capsys: pytest.CaptureFixture[str]) -> int:
        """The exit code of ``run --once`` with ``extra`` arguments (``flags``: their settings by name)."""
        config_file = extra[extra.index("--config") + 1] if "--config" in extra else None
        try:
            cfg: Config | None = self._load(flags, os.environ, config_file)
        except ConfigError:
            cfg = None
        if cfg is not None and cfg in self.codes:
            return self.codes[cfg]
        self.loaded.clear()
        code = _check([*self.run, *extra], capsys, names=self.names)
        if cfg is not None:
            assert self.loaded, "the run did not load a configuration"
            # by name only: the values are secrets for some settings
            assert [f.name for f in fields(cfg) if getattr(cfg, f.name) != getattr(self.loaded[0], f.name)] == []
            self.codes[cfg] = code
        return code


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_every_setting_malformed_everywhere(
    setting: Setting,
    demo_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each setting, as a flag, an env var, a ``_FILE`` (secrets) and a YAML key, with every malformed
    value, given to a real ``run --once`` on the demo database (once per distinct configuration): 0, 2
    or 3, never an exception; and ``check-config`` agrees with ``run`` on what is acceptable."""
    for s in SETTINGS:
        monkeypatch.delenv(s.env, raising=False)
        monkeypatch.delenv(s.env + "_FILE", raising=False)
    monkeypatch.delenv("DUPGUARD_CONFIG", raising=False)
    base = [] if setting.name == "database_url" else ["--database-url", demo_url]
    flags = {"log_level": "error"} | ({} if setting.name == "database_url" else {"database_url": demo_url})
    run = _Runs(["run", "--once", "--log-level", "error", *base], _names(setting), monkeypatch)
    for value in MALFORMED:
        code = run([f"{setting.flag}={value}"], {**flags, setting.name: value}, capsys)
        checked = _check(["check-config", *base, f"{setting.flag}={value}"], capsys, names=_names(setting))
        assert checked == (2 if code == 2 else 0), (value, code, checked)
        if "\n" not in value and value.strip():
            monkeypatch.setenv(setting.env, value)
            run([], flags, capsys)
            monkeypatch.delenv(setting.env)
        if setting.secret:
            secret_file = tmp_path / "secret"
            secret_file.write_text(value)
            monkeypatch.setenv(setting.env + "_FILE", str(secret_file))
            run([], flags, capsys)
            monkeypatch.delenv(setting.env + "_FILE")
    for yaml_value in (*(repr(v) for v in MALFORMED if "\t" not in v), *YAML_ONLY):
        cfg = tmp_path / "c.yaml"
        cfg.write_text(f"{setting.name}: {yaml_value}\n")
        run(["--config", str(cfg)], flags, capsys)
    assert run.codes, "no value was accepted: every setting has one (the YAML null at least)"


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe\x00garbage",
        b"1: 2\nfoo: 3\n",
        b"[1, 2]\n",
        b"? [a, b]\n: c\n",
        b"a: [unclosed\n",
        b"- - -\n",
        b"[" * 600 + b"]" * 600,  # PyYAML recurses per level: a RecursionError traceback and exit 1 before
        b"cluster_name: " + b"{a: " * 600 + b"1" + b"}" * 600,
    ],
    ids=["not-utf8", "mixed-keys", "a-list", "complex-key", "bad-yaml", "nested-lists", "600-deep", "600-deep-value"],
)
def test_malformed_config_files(content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config file that is not UTF-8, not a mapping, or has non-string keys is exit 2, one problem each."""
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(content)
    assert _check(["check-config", "--config", str(cfg)], capsys, names=(str(cfg),)) == 2


def test_config_file_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file, a folder, an unreadable name: exit 2 naming the file."""
    for path in (tmp_path / "missing.yaml", tmp_path):
        assert _check(["check-config", "--config", str(path)], capsys, names=(str(path),)) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["scan", "--since", "999999999d"],
        ["scan", "--since", "nan"],
        ["scan", "--suspect-window", "-1"],
        ["scan", "--suspect-window", "1e999"],
        ["scan", "--format", "xml"],
        ["demo", "--format", "yaml"],
        ["init-db", "--database-url", "postgresql://u:p@h:abc/db"],
        ["init-db", "--database-url", "mysql://u:p@h/db"],
        ["init-db", "--database-url", "sqlite:///x.db"],
        ["check-config", "--no-such-flag"],
        ["no-such-command"],
    ],
)
def test_other_subcommands_malformed(argv: list[str], demo_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """scan, demo, init-db and unknown flags: usage errors are 2, never a traceback."""
    if argv[0] == "scan":
        argv = [*argv, "--database-url", demo_url]
    assert _check(argv, capsys, names=("--", "database URL", "SQLite")) == 2


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@127.0.0.1:abc/db",
        "postgresql://u:p@127.0.0.1:99999/db",
        "postgresql://[/db",
        "sqlite:////no/such/dir/airflow.db",
        "postgres://u:p@127.0.0.1:1/db",
    ],
)
def test_scan_database_urls(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Malformed URLs are 2; well-formed ones that cannot be opened are 3."""
    _check(["scan", "--database-url", url], capsys, names=("database URL",))


# --- the cases named in the issue, as real processes ----------------------------------------


def _busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def busy_port() -> Iterator[int]:
    yield from _busy_port()


def _dupguard(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "detector", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", **(env or {})},
        check=False,
    )


def test_named_cases_exit_2_one_line(
    tmp_path: Path, demo_url: str, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each input the issue found tracebacking (exit 1) now exits 2 with a message naming the problem.

    In-process (``main`` is what ``python -m detector`` runs: a process per case cost ~1 s of imports
    each); the first case also as a real process, for the exit code a shell sees."""
    non_utf8 = tmp_path / "latin1.yaml"
    non_utf8.write_bytes("cluster_name: caf\xe9\n".encode("latin-1"))
    int_keys = tmp_path / "keys.yaml"
    int_keys.write_text("1: 2\ncluster_name: x\n")
    user_file = tmp_path / "airflow.db"
    cases = {
        "port": (["scan", "--database-url", "postgresql://u:p@127.0.0.1:abc/db"], "port"),
        "since": (["scan", "--database-url", demo_url, "--since", "999999999d"], "--since"),
        "lookback": (["run", "--once", "--database-url", demo_url, "--startup-lookback", "99999999999d"], "lookback"),
        "yaml keys": (["run", "--once", "--database-url", demo_url, "--config", str(int_keys)], "unknown setting 1"),
        "non-utf8": (["run", "--once", "--database-url", demo_url, "--config", str(non_utf8)], "not UTF-8"),
        "http port": (["run", "--database-url", demo_url, "--http-port", str(busy_port)], str(busy_port)),
        "demo folder": (["demo", "--db", str(tmp_path)], "folder"),
        "demo no folder": (["demo", "--db", str(tmp_path / "no" / "x.db")], "does not exist"),
        "demo user file": (["demo", "--db", str(user_file)], "refusing"),
    }
    user_file.write_bytes(b"SQLite format 3\x00 a user's own database")
    done = _dupguard(*cases["port"][0])
    outcomes = {"port as a process": (done.returncode, done.stderr, cases["port"][1])}
    outcomes |= {name: (*_outcome(argv, capsys), needle) for name, (argv, needle) in cases.items()}
    for name, (code, err, needle) in outcomes.items():
        lines = [line for line in err.splitlines() if not line.startswith("{")]  # JSON log lines
        assert code == 2, (name, code, err[-800:])
        assert "Traceback" not in err, (name, err)
        assert needle in err, (name, err)
        assert lines and lines[0].startswith(("dupguard: ", "usage:")), (name, lines)
    assert user_file.read_bytes() == b"SQLite format 3\x00 a user's own database"


def test_run_once_unusable_database_exits_3(tmp_path: Path) -> None:
    """``run --once`` on a database it cannot use answers 3 at once instead of retrying forever."""
    for url in ("postgresql://u:p@127.0.0.1:1/db", f"sqlite:///{tmp_path / 'missing.db'}"):
        done = _dupguard("run", "--once", "--database-url", url, "--log-level", "error")
        assert done.returncode == 3, done.stderr
        assert done.stderr.strip().splitlines()[-1].startswith("dupguard: database "), done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "missing.db").exists()  # read-only: nothing created
