"""
C{twist authsrv --workers 2} as a real process tree, on SQLite and on
PostgreSQL: both workers answer on the one port, a user's login, code
exchange and refresh chain cross from one worker to the other, SIGHUP
reaches every worker, a killed worker is replaced, and SIGTERM drains them
all before the parent exits 0.

Which worker holds a connection is read from the kernel (/proc): the
server end of the connection is a socket that only the accepting process
has among its file descriptors.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
from prometheus_client.parser import text_string_to_metric_families
from twisted.python.usage import UsageError

from authsrv.tap import Options

from conftest import EXAMPLES, free_port
from pg_servers import CLIENT, GATEWAY, Browser, pg_config

pytestmark = pytest.mark.slow

DEADLINE = 30.0


def children(pid: int) -> set[int]:
    """The live processes whose parent is C{pid}."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def _hex_address(port: int) -> str:
    return f"0100007F:{port:04X}"


def holder(connection: http.client.HTTPConnection, server_port: int, candidates: set[int]) -> int:
    """The process among C{candidates} that holds the server end of C{connection}, once it has answered on it."""
    client_port = connection.sock.getsockname()[1]
    inodes = {
        fields[9] for fields in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
        if fields[1] == _hex_address(server_port) and fields[2] == _hex_address(client_port)
    }
    for pid in candidates:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) in {f"socket:[{inode}]" for inode in inodes}:
                    return pid
            except OSError:
                continue
    raise AssertionError(f"no worker among {candidates} holds a socket of {inodes}")


def call(connection, method: str, path: str, form: dict | None = None, headers: dict | None = None):
    body = urlencode(form).encode() if form is not None else None
    sent = {"content-type": "application/x-www-form-urlencoded"} if body is not None else {}
    connection.request(method, path, body=body, headers={**sent, **(headers or {})})
    response = connection.getresponse()
    return response.status, response.read()


def pinned(server, workers: set[int]) -> dict[int, http.client.HTTPConnection]:
    """A kept-alive connection to each worker, each having answered /readyz: both serve the one port."""
    found: dict[int, http.client.HTTPConnection] = {}
    deadline = time.monotonic() + DEADLINE
    while set(found) != workers:
        assert time.monotonic() < deadline, f"only {set(found)} of {workers} answered"
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        ready = call(connection, "GET", "/readyz")[0] == 200
        pid = holder(connection, server.port, workers)
        if pid in found or not ready:
            connection.close()
            time.sleep(0.05)
            continue
        found[pid] = connection
    return found


def the_workers(server, count: int = 2) -> set[int]:
    deadline = time.monotonic() + DEADLINE
    while len(workers := children(server.process.pid)) != count:
        assert time.monotonic() < deadline, workers
        time.sleep(0.05)
    return workers


def token(connection, **form):
    status, body = call(connection, "POST", "/api/auth/oauth2/token",
                        {**form, "client_id": CLIENT[0], "client_secret": CLIENT[1]})
    return status, json.loads(body)


def across_workers(server, connections: dict[int, http.client.HTTPConnection]) -> None:
    """A login on either, the code exchanged on one, the refresh chain alternating, each step seen by the other."""
    first, second = connections.values()
    code, verifier = Browser().authorize(server.base)
    status, tokens = token(first, grant_type="authorization_code", code=code,
                           redirect_uri="http://127.0.0.1:9000/callback", code_verifier=verifier)
    assert status == 200, tokens
    for connection in (second, first, second):
        status, tokens = token(connection, grant_type="refresh_token", refresh_token=tokens["refresh_token"])
        assert status == 200, tokens
    auth = "Basic " + base64.b64encode(f"{GATEWAY[0]}:{GATEWAY[1]}".encode()).decode()
    for connection in (first, second):
        status, body = call(connection, "POST", "/api/auth/oauth2/introspect", {"token": tokens["access_token"]},
                            {"authorization": auth})
        assert status == 200 and json.loads(body)["active"] is True, body
    status, body = token(first, grant_type="refresh_token", refresh_token=tokens["refresh_token"])
    assert status == 200, body
    status, reused = token(second, grant_type="refresh_token", refresh_token=tokens["refresh_token"])
    assert status == 200 and reused["refresh_token"] == body["refresh_token"], "the grace window is in the store"
    current = body["refresh_token"]
    for _ in range(10):
        answers = racing(connections, current)
        successors = {answer["refresh_token"] for status, answer in answers if status == 200}
        assert len(successors) == 1, f"two workers rotated one token into two chains: {answers}"
        current = successors.pop()


