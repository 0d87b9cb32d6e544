"""
The diagnostic log's JSON lines, written by the observer C{twist} is given,
and the access log: its redaction, and both logs as a running server writes
them, with the audit log in its own file and every file reopened on SIGUSR1
(or, failing that, kept).
"""

from __future__ import annotations

import io
import json
import select
import os
import resource
import signal
import socket
import threading
import time
import urllib.request
from ipaddress import ip_network

import pytest
from twisted.logger import LogLevel, Logger, formatEvent, jsonFileLogObserver, textFileLogObserver
from twisted.web.server import Request
from twisted.web.test.requesthelper import DummyChannel

from authsrv.config import parse_config
from authsrv.configsection import ConfigError
from authsrv.embedded import prepare_data_dir
from authsrv.logfile import REOPEN_SIGNALS, LineFile, reopen_on_signals
from authsrv.tap import diagnostic_log_factory
from authsrv.web.accesslog import AccessLog, log_text, redact_target

from conftest import free_port


class Unwritable:
    def __repr__(self):
        return "<unwritable>"


def lines_of(factory, emit) -> list[str]:
    out = io.StringIO()
    emit(factory(out))
    return out.getvalue().splitlines()


def test_json_lines_hold_the_message_the_fields_and_any_value():
    def emit(observer):
        log = Logger(namespace="authsrv.example", observer=observer)
        cycle: dict = {}
        cycle["self"] = cycle
        log.info("{count} users loaded from {path}", count=3, path="users.toml")
        log.warn("odd values {thing}", thing=Unwritable(), cycle=cycle, keyed={(1, 2): "tuple key"}, raw=b"\xff")
        log.info("a format with a {missing} field")
        try:
            1 / 0
        except ZeroDivisionError:
            log.failure("maintenance failed")
        Logger(namespace="authsrv.audit", observer=observer).info("audit", event="user.unbanned", sub="s")

    lines = lines_of(diagnostic_log_factory(jsonFileLogObserver, None), emit)
    records = [json.loads(line) for line in lines]
    assert len(records) == 4, "one object a line, the audit event left to the audit log"
    for record in records:
        assert list(record)[:4] == ["time", "level", "namespace", "message"]
        assert record["time"].endswith("Z") and record["namespace"] == "authsrv.example"
        assert not any(key.startswith("log_") for key in record)
    loaded, odd, unformatted, failed = records
    assert (loaded["level"], loaded["message"], loaded["count"], loaded["path"]) == (
        "info", "3 users loaded from users.toml", 3, "users.toml")
    assert (odd["level"], odd["message"], odd["thing"]) == ("warn", "odd values <unwritable>", "<unwritable>")
    assert odd["cycle"] == "{'self': {...}}" and odd["keyed"] == "{(1, 2): 'tuple key'}" and odd["raw"] == "b'\\xff'"
    assert "Unable to format event" in unformatted["message"]
    assert failed["level"] == "critical" and failed["message"] == "maintenance failed"
    assert "ZeroDivisionError" in failed["traceback"] and "Traceback" in failed["traceback"]


def test_the_config_chooses_the_format_over_twists_default():
    def emit(observer):
        Logger(namespace="authsrv.example", observer=observer).info("hello {name}", name="world")

    assert json.loads(lines_of(diagnostic_log_factory(textFileLogObserver, "json"), emit)[0])["message"] == (
        "hello world")
    [text] = lines_of(diagnostic_log_factory(jsonFileLogObserver, "text"), emit)
    assert text.endswith("[authsrv.example#info] hello world")
    [text] = lines_of(diagnostic_log_factory(textFileLogObserver, None), emit)
    assert text.endswith("hello world") and not text.startswith("{")


