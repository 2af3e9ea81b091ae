"""A real Airflow API server for the remediation tests and benchmarks, from ``.airflow-venvs/<version>``.

``airflow api-server`` runs in its own process group against a database named ``live``; each
scenario (Airflow-made, ``tests/fixtures/scenarios/<version>/<name>.sql``) is loaded once into a
source database, and ``reset(scenario)`` re-creates ``live`` from that source with ``CREATE
DATABASE … TEMPLATE`` (~0.2 s). The server's pooled connections die with the old database and
Airflow's ``pool_pre_ping`` reconnects, so one server (~20 s to start) serves a whole session.

Auth: simple auth manager with ``admin`` (role admin) and ``viewer`` (role viewer), passwords from a
file we write (docs/explanation/airflow-internals.md, "Running a real Airflow for tests"), ``jwt_issuer`` set (HTTP 500
otherwise: docs/explanation/airflow-internals.md, "Authentication").

TLS (``tls=TlsFiles(...)``): ``airflow api-server --ssl-cert/--ssl-key``, ``url`` becomes https; the
readiness probe verifies the certificate against ``tls.ca_cert``. ``make_test_ca`` writes a throw-away CA
and a server certificate for 127.0.0.1/localhost with the ``openssl`` CLI.

Held servers (``DUPGUARD_TEST_AIRFLOW_SERVERS``, written by ``tests/airflow_hold.py``): a mutation run starts
one pytest per mutant, so each would start its own server (~20 s); with that variable set,
``airflow_api_server`` hands out a matching server started once outside (same version and token
lifetime, no TLS or extra settings, its scenarios loaded), reset to the first scenario as a fresh one
is, and leaves it running on exit.

``CountingProxy`` sits in front of the server to count requests per path (token requests in the
wrong-credentials test) and to inject 5xx answers or delays.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests.pg import FIXTURES, ROOT, Templates, database_url, drop_databases, execute_admin
from tests.trickle import http_answer, trickle

USERS = {"admin": "admin", "viewer": "viewer"}
JWT_SECRET = "dupguard-test-jwt-secret-" + "x" * 48  # >= 64 bytes: no InsecureKeyLengthWarning
START_TIMEOUT = 90.0
HELD = "DUPGUARD_TEST_AIRFLOW_SERVERS"  # a JSON file of servers tests/airflow_hold.py keeps running


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    """A throw-away CA and the server certificate it signed (PEM files)."""

    ca_cert: Path
    cert: Path
    key: Path
    other_ca_cert: Path  # a second CA that did not sign the server certificate


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_test_ca(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> TlsFiles:
    """A CA and a server certificate (SAN: ``hosts``) signed by it, plus an unrelated CA; all EC P-256."""
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    for name, subject in (("ca", "dupguard test CA"), ("other-ca", "dupguard unrelated CA")):
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.pem"), "-days", "2",
            "-subj", f"/CN={subject}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
    san = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() else f"DNS:{h}" for h in hosts)
    (d / "server.ext").write_text(
        f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"), "-subj", "/CN=127.0.0.1",
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
        "-CAcreateserial", "-days", "2", "-extfile", str(d / "server.ext"), "-out", str(d / "server.pem"),
    )  # fmt: skip
    return TlsFiles(ca_cert=d / "ca.pem", cert=d / "server.pem", key=d / "server.key", other_ca_cert=d / "other-ca.pem")


def venv_for(version: str) -> Path:
    venv = ROOT / ".airflow-venvs" / version
    if not (venv / "bin" / "airflow").exists() or not (venv / ".ready").exists():
        pytest.fail(
            f"{venv} is missing or incomplete: run scripts/airflow/venv.sh {version} "
            "(the remediation tests need a real Airflow API server)",
            pytrace=False,
        )
    return venv


@dataclass
class HeldProcess:
    """The server process of a held server: started by another process, so only its pid is known."""

    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self.returncode = -1
        return self.returncode


@dataclass
class AirflowServer:
    version: str
    url: str
    port: int
    live_db: str
    sources: dict[str, str]  # scenario -> source database name
    log_path: Path
    process: subprocess.Popen[bytes] | HeldProcess
    scenario: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    ca_cert: Path | None = None  # with tls: the CA that signed the server's certificate

    @property
    def db_url(self) -> str:
        return database_url(self.live_db)

    def reset(self, scenario: str) -> str:
        """Re-create the live database from ``scenario``'s Airflow-made data; returns its URL."""
        source = self.sources[scenario]
        execute_admin(f'DROP DATABASE IF EXISTS "{self.live_db}" WITH (FORCE)')
        execute_admin(f'CREATE DATABASE "{self.live_db}" TEMPLATE "{source}"')
        self.scenario = scenario
        return self.db_url

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.process.poll() is None