def racing(connections: dict[int, http.client.HTTPConnection], refresh_token: str) -> list:
    """The same refresh token sent to every worker at once."""
    barrier = threading.Barrier(len(connections))
    answers: list = []

    def send(connection):
        barrier.wait()
        answers.append(token(connection, grant_type="refresh_token", refresh_token=refresh_token))

    threads = [threading.Thread(target=send, args=(c,)) for c in connections.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=DEADLINE)
    assert len(answers) == len(connections)
    return answers


def drains_and_exits_0(server, connections: dict[int, http.client.HTTPConnection]) -> None:
    workers = set(connections)
    server.process.send_signal(signal.SIGTERM)
    for pid, connection in connections.items():
        deadline = time.monotonic() + 5
        while (answer := call(connection, "GET", "/readyz"))[0] != 503:
            assert time.monotonic() < deadline, (pid, answer)
            time.sleep(0.05)
        assert json.loads(answer[1]) == {"status": "unavailable", "reason": "draining"}
        connection.close()
    assert server.process.wait(timeout=DEADLINE) == 0
    out, err = server.output()
    assert out.count("draining: not ready") == len(workers), out + err
    assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
    assert "Traceback" not in out + err


def sqlite_config(folder: Path, port: int, extra: str = "") -> Path:
    shutil.copytree(EXAMPLES, folder, ignore=shutil.ignore_patterns("demo-data"))
    path = folder / "demo.toml"
    text = path.read_text()
    assert "tcp:8080:" in text and "[server]\n" in text
    text = text.replace("tcp:8080:", f"tcp:{port}:").replace("[server]\n", f'[server]\ndrain_delay = "1s"\n{extra}', 1)
    path.write_text(text)
    return path


def test_two_workers_on_sqlite(run_server, tmp_path):
    port = free_port()
    config = sqlite_config(tmp_path / "examples", port, 'access_log = "combined"\naccess_log_path = "access.log"\n')
    server = run_server(["authsrv", "--config", str(config), "--workers", "2"], tmp_path, port=port)
    workers = the_workers(server)
    connections = pinned(server, workers)
    across_workers(server, connections)

    log = tmp_path / "examples" / "access.log"
    log.rename(log.with_name("access.log.1"))
    server.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + DEADLINE
    while True:
        for pid, connection in connections.items():
            assert call(connection, "GET", "/healthz", headers={"user-agent": f"probe-{pid}"})[0] == 200
        time.sleep(1.2)
        written = log.read_text() if log.exists() else ""
        if all(f"probe-{pid}" in written for pid in workers):
            break
        assert time.monotonic() < deadline, "a worker did not reopen its access log on SIGHUP"
    assert children(server.process.pid) == workers, "SIGHUP ended a process"
    assert all(line.endswith('"') for line in log.with_name("access.log.1").read_text().splitlines())

    killed = next(iter(workers))
    connections.pop(killed).close()
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE
    while killed in (now := children(server.process.pid)) or len(now) != 2:
        assert time.monotonic() < deadline, now
        time.sleep(0.05)
    replaced = pinned(server, now)
    for connection in connections.values():
        connection.close()
    drains_and_exits_0(server, replaced)


def test_two_workers_on_postgresql(run_server, pg_dsn, tmp_path):
    port = free_port()
    config = pg_config(tmp_path, pg_dsn, port, port)
    config.write_text(config.read_text().replace("[server]\n", '[server]\nworkers = 2\ndrain_delay = "1s"\n', 1))
    server = run_server(["authsrv", "--config", str(config)], tmp_path, port=port)
    connections = pinned(server, the_workers(server))
    across_workers(server, connections)
    drains_and_exits_0(server, connections)


def answered(metrics_port: int, route: str) -> float:
    """What C{/metrics} says the server answered on C{route}, with every status."""
    connection = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
    status, body = call(connection, "GET", "/metrics")
    connection.close()
    assert status == 200, body
    return sum(
        sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == "authsrv_http_requests_total" and sample.labels["route"] == route
    )