@pytest.mark.parametrize(
    "target, logged",
    [
        (b"/api/auth/jwks", b"/api/auth/jwks"),
        (b"/api/auth/oauth2/authorize?response_type=code&client_id=app&state=s3cr3t&code_challenge=abc"
         b"&nonce=n0nce&login_hint=alice&scope=openid%20email&redirect_uri=https%3A%2F%2Fapp%2Fcb",
         b"/api/auth/oauth2/authorize?response_type=code&client_id=app&state=[redacted]&code_challenge=[redacted]"
         b"&nonce=[redacted]&login_hint=[redacted]&scope=openid%20email&redirect_uri=https%3A%2F%2Fapp%2Fcb"),
        (b"/cb?code=c0de&id_token_hint=eyJ.x.y&token=t&access_token=a&refresh_token=r&client_secret=cs"
         b"&code_verifier=v&c%6fde=sneaky&bare",
         b"/cb?code=[redacted]&id_token_hint=[redacted]&token=[redacted]&access_token=[redacted]"
         b"&refresh_token=[redacted]&client_secret=[redacted]&code_verifier=[redacted]&c%6fde=[redacted]&[redacted]"),
        (b"https://app.example/cb?prompt=login&max_age=0#code=frag", b"https://app.example/cb?prompt=login&max_age=0"
                                                                     b"#[redacted]"),
        # Pairs end at '&' alone: a ';' is data, part of the value the server reads (a client's state here),
        # and what follows it is no parameter of its own to show.
        (b"/api/auth/oauth2/authorize?client_id=app&state=xyz;error=csrf-s3cr3t&prompt=none",
         b"/api/auth/oauth2/authorize?client_id=app&state=[redacted]&prompt=none"),
        # A shown parameter's value holding a ';' is not shown: a client that took ';' for a separator
        # sent its hint and code inside it.
        (b"/api/auth/oauth2/end-session?client_id=app;id_token_hint=eyJ.x.y;state=s&prompt=none",
         b"/api/auth/oauth2/end-session?client_id=[redacted]&prompt=none"),
        (b"/cb?scope=openid;code=c0de&error=access_denied", b"/cb?scope=[redacted]&error=access_denied"),
        # A request object is the request's other parameters (state, hints, nonce) in a JWT anyone can decode.
        (b"/api/auth/oauth2/authorize?client_id=app&request=eyJhbGciOiJub25lIn0.eyJzdGF0ZSI6InMzY3IzdCJ9.",
         b"/api/auth/oauth2/authorize?client_id=app&request=[redacted]"),
    ],
)
def test_query_values_not_on_the_allow_list_are_redacted(target, logged):
    assert redact_target(target) == logged


@pytest.mark.slow
def test_a_running_server_writes_three_logs_and_reopens_them_on_signals_but_no_config(run_server, tmp_path):
    """
    The logs, reopened on SIGUSR1; and SIGHUP, which reloads no config,
    says so when the config file was edited since start (here into a broken
    state), and the server serves on with the config in force.
    """
    config, _ = prepare_data_dir(tmp_path / "data")
    port = free_port()
    config.write_text(config.read_text().replace("[server]\n", (
        '[server]\naccess_log_path = "access.log"\ntrusted_proxies = ["127.0.0.1/32"]\ndrain_delay = 0\n'
    )) + '\n[audit]\npath = "audit.log"\n\n[log]\nformat = "json"\n')
    server = run_server(["authsrv", "--config", str(config), "--listen", f"tcp:{port}:interface=127.0.0.1"],
                        tmp_path, port=port)
    secrets = ["st4te-secret", "hint-secret", "login-hint-secret", "referred-code"]

    def get(path: str, **headers):
        request = urllib.request.Request(server.base + path, headers=headers)
        try:
            urllib.request.urlopen(request, timeout=5).close()
        except urllib.error.HTTPError as e:
            e.close()

    get(f"/api/auth/oauth2/authorize?response_type=code&client_id=nobody&state={secrets[0]}"
        f"&id_token_hint={secrets[1]}&login_hint={secrets[2]}",
        **{"X-Forwarded-For": "203.0.113.9", "Referer": f"https://app.example/cb?code={secrets[3]}",
           "User-Agent": 'agent "quoted"'})
    data = tmp_path / "data"
    time.sleep(1.5)
    os.rename(data / "access.log", data / "access.log.1")
    os.rename(data / "audit.log", data / "audit.log.1")
    server.process.send_signal(signal.SIGUSR1)
    time.sleep(0.3)
    get("/api/auth/jwks")
    config.write_text(config.read_text() + "\n[server]\n")
    server.process.send_signal(signal.SIGHUP)
    time.sleep(0.3)
    get("/api/auth/jwks")
    out, err = server.stop()

    [before] = [line for line in (data / "access.log.1").read_text().splitlines() if "/readyz" not in line]
    assert before.startswith("203.0.113.9 - - [") and ' "GET /api/auth/oauth2/authorize?response_type=code' in before
    assert "&state=[redacted]&id_token_hint=[redacted]&login_hint=[redacted] HTTP/1.1\" 400 " in before
    assert before.endswith(' "https://app.example/cb?code=[redacted]" "agent \\"quoted\\""'), before
    after = (data / "access.log").read_text().splitlines()
    assert [line.split('"')[1] for line in after] == ["GET /api/auth/jwks HTTP/1.1"] * 2
    assert json.loads((data / "audit.log.1").read_text().splitlines()[0])["event"] == "config.loaded"
    diagnostic = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert any(record["message"].startswith("authsrv ready") for record in diagnostic), out + err
    assert not any(record["namespace"] == "authsrv.audit" for record in diagnostic)
    [unloaded] = [record for record in diagnostic if "is not reloaded" in record["message"]]
    assert unloaded["message"].startswith(f"{config} changed since start and is not reloaded: SIGHUP only reopens")
    assert unloaded["level"] == "warn"
    for text in (out, err, *(path.read_text() for path in data.glob("*.log*"))):
        for secret in secrets:
            assert secret not in text