def _wait_ready(server: AirflowServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"airflow api-server exited with {server.process.returncode}:\n{server.log_tail()}")
        conn: http.client.HTTPConnection
        if server.url.startswith("https:"):
            context = ssl.create_default_context(cafile=str(server.ca_cert) if server.ca_cert else None)
            conn = http.client.HTTPSConnection("127.0.0.1", server.port, timeout=2, context=context)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=2)
        try:
            conn.request("GET", "/api/v2/monitor/health")
            if conn.getresponse().status == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        time.sleep(0.3)
    raise RuntimeError(f"airflow api-server not ready after {timeout:.0f} s:\n{server.log_tail()}")


@contextlib.contextmanager
def airflow_api_server(
    version: str,
    scenarios: list[str],
    templates: Templates,
    workdir: Path,
    *,
    jwt_expiration: int = 3600,
    env: dict[str, str] | None = None,
    tls: TlsFiles | None = None,
) -> Iterator[AirflowServer]:
    """Start ``airflow api-server`` for ``version`` with the first scenario loaded; stop it on exit.

    ``tls``: serve HTTPS with that certificate (``url`` is then ``https://127.0.0.1:<port>``).
    """
    held = None if env or tls is not None else held_server(version, scenarios, jwt_expiration)
    if held is not None:
        held.reset(scenarios[0])
        yield held
        return
    venv = venv_for(version)
    sources = {name: make_url(templates.clone(version, name)).database or "" for name in scenarios}
    live = f"live_{uuid.uuid4().hex[:10]}"
    execute_admin(f'CREATE DATABASE "{live}" TEMPLATE "{sources[scenarios[0]]}"')
    home = workdir / f"airflow-home-{version}"
    (home / "dags").mkdir(parents=True, exist_ok=True)
    passwords = home / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    conn = make_url(database_url(live)).set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)
    port = free_port()
    scheme = "https" if tls is not None else "http"
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": conn,
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{u}" for u in USERS),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__API_AUTH__JWT_ISSUER": "airflow",
        "AIRFLOW__API_AUTH__JWT_SECRET": JWT_SECRET,
        "AIRFLOW__API_AUTH__JWT_EXPIRATION_TIME": str(jwt_expiration),
        "AIRFLOW__API_AUTH__JWT_LEEWAY": "0",
        "AIRFLOW__API__SECRET_KEY": JWT_SECRET,
        "AIRFLOW__API__BASE_URL": f"{scheme}://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{scheme}://127.0.0.1:{port}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_POOL_PRE_PING": "True",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
        "VIRTUAL_ENV": str(venv),
        **(env or {}),
    }
    log_path = workdir / f"api-server-{version}-{port}.log"
    log_file = log_path.open("wb")
    command = [str(venv / "bin" / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", "1"]
    if tls is not None:
        command += ["--ssl-cert", str(tls.cert), "--ssl-key", str(tls.key)]
    process = subprocess.Popen(
        command,
        env=environ,
        cwd=str(home),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: teardown kills uvicorn's workers too
    )
    server = AirflowServer(
        version=version,
        url=f"{scheme}://127.0.0.1:{port}",
        port=port,
        live_db=live,
        sources=sources,
        log_path=log_path,
        process=process,
        scenario=scenarios[0],
        ca_cert=tls.ca_cert if tls is not None else None,
    )
    try:
        started = time.monotonic()
        try:
            _wait_ready(server, START_TIMEOUT)
        except RuntimeError as exc:
            pytest.fail(f"Airflow {version} API server: {exc}\n(log: {log_path})", pytrace=False)
        server.extra["start_seconds"] = round(time.monotonic() - started, 1)
        yield server
    finally:
        _stop(process)
        log_file.close()
        drop_databases([live, *sources.values()])


@dataclass
class ServerPool:
    """One API server per (version, token lifetime) for a whole test session (one per xdist worker),
    shared by the modules that need a plain server: each start costs ~20 s of CPU. A module asks for
    its scenarios with ``get``; a scenario not loaded yet gets its source database then, and the live
    database is reset to the first, as a freshly started server has it. Modules that change a source
    (start its queued runs) or the server's settings keep a server of their own."""

    templates: Templates
    workdir: Path
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    servers: dict[tuple[str, int], AirflowServer] = field(default_factory=dict)

    def get(self, version: str, scenarios: list[str], *, jwt_expiration: int = 3600) -> AirflowServer:
        key = (version, jwt_expiration)
        if key not in self.servers or not self.servers[key].alive():
            home = self.workdir / f"{version}-jwt{jwt_expiration}-{uuid.uuid4().hex[:6]}"
            self.servers[key] = self.stack.enter_context(
                airflow_api_server(version, scenarios, self.templates, home, jwt_expiration=jwt_expiration)
            )
        server = self.servers[key]
        for name in scenarios:
            if name not in server.sources:  # dropped with the server's own (same dict) and by the templates
                server.sources[name] = make_url(self.templates.clone(version, name)).database or ""
        server.reset(scenarios[0])
        return server

    def close(self) -> None:
        """Every server told to stop first, then each waited for: one by one, each API server's shutdown (up
        to 10 s) came after the last one's, a worker's last minute or more."""
        for server in self.servers.values():
            if server.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.process.pid, signal.SIGTERM)
        self.stack.close()


def held_server(version: str, scenarios: list[str], jwt_expiration: int) -> AirflowServer | None:
    """The held server (module docstring) for this version and token lifetime that has every scenario
    loaded; None without ``DUPGUARD_TEST_AIRFLOW_SERVERS`` or a match. A held server that stopped
    answering fails the test: every mutant would otherwise count as killed by a dead server."""
    path = os.environ.get(HELD)
    if not path:
        return None
    for entry in json.loads(Path(path).read_text()):
        if entry["version"] != version or entry["jwt_expiration"] != jwt_expiration:
            continue
        if not set(scenarios) <= entry["sources"].keys():
            continue
        server = AirflowServer(
            version=version,
            url=entry["url"],
            port=entry["port"],
            live_db=entry["live_db"],
            sources=entry["sources"],
            log_path=Path(entry["log_path"]),
            process=HeldProcess(entry["pid"]),
            extra={"start_seconds": 0.0, "held": True},
        )
        try:
            _wait_ready(server, 10)
        except RuntimeError as exc:
            pytest.fail(f"held Airflow {version} API server ({path}): {exc}", pytrace=False)
        return server
    return None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)


