"""Shared helpers for tests that run authsrv as a real process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from twisted.internet.defer import maybeDeferred
from twisted.logger import globalLogPublisher

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


LOWEST_PORT = 10000
_handed_out: set[int] = set()


def _outgoing_ports_start() -> int:
    """Where the kernel's range for outgoing connections (and for bind to port 0) starts."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """
    A port nothing listens on, for a server a test starts later. Not one
    from binding port 0: those come from the range the kernel gives
    outgoing connections, so any client (another test's, PostgreSQL's)
    could take it before the server binds it ("Address already in use").
    Below that range instead, in a slice of its own for each test worker,
    never handed out twice in one run.
    """
    end = _outgoing_ports_start()
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (end - LOWEST_PORT) // max(workers, 1)
    first = LOWEST_PORT + worker * size
    begin = (os.getpid() + len(_handed_out)) % size
    for offset in range(size):
        port = first + (begin + offset) % size
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port between {first} and {first + size}")


def no_file_work(*args):
    """A static identity backend's file thread for a test whose backend only reads the file."""
    raise AssertionError("this backend only reads its users file")


def file_work_here(work, *args):
    """
    A static identity backend's file thread that is the caller's: a test
    that drives the clock sees a reload done when the lookup that looked
    at the file returns.
    """
    return maybeDeferred(work, *args)


def fetch(url: str, timeout: float = 5.0) -> tuple[int, dict, bytes]:
    """A plain HTTP GET with the standard library: status, headers, body."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


class Server:
    """
    A C{twist authsrv} child process, waited on until ready. Its output goes
    to files, not pipes: a pipe nobody reads fills up and stalls the server.
    """

    def __init__(self, args: list[str], cwd: Path, port: int, env: dict | None = None):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self._out = tempfile.TemporaryFile("w+")
        self._err = tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "twisted", *args],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=self._out,
            stderr=self._err,
            text=True,
        )

    def output(self, timeout: float = 60) -> tuple[str, str]:
        """Wait for the process to end; what it wrote to stdout and stderr."""
        self.process.wait(timeout=timeout)
        self._out.seek(0)
        self._err.seek(0)
        return self._out.read(), self._err.read()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                out, err = self.output()
                raise AssertionError(f"server exited {self.process.returncode}:\n{out}\n{err}")
            try:
                if fetch(self.base + "/readyz", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise AssertionError("server not ready in time")

    def get_json(self, path: str):
        status, _, body = fetch(self.base + path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def kill(self) -> tuple[str, str]:
        """SIGKILL: no shutdown code runs."""
        self.process.send_signal(signal.SIGKILL)
        return self.output(timeout=10)

    def stop(self) -> tuple[str, str]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.output(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.output()


@pytest.fixture
def logged():
    """Every log event during the test."""
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    yield events
    globalLogPublisher.removeObserver(events.append)


@pytest.fixture
def run_server():
    """Start C{twist authsrv ...} processes; all are stopped after the test."""
    servers: list[Server] = []

    def start(args, cwd, *, port=None, env=None, ready=True):
        server = Server(args, cwd, port or free_port(), env)
        servers.append(server)
        if ready:
            server.wait_ready()
        return server

    yield start
    for server in servers:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()


async def admin(*args: str, cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    """
    Run the operator command as an operator would, but in this process (a
    child process costs a second each): in C{cwd}, on the tests' reactor,
    with C{stdin} as standard input; returns its status and output. Every
    test runs on the reactor, so a test awaits it.
    """
    from twisted.internet import reactor

    from authsrv.admin.main import run

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd):
        status = await run(list(args), reactor, stdin=io.StringIO(stdin or ""), stdout=out, stderr=err)
    return subprocess.CompletedProcess(["authsrv-admin", *args], status, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def postgres():
    """The tests' own PostgreSQL (see tests/pgcluster.py), for the whole session."""
    from pgcluster import Cluster

    cluster = Cluster()
    yield cluster
    cluster.destroy()


@pytest.fixture(scope="session")
def _stoppable_cluster():
    from pgcluster import DSN_VARIABLE, Cluster

    cluster = Cluster(local=True)
    assert cluster.admin_dsn != os.environ.get(DSN_VARIABLE), "an outage test must never stop an outside server"
    yield cluster
    cluster.destroy()


@pytest.fixture
def stoppable_postgres(_stoppable_cluster):
    """
    A throwaway PostgreSQL of the tests' own that a test may stop and start,
    even when AUTHSRV_TEST_POSTGRES_DSN names the session's server; shared by
    the session's outage tests, and running again after each.
    """
    yield _stoppable_cluster
    if not _stoppable_cluster.running:
        _stoppable_cluster.start()


@pytest.fixture
def pg_dsn(postgres):
    """A fresh, empty database on the tests' PostgreSQL."""
    return postgres.database()


@pytest.fixture(scope="session")
def slapd():
    """The tests' own OpenLDAP server (see tests/slapd.py), for the whole session."""
    from slapd import Slapd

    server = Slapd()
    yield server
    server.destroy()


@pytest.fixture
def audit():
    """Every log event while the test runs; C{audit.of(kind)} the audit events of one kind."""

    class Events(list):
        def of(self, kind):
            return [e for e in self if e.get("log_namespace") == "authsrv.audit" and e.get("event") == kind]

    events = Events()
    globalLogPublisher.addObserver(events.append)
    yield events
    globalLogPublisher.removeObserver(events.append)


@pytest.fixture
def deployment(tmp_path):
    """The embedded default's data folder: (working directory, config file path)."""
    from authsrv.embedded import prepare_data_dir

    config, _ = prepare_data_dir(tmp_path / "data")
    return tmp_path, str(config)


def ok(result):
    """The operator command succeeded: its standard output."""
    assert result.returncode == 0, result.stderr
    return result.stdout


def refused(result, message):
    """The operator command refused with one line naming the problem."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith("authsrv-admin: ") and message in line, line


@pytest.fixture
def reactor():
    """The real reactor, for plugins that run blocking work on its thread pools."""
    from twisted.internet import reactor

    return reactor


@pytest.fixture
def context(reactor, tmp_path):
    """A plugin context over the test's folder, its thread pools stopped after."""
    from authsrv.context import PluginContext

    context = PluginContext(reactor, tmp_path)
    yield context
    context.stop()
