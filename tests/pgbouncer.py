"""A real PgBouncer (Debian's ``pgbouncer``) in front of the test PostgreSQL, one private instance per
test on a free port, in the pool mode asked for.

Installed from Debian when missing and running as root (CI), like scripts/postgres.sh does for
PostgreSQL. PgBouncer refuses to run as root: it then runs as the ``postgres`` OS user, from a
directory that user can enter. Any client user is admitted (``auth_type = any``); every server
connection logs in as the test server's superuser.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url

BINARY = "/usr/sbin/pgbouncer"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_installed() -> str:
    if os.access(BINARY, os.X_OK):
        return BINARY
    if os.geteuid() != 0:
        raise RuntimeError("pgbouncer is not installed: apt-get install -y pgbouncer (or run the tests as root)")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "pgbouncer"], check=True, env=env, capture_output=True)
    return BINARY


@contextmanager
def pgbouncer(upstream_url: str, pool_mode: str, *, pool_size: int = 20) -> Iterator[str]:
    """Start PgBouncer in ``pool_mode`` in front of ``upstream_url``'s server; yield a URL for the same
    database through it (and a client of our own application name); stop it afterwards. ``pool_size``:
    server connections per database and user."""
    binary = ensure_installed()
    upstream = make_url(upstream_url)
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="dupguard-pgbouncer-"))
    workdir.chmod(0o777)  # the postgres OS user writes its log and pid file here
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        "[databases]\n"
        f"* = host={upstream.host} port={upstream.port} user={upstream.username}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = any\n"
        f"pool_mode = {pool_mode}\n"
        "max_client_conn = 500\n"
        f"default_pool_size = {pool_size}\n"
        "server_login_retry = 1\n"
        f"logfile = {workdir / 'pgbouncer.log'}\n"
        f"pidfile = {workdir / 'pgbouncer.pid'}\n"
    )
    ini.chmod(0o644)
    command = [binary, str(ini)]
    procs = [_start(command)]  # restart() appends
    url = upstream.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    try:
        _wait_listening(port, procs[-1])
        _running[url] = (command, port, procs)
        yield url
    finally:
        _running.pop(url, None)
        _stop(procs[-1])
        shutil.rmtree(workdir, ignore_errors=True)


# url -> (command, port, its processes, the running one last): what restart() needs
_running: dict[str, tuple[list[str], int, list[subprocess.Popen[bytes]]]] = {}


def restart(url: str) -> None:
    """Stop the PgBouncer serving ``url`` (every client and server connection closes, as in a pod
    restart) and start it again on the same port; returns once it listens."""
    command, port, procs = _running[url]
    _stop(procs[-1])
    procs.append(_start(command))
    _wait_listening(port, procs[-1])


def _start(command: list[str]) -> subprocess.Popen[bytes]:
    # As root, PgBouncer itself is the child, switched to the postgres user by Popen: under runuser the
    # SIGTERM of _stop reached runuser, which forwards it and then sleeps 2 s before a SIGKILL whether
    # or not PgBouncer has exited (2 s per stop, most of test_lock_pinning's teardown).
    root = os.geteuid() == 0
    user = "postgres" if root else None
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        user=user,
        group=user,
        extra_groups=[] if root else None,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)  # immediate shutdown (SIGINT would wait for every client)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
    if proc.stderr is not None:
        proc.stderr.close()


def _wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise RuntimeError(f"pgbouncer exited with {proc.returncode}: {err.strip()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("pgbouncer did not start listening within 15 s")