def scenario_path(version: str, scenario: str) -> Path:
    return FIXTURES / "scenarios" / version / f"{scenario}.sql"


def wait_for_fixture(version: str, scenario: str, timeout: float = 0.0) -> bool:
    """True once the scenario's .sql and .json exist (another process may still be writing them)."""
    deadline = time.monotonic() + timeout
    while True:
        sql, js = scenario_path(version, scenario), scenario_path(version, scenario).with_suffix(".json")
        if sql.exists() and js.exists():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(1)


# --- a counting, fault-injecting HTTP proxy ------------------------------------------------------


def _matches(rule: str, method: str, path: str) -> bool:
    """A path prefix, or "METHOD path-prefix"."""
    if " " in rule:
        want, prefix = rule.split(" ", 1)
        return method == want and path.startswith(prefix)
    return path.startswith(rule)


class CountingProxy:
    """Forwards HTTP to ``upstream``; counts requests by (method, path); can answer 5xx or stall first."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.requests: Counter[tuple[str, str]] = Counter()
        self.inject: list[tuple[str, int, float]] = []  # (path prefix, status (0: forward), delay s)
        # run once before forwarding a matching request; "PATCH /api/…" matches that method only
        self.hooks: list[tuple[str, Callable[[], None]]] = []
        self.outage = 0  # while non-zero, every request is answered with this status (the API is down)
        self.trickle: set[str] = set()  # path prefixes whose answers are sent one byte a second
        self._stop = threading.Event()
        self.answers: list[tuple[str, int, str, bytes]] = []  # (path prefix, status, Content-Type, body), once
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0  # requests received and not answered yet (``quiesce``)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def _handle(self) -> None:
                with proxy._lock:
                    proxy._in_flight += 1
                try:
                    self._serve()
                finally:
                    with proxy._lock:
                        proxy._in_flight -= 1
                        proxy._idle.notify_all()

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path.split("?")[0]
                with proxy._lock:
                    proxy.requests[(self.command, path)] += 1
                    down = proxy.outage
                    rule = (path, down, 0.0) if down else next((r for r in proxy.inject if path.startswith(r[0])), None)
                    if rule is not None and not down:
                        proxy.inject.remove(rule)
                    hook = None if down else next((h for h in proxy.hooks if _matches(h[0], self.command, path)), None)
                    if hook is not None:
                        proxy.hooks.remove(hook)
                if hook is not None:
                    hook[1]()
                with proxy._lock:
                    canned = next((a for a in proxy.answers if path.startswith(a[0])), None)
                    if canned is not None:
                        proxy.answers.remove(canned)
                if canned is not None:  # e.g. an HTML page or a cut body, as a misbehaving proxy answers
                    self.send_response(canned[1])
                    self.send_header("Content-Type", canned[2])
                    self.send_header("Content-Length", str(len(canned[3])))
                    self.end_headers()
                    self.wfile.write(canned[3])
                    return
                if rule is not None:
                    time.sleep(rule[2])
                    if rule[1]:
                        payload = json.dumps({"detail": "injected by CountingProxy"}).encode()
                        self.send_response(rule[1])
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Content-Length", str(len(payload)))
                        self.end_headers()
                        self.wfile.write(payload)
                        return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in {"host", "connection"}}
                answer, data = self._forward(body, headers)
                if any(path.startswith(p) for p in proxy.trickle):
                    trickle(
                        self.wfile, http_answer(answer.status, data, {"Content-Type": "application/json"}), proxy._stop
                    )
                    self.close_connection = True
                    return
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in {"transfer-encoding", "connection", "content-length"}:
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            upstream: http.client.HTTPConnection | None = None

            def _forward(self, body: bytes | None, headers: dict[str, str]) -> tuple[Any, bytes]:
                """Over one upstream connection per client connection, kept alive as the client keeps
                its own: a new connection per request would add the server's connection set-up to
                every request the benchmarks count. A kept connection the server closed meanwhile
                is opened again once (the request never reached it)."""
                reused = self.upstream is not None
                try:
                    return self._send(body, headers)
                except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                    self._drop()
                    if not reused:
                        raise
                except BaseException:
                    self._drop()
                    raise
                try:
                    return self._send(body, headers)
                except BaseException:
                    self._drop()
                    raise

            def _send(self, body: bytes | None, headers: dict[str, str]) -> tuple[Any, bytes]:
                if self.upstream is None:
                    self.upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=30)
                self.upstream.request(self.command, self.path, body=body, headers=headers)
                answer = self.upstream.getresponse()
                return answer, answer.read()

            def _drop(self) -> None:
                if self.upstream is not None:
                    self.upstream.close()
                    self.upstream = None

            def finish(self) -> None:
                super().finish()
                self._drop()

            do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def count(self, method: str, path: str) -> int:
        with self._lock:
            return self.requests[(method, path)]

    def quiesce(self, timeout: float) -> None:
        """Wait until no request is being held or forwarded: a write its client gave up on (timed out)
        still reaches Airflow when the hold ends, as with a slow server; after this, every request sent
        so far has landed or failed."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._in_flight == 0, timeout):
                raise AssertionError(f"{self._in_flight} request(s) still in flight after {timeout} s")

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