@pytest.mark.slow
def test_a_zone_id_a_trusted_proxy_forwards_never_reaches_the_access_log(run_server, tmp_path):
    """
    An IPv6 zone id (C{fe80::1%...}) in Forwarded or X-Forwarded-For may
    hold any text: the client's address is written without it, so no space,
    quote or control character splits or forges a combined line.
    """
    config, _ = prepare_data_dir(tmp_path / "data")
    port = free_port()
    config.write_text(config.read_text().replace("[server]\n", (
        '[server]\naccess_log_path = "access.log"\ntrusted_proxies = ["127.0.0.1/32"]\ndrain_delay = 0\n'
    )))
    server = run_server(["authsrv", "--config", str(config), "--listen", f"tcp:{port}:interface=127.0.0.1"],
                        tmp_path, port=port)
    for header in (b'X-Forwarded-For: fe80::1%a b" x\x01', b'Forwarded: for="[fe80::2%25eth0 -]:4711"'):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
            connection.sendall(b"GET /api/auth/jwks HTTP/1.1\r\nHost: 127.0.0.1\r\n" + header
                               + b"\r\nConnection: close\r\n\r\n")
            assert connection.recv(64).startswith(b"HTTP/1.1 200 ")
    time.sleep(1.5)
    server.stop()
    lines = [line for line in (tmp_path / "data" / "access.log").read_text().splitlines() if "/readyz" not in line]
    assert [line.split(" - - [")[0] for line in lines] == ["fe80::1", "fe80::2"], lines


@pytest.mark.parametrize(
    "value, chosen", [(None, "combined"), (True, "combined"), (False, "off"), ("json", "json"), ("off", "off")]
)
def test_access_log_setting(value, chosen):
    server = {} if value is None else {"access_log": value}
    assert parse_config({"server": server}, None).access_log == chosen


def test_access_log_setting_refuses_other_formats():
    with pytest.raises(ConfigError, match="server.access_log: must be one of 'combined', 'json', 'off'"):
        parse_config({"server": {"access_log": "common"}}, None)


def test_json_access_line_behind_a_trusted_proxy(tmp_path):
    request = Request(DummyChannel())
    request.method, request.clientproto = b"GET", b"HTTP/1.1"
    request.uri = b"/api/auth/oauth2/authorize?state=x&scope=openid"
    request.code, request.sentLength = 303, 0
    request.requestHeaders.addRawHeader(b"x-forwarded-for", b"198.51.100.4")
    file = LineFile(str(tmp_path / "access.log"), flush_each=False)
    AccessLog(file, "json", trusted_proxies=(ip_network("192.168.1.1/32"),))(request, "[unused]")
    file.close()
    [line] = (tmp_path / "access.log").read_text().splitlines()
    record = json.loads(line)
    assert record["time"].endswith("Z") and record["address"] == "198.51.100.4"
    assert record["target"] == "/api/auth/oauth2/authorize?state=[redacted]&scope=openid"
    assert (record["method"], record["status"], record["bytes"], record["referrer"]) == ("GET", 303, 0, None)


class _Writes(io.RawIOBase):
    """A raw file that keeps each write(2) it is given."""

    def __init__(self):
        self.writes: list[bytes] = []

    def writable(self):
        return True

    def write(self, data):
        self.writes.append(bytes(data))
        return len(data)


def test_buffered_lines_leave_in_whole_lines_of_at_most_pipe_buf(tmp_path):
    """Several workers share the access log's file or pipe: no write may hold part of a line."""
    file = LineFile(str(tmp_path / "access.log"), flush_each=False)
    raw = _Writes()
    file._file = io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
    lines = [f"{i} " + "é" * (i % 200) + "\n" for i in range(500)] + ["x" * (2 * select.PIPE_BUF) + "\n"]
    for line in lines:
        file.write(line)
    assert raw.writes == []
    file.flush()
    assert b"".join(raw.writes).decode() == "".join(lines)
    assert all(write.endswith(b"\n") for write in raw.writes)
    assert all(len(write) <= select.PIPE_BUF for write in raw.writes[:-1]) and len(raw.writes) > 10


def test_c1_controls_are_escaped_in_the_combined_line():
    """A NEL (U+0085) forged a second line for readers that split on it; a CSI drove terminals."""
    assert log_text(b"evil\x9b31m\x85127.0.0.1 - -") == "evil\\x9b31m\\x85127.0.0.1 - -"