def test_metrics_add_up_every_workers_requests(run_server, tmp_path):
    port, metrics_port = free_port(), free_port()
    config = sqlite_config(tmp_path / "examples", port)
    config.write_text(config.read_text() + f'\n[metrics]\nlisten = ["tcp:{metrics_port}:interface=127.0.0.1"]\n')
    server = run_server(["authsrv", "--config", str(config), "--workers", "2"], tmp_path, port=port)
    connections = pinned(server, the_workers(server))
    shared = {Path(f"/proc/{pid}/environ").read_bytes().split(b"PROMETHEUS_MULTIPROC_DIR=")[1].split(b"\0")[0]
              for pid in connections}
    assert len(shared) == 1, "the workers count in different places"
    directory = Path(next(iter(shared)).decode())
    for count, connection in zip((3, 5), connections.values()):
        for _ in range(count):
            assert call(connection, "GET", "/healthz")[0] == 200
    assert answered(metrics_port, "/healthz") == 8

    killed, connection = next(iter(connections.items()))
    connection.close()
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE
    while killed in (now := children(server.process.pid)) or len(now) != 2:
        assert time.monotonic() < deadline, now
        time.sleep(0.05)
    assert answered(metrics_port, "/healthz") == 8, "a dead worker's requests went out of the count"
    assert not list(directory.glob(f"*_{killed}.db")), "a dead worker's files stay, one more set per restart"
    assert sorted(path.name for path in directory.glob("*_dead.db")) == ["counter_dead.db", "histogram_dead.db"]
    for connection in list(connections.values())[1:]:
        connection.close()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=DEADLINE) == 0
    assert not directory.exists(), "the metrics directory outlived the server"


def test_a_worker_without_its_sockets_stops_with_one_line(run_server, tmp_path):
    port = free_port()
    config = sqlite_config(tmp_path / "examples", port)
    server = run_server(["authsrv", "--config", str(config)], tmp_path, port=port, ready=False,
                        env={"AUTHSRV_WORKER": f"0:1:{os.getpid()}"})
    assert server.process.wait(timeout=DEADLINE) == 1
    out, err = server.output()
    assert "authsrv: file descriptor 3 is not a" in err and "Traceback" not in out + err, out + err


@pytest.mark.parametrize("value, message", [
    ("0", "between 1 and 256, not 0"), ("many", "a whole number"), ("99999999999", "between 1 and 256"),
])
def test_the_workers_option_is_checked(value, message):
    with pytest.raises(UsageError, match=message):
        Options().parseOptions(["--workers", value])
    options = Options()
    options.parseOptions(["--workers", "3"])
    assert options["workers"] == 3


def test_workers_outlive_a_sighup_while_they_start_and_a_broken_config_file(run_server, tmp_path):
    """
    logrotate's SIGHUP may come while workers start: passed on before a
    worker had its handler, it ended the worker as a failed start, and a few
    of them stopped the whole service; it now waits in the worker until the
    worker can reopen its files. A config file edited into a broken state
    is no reason for a replaced worker to fail either: it runs the file its
    siblings run, and the parent says the edit waits for a restart.
    (One test for both: each server start costs seconds.)
    """
    port = free_port()
    config = sqlite_config(tmp_path / "examples", port)
    server = run_server(["authsrv", "--config", str(config), "--workers", "2"], tmp_path, port=port, ready=False)
    workers = the_workers(server)
    for _ in range(3):
        server.process.send_signal(signal.SIGHUP)
        time.sleep(0.05)
    server.wait_ready()
    for connection in pinned(server, workers).values():
        connection.close()

    config.write_text(config.read_text() + "\n[server]\n")
    killed = min(workers)
    os.kill(killed, signal.SIGKILL)
    deadline = time.monotonic() + DEADLINE
    while killed in (replaced := the_workers(server)):
        assert time.monotonic() < deadline, replaced
        time.sleep(0.05)
    connections = pinned(server, replaced)
    assert server.process.poll() is None
    drains_and_exits_0(server, connections)
    out, err = server.output()
    assert all(f"log files reopened on SIGHUP (pid {pid})" in out for pid in workers), out + err
    assert out.count("ended after") == 1 and "(status None, signal 9)" in out, out + err
    assert f"runs the config file as read at start: {config} changed since" in out, out + err
    assert "failing at start" not in out and "invalid TOML" not in out + err, out + err


def test_workers_that_keep_failing_at_start_stop_the_service(run_server, tmp_path):
    """A secret file the workers read gone while the parent runs: their restarts fail, and the parent gives up."""
    port = free_port()
    config = sqlite_config(tmp_path / "examples", port)
    server = run_server(["authsrv", "--config", str(config), "--workers", "2"], tmp_path, port=port)
    workers = the_workers(server)
    (config.parent / "demo-secrets" / "internal-api-secret").unlink()
    started = time.monotonic()
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    assert server.process.wait(timeout=DEADLINE) == 1
    out, err = server.output()
    assert time.monotonic() - started < DEADLINE
    assert out.count("starting it again in 1s") == 2 and "starting it again in 2s" in out, out
    assert out.count("workers keep failing at start") == 1, out
    assert "Traceback" not in out + err