# --- what the remediation tests read and plan ----------------------------------------------------


@dataclass(frozen=True)
class RunRow:
    id: int
    dag_id: str
    run_id: str
    state: str | None
    end_date: Any
    updated_at: Any
    tasks: dict[str, tuple[str | None, Any, Any, Any]]  # task_id[map] -> (state, start, end, duration)
    note: str | None
    note_user: str | None


def db_state(url: str) -> dict[str, RunRow]:
    """Every run with its TIs and note, by run_id: compared before/after to prove what changed."""
    from sqlalchemy import create_engine, text

    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg2"))
    try:
        with engine.connect() as conn:
            tis: dict[tuple[str, str], dict[str, tuple[Any, ...]]] = {}
            for r in conn.execute(
                text(
                    "SELECT dag_id, run_id, task_id, map_index, state, start_date, end_date, duration "
                    "FROM task_instance"
                )
            ):
                name = r.task_id if r.map_index < 0 else f"{r.task_id}[{r.map_index}]"
                tis.setdefault((r.dag_id, r.run_id), {})[name] = (r.state, r.start_date, r.end_date, r.duration)
            rows = conn.execute(
                text(
                    "SELECT dr.id, dr.dag_id, dr.run_id, dr.state, dr.end_date, dr.updated_at, n.content, n.user_id "
                    "FROM dag_run dr LEFT JOIN dag_run_note n ON n.dag_run_id = dr.id"
                )
            )
            return {
                r.run_id: RunRow(
                    r.id,
                    r.dag_id,
                    r.run_id,
                    r.state,
                    r.end_date,
                    r.updated_at,
                    tis.get((r.dag_id, r.run_id), {}),
                    r.content,
                    r.user_id,
                )
                for r in rows
            }
    finally:
        engine.dispose()