class AtOnce:
    """A reactor stand-in whose C{callFromThread} runs the call there and then, as the signal arrives."""

    def callFromThread(self, f, *args):
        f(*args)


def test_a_file_that_cannot_be_reopened_keeps_its_old_file_and_spoils_no_other(tmp_path, logged):
    """
    A rotation that left the audit log's folder unusable is one line naming
    the file; the access log is still reopened and the workers still hear the signal.
    """
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir()
    audit, access = LineFile(str(audit_dir / "audit.log")), LineFile(str(tmp_path / "access.log"))
    passed: list[int] = []
    handlers = {number: signal.getsignal(number) for number in REOPEN_SIGNALS}
    try:
        reopen_on_signals(AtOnce(), [audit, access], passed.append)
        os.rename(audit_dir, tmp_path / "audit.1")
        os.rename(tmp_path / "access.log", tmp_path / "access.log.1")
        os.kill(os.getpid(), signal.SIGHUP)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    audit.write("kept\n")
    access.write("new\n")
    access.flush()
    assert passed == [signal.SIGHUP]
    assert (tmp_path / "audit.1" / "audit.log").read_text() == "kept\n"
    assert (tmp_path / "access.log").read_text() == "new\n"
    [problem] = [e for e in logged if e.get("log_level") is LogLevel.error]
    assert "log_failure" not in problem
    assert f"cannot reopen {audit_dir / 'audit.log'}: No such file or directory" in formatEvent(problem)


def opened_at_once(open_file, path):
    """
    What C{open_file()} returned or raised, which must be at once: an open
    still waiting after seconds is let through by a reader of C{path}, and fails the test.
    """
    outcome: list = []

    def run():
        try:
            outcome.append(open_file())
        except OSError as e:
            outcome.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=10)
    if thread.is_alive():
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        thread.join()
        pytest.fail("the open waited for a reader of the named pipe")
    return outcome[0]


def test_a_named_pipe_nobody_reads_is_refused_at_once_at_start_and_at_a_reopen(tmp_path):
    """
    An audit or access log sent to a named pipe (a log shipper's) that no
    process reads held the start, or the reactor at a reopen, until one did,
    with nothing said; it is an error naming it instead.
    """
    path = tmp_path / "audit.fifo"
    os.mkfifo(path)
    refused = opened_at_once(lambda: LineFile(str(path)), path)
    assert isinstance(refused, OSError) and refused.strerror == "a named pipe that no process reads"
    reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        file = LineFile(str(path))
        file.write("one\n")
        assert os.read(reader, 100) == b"one\n"
    finally:
        os.close(reader)
    refused = opened_at_once(file.reopen, path)
    assert isinstance(refused, OSError) and refused.strerror == "a named pipe that no process reads"
    file.close()


def test_lines_a_full_disk_refuses_are_dropped_with_one_line_and_the_flushes_go_on(tmp_path, logged):
    """
    The access log's flush runs on a timer that a raised error would stop
    for good, leaving every later line in memory: a full disk (here
    /dev/full) drops the lines instead, said once when it starts and once
    when writing works again.
    """
    path = tmp_path / "access.log"
    path.symlink_to("/dev/full")
    file = LineFile(str(path), flush_each=False)
    for line in ("one\n", "two\n"):
        file.write(line)
        file.flush()
    path.unlink()
    file.reopen()
    file.write("three\n")
    file.flush()
    assert path.read_text() == "three\n"
    assert [formatEvent(e) for e in logged] == [
        f"cannot write to {path}: No space left on device; its lines are dropped until it can",
        f"writing to {path} again; 2 lines were dropped",
    ]


def test_a_full_disk_counts_as_dropped_only_the_lines_it_lost(tmp_path, logged):
    """
    The write under way when the disk filled waits in the file's buffer and
    goes out first once the file takes it again: its lines were not lost,
    and the line that says how many were counts only those flushed while
    the file refused them. A file size limit stands in for the full disk.
    """
    path = tmp_path / "access.log"
    file = LineFile(str(path), flush_each=False)
    first = [f"first {n} {'x' * 20}\n" for n in range(4)]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, hard))
    try:
        for line in first:
            file.write(line)
        file.flush()
        file.write("lost\n")
        file.flush()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    file.write("after\n")
    file.flush()
    file.close()
    assert path.read_text() == "".join(first) + "after\n"
    assert [formatEvent(e) for e in logged] == [
        f"cannot write to {path}: File too large; its lines are dropped until it can",
        f"writing to {path} again; 1 lines were dropped",
    ]