def sql(url: str, statement: str, **params: Any) -> None:
    """A test-side write to the live database (e.g. a task that starts before the action)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg2"))
    try:
        with engine.begin() as conn:
            conn.execute(text(statement), params)
    finally:
        engine.dispose()


# --- a worker starting a task, through Airflow's own Execution API ---------------------------------

EXECUTION_AUDIENCE = "urn:airflow.apache.org:task"  # [execution_api] jwt_audience default


def execution_token(ti_id: str, *, lifetime: int = 600) -> str:
    """The JWT a worker presents to the Execution API for task instance ``ti_id`` (HS512 with the
    server's jwt_secret, as its JWTGenerator makes it: sub = the TI's id)."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    now = int(time.time())
    claims = {
        "jti": uuid.uuid4().hex,
        "sub": ti_id,
        "iss": "airflow",
        "aud": EXECUTION_AUDIENCE,
        "iat": now - 5,
        "nbf": now - 5,
        "exp": now + lifetime,
    }
    head = b64(json.dumps({"alg": "HS512", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    sig = b64(hmac.new(JWT_SECRET.encode(), f"{head}.{body}".encode(), hashlib.sha512).digest())
    return f"{head}.{body}.{sig}"


def _ti_run(server: AirflowServer, ti_id: str, payload: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(
            "PATCH",
            f"/execution/task-instances/{ti_id}/run",
            body=payload,
            headers={"Authorization": f"Bearer {execution_token(ti_id)}", "Content-Type": "application/json"},
        )
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def _run_payload(pid: int) -> str:
    return json.dumps(
        {
            "state": "running",
            "hostname": "worker-test",
            "unixname": "airflow",
            "pid": pid,
            "start_date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        }
    )


def warm_execution_api(server: AirflowServer) -> None:
    """The Execution API's first ``ti_run`` takes seconds (the server builds it lazily); pay that up
    front with a TI id that does not exist (404), so a later start is as quick as a worker's."""
    status, data = _ti_run(server, str(uuid.uuid4()), _run_payload(1))
    if status != 404:
        raise AssertionError(f"ti_run warm-up answered HTTP {status}: {data[:300]!r}")


def start_task(server: AirflowServer, dag_id: str, run_id: str, task_id: str, *, pid: int = 4242) -> None:
    """Start ``task_id`` of the run as a worker would: the scheduler's steps (run QUEUED -> RUNNING
    with its start_date, the TI -> QUEUED; docs/explanation/airflow-internals.md, "From a new run to a running task",
    steps 2-4) as a test-side write, then the worker's ``PATCH /execution/task-instances/{id}/run``, which is Airflow's
    own QUEUED -> RUNNING transition (execution_api/routes/task_instances.py ``ti_run``; it needs the run's start_date
    for its answer)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(make_url(server.db_url).set(drivername="postgresql+psycopg2"))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE dag_run SET state='running', start_date=coalesce(start_date, now()) "
                    "WHERE dag_id=:d AND run_id=:r"
                ),
                {"d": dag_id, "r": run_id},
            )
            ti_id = conn.execute(
                text(
                    "UPDATE task_instance SET state='queued', queued_dttm=now() "
                    "WHERE dag_id=:d AND run_id=:r AND task_id=:t AND map_index=-1 RETURNING id"
                ),
                {"d": dag_id, "r": run_id, "t": task_id},
            ).scalar_one()
    finally:
        engine.dispose()
    status, data = _ti_run(server, str(ti_id), _run_payload(pid))
    if status != 200:
        raise AssertionError(f"ti_run answered HTTP {status}: {data[:500]!r}")


def start_queued_runs(version: str, url: str, *others: str) -> list[list[str]]:
    """Let Airflow's own scheduler code move the queued runs of database ``url`` (and of each of
    ``others``, in the same Airflow process) to running, as the scheduler loop that created them does
    (scripts/airflow/start_queued_runs.py); returns the running runs of ``url`` as [dag_id, run_id].
    Needed by the REST API source: Airflow cannot serve the consumed events of a run it has not started
    (apache/airflow#71360)."""
    script = ROOT / "scripts" / "airflow" / "start_queued_runs.py"
    af = ROOT / "scripts" / "airflow" / "af.sh"
    done = subprocess.run(
        [str(af), version, url, "python", str(script), *others],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"start_queued_runs failed ({done.returncode}):\n{done.stderr[-2000:]}")
    answers = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"running"')]
    if len(answers) != 1 + len(others):
        raise RuntimeError(f"start_queued_runs answered for {len(answers)} of {1 + len(others)} databases")
    running: list[list[str]] = answers[0]["running"]
    return running
