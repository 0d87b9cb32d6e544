"""
Graceful stop: the drain sequence on a Clock, the service and site around
it, and a real C{twist authsrv} stopped by SIGTERM with 100 requests in
flight.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from http.client import HTTPResponse
from urllib.parse import urlencode

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.error import ReactorNotRunning
from twisted.internet.task import Clock

from authsrv.config import parse_config
from authsrv.drain import Drain, stop_on_sigterm
from authsrv.embedded import prepare_data_dir
from authsrv.identity.chain import IdentityChain
from authsrv.flows.backchannel import BackchannelNotifier
from authsrv.records import BrowserSession, Client
from authsrv.service import AuthsrvService
from authsrv.testing.identity import ALICE
from authsrv.testing.memory import MemoryStore
from authsrv.testing.store import start_grant
from authsrv.tokens import token_hash

from conftest import fetch, free_port
from flows.test_backchannel import FIRST_URI, HANG, FakeRelyingParty, SessionNamingSigner
from harness import ISSUER
from wire import Listener, parse, request_head


class FakePort:
    def __init__(self, clock):
        self._clock = clock
        self.stopped_at = None

    def stopListening(self):
        self.stopped_at = self._clock.seconds()
        return succeed(None)


def outcome(d):
    results = []
    d.addBoth(results.append)
    return results


def test_drain_serves_for_the_delay_then_stops_accepting_and_waits_for_requests():
    clock = Clock()
    drain = Drain(clock, 5, 30)
    drain.started()
    drain.started()
    port = FakePort(clock)
    result = outcome(Deferred.fromCoroutine(drain.run([port])))
    assert drain.draining and port.stopped_at is None
    clock.advance(4.9)
    assert port.stopped_at is None
    clock.advance(0.1)
    assert port.stopped_at == 5 and result == []
    drain.ended()
    clock.advance(10)
    assert result == [] and drain.in_flight == 1
    drain.ended()
    assert result == [0] and drain.in_flight == 0


def test_drain_gives_up_on_requests_after_its_timeout():
    clock = Clock()
    drain = Drain(clock, 5, 30)
    drain.started()
    result = outcome(Deferred.fromCoroutine(drain.run([FakePort(clock)])))
    clock.advance(5)
    clock.advance(29.9)
    assert result == []
    clock.advance(0.1)
    assert result == [1]


def test_drain_with_nothing_in_flight_ends_when_the_ports_stop():
    clock = Clock()
    drain = Drain(clock, 2, 30)
    result = outcome(Deferred.fromCoroutine(drain.run([FakePort(clock)])))
    clock.advance(2)
    assert result == [0]


def test_the_site_counts_requests_from_their_first_byte_and_closes_connections_while_draining():
    listener = Listener()
    protocol, transport = listener.send(request_head("POST", "/api/auth/oauth2/token", {"Content-Length": 10}))
    assert listener.drain.in_flight == 1
    protocol.dataReceived(b"grant_type")
    assert listener.drain.in_flight == 0
    assert parse(transport)[0] == 400
    assert not transport.disconnecting

    cut, transport = listener.send(request_head("POST", "/api/auth/oauth2/token", {"Content-Length": 10}))
    cut.dataReceived(b"grant")
    assert listener.drain.in_flight == 1
    listener.close(cut, transport)
    assert listener.drain.in_flight == 0

    listener.drain.draining = True
    _, transport = listener.send(request_head("GET", "/healthz"))
    status, headers, _ = parse(transport)
    assert (status, headers["connection"]) == (200, "close")
    assert transport.disconnecting


class Parts:
    """What the service owns, noting when each is closed."""

    def __init__(self, clock):
        self.clock = clock
        self.closed: dict[str, float] = {}

    def server_key(self, name):
        return succeed(bytes(32))

    def put_client(self, client):
        return succeed(None)

    def list_clients(self):
        return succeed([])

    def maintain(self, now):
        return succeed(None)

    def gc(self, now, batch):
        return succeed(0)

    def close(self):
        self.closed["store"] = self.clock.seconds()
        return succeed(None)

    def stop(self):
        self.closed["context"] = self.clock.seconds()


def test_the_service_is_not_ready_at_once_and_closes_its_pools_after_draining():
    clock = Clock()
    parts = Parts(clock)
    config = parse_config({"server": {"drain_delay": "3s", "drain_timeout": "10s"}}, None)
    drain = Drain(clock, config.shutdown.delay, config.shutdown.timeout)
    port = FakePort(clock)
    service = AuthsrvService(
        reactor=clock, config=config, context=parts, store=parts, keystore=parts, identity=IdentityChain([]),
        ports=[port], drain=drain,
    )
    service.startService()
    assert service.readiness_problem() is None
    drain.started()
    stopped = outcome(service.stopService())
    assert service.readiness_problem() == "draining"
    clock.advance(3)
    assert port.stopped_at == 3 and parts.closed == {} and stopped == []
    clock.advance(1)
    drain.ended()
    assert parts.closed == {"store": 4, "context": 4} and stopped == [None]


@pytest.mark.parametrize("answered_at", [6, None])
def test_the_service_lets_back_channel_logouts_finish_within_the_drain_time(answered_at, audit):
    """
    A ban answers before its back-channel logouts are delivered: a stopping
    service waits for them before closing the store, within the drain's
    delay and timeout (3 + 10 s here), and cuts off one still running then,
    reporting it, so that stopping takes no longer than it did.
    """
    clock = Clock()
    parts = Parts(clock)
    config = parse_config({"server": {"drain_delay": "3s", "drain_timeout": "10s"}}, None)
    rp = FakeRelyingParty([HANG])
    notifier = BackchannelNotifier(clock, lambda address: rp.http, attempt_timeout=60)
    service = AuthsrvService(
        reactor=clock, config=config, context=parts, store=parts, keystore=parts, identity=IdentityChain([]),
        ports=[FakePort(clock)], drain=Drain(clock, config.shutdown.delay, config.shutdown.timeout),
        notifier=notifier,
    )
    service.startService()
    store = MemoryStore()
    outcome(store.put_client(Client("rp", None, ["http://127.0.0.1:9/cb"], backchannel_logout_uri=FIRST_URI)))
    outcome(Deferred.fromCoroutine(start_grant(store, "g-rp", ALICE.sub, "rp", sid="sid-1")))
    notifier.session_ended(store, SessionNamingSigner(), ISSUER, BrowserSession(token_hash("c"), "sid-1", ALICE.sub, 0, 0, 10**9))
    rp.http.flush()
    assert len(rp.held) == 1

    stopped = outcome(service.stopService())
    clock.advance(3)
    assert stopped == [] and parts.closed == {}
    if answered_at is not None:
        clock.advance(answered_at - 3)
        rp.held[0].setResponseCode(200)
        rp.held[0].finish()
        rp.http.flush()
        assert stopped == [None] and parts.closed == {"store": 6, "context": 6}
        assert audit.of("logout.backchannel")[0]["outcome"] == "delivered (HTTP 200) at attempt 1"
        return
    clock.advance(9.9)
    assert stopped == [] and parts.closed == {}
    clock.advance(0.1)
    rp.http.flush()
    assert stopped == [None] and parts.closed == {"store": 13, "context": 13}
    assert audit.of("logout.backchannel")[0]["outcome"] == "cut off at shutdown (attempt 1)"


@pytest.mark.slow
def test_sigterm_with_100_slow_requests_in_flight_answers_every_one_and_exits_0(run_server, tmp_path):
    config_path, _ = prepare_data_dir(tmp_path / "data")
    text = config_path.read_text()
    config_path.write_text(text.replace("[server]\n", '[server]\ndrain_delay = "1s"\ndrain_timeout = "20s"\n', 1))
    port = free_port()
    server = run_server(
        ["authsrv", "--config", str(config_path), "--listen", f"tcp:{port}:interface=127.0.0.1"], tmp_path, port=port
    )
    body = urlencode({"grant_type": "authorization_code", "code": "c" * 40, "client_id": "nobody",
                      "redirect_uri": "http://127.0.0.1:9000/callback", "code_verifier": "v" * 50}).encode()
    head = request_head("POST", "/api/auth/oauth2/token", {
        "Content-Type": "application/x-www-form-urlencoded", "Content-Length": len(body),
    })
    half = len(body) // 2
    sockets = []
    try:
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(head + body[:half])
            sockets.append(s)
        time.sleep(0.5)
        server.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 0.8
        while (answer := fetch(server.base + "/readyz"))[0] != 503:
            assert time.monotonic() < deadline, answer
            time.sleep(0.02)
        assert json.loads(answer[2]) == {"status": "unavailable", "reason": "draining"}
        time.sleep(1.5)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
        assert server.process.poll() is None, "stopped with requests in flight"
        for s in sockets:
            s.sendall(body[half:])
        for s in sockets:
            response = HTTPResponse(s)
            response.begin()
            payload = json.loads(response.read())
            assert response.status == 401 and payload["error"] == "invalid_client", payload
            assert response.getheader("connection") == "close"
    finally:
        for s in sockets:
            s.close()
    assert server.process.wait(timeout=30) == 0
    out, err = server.output()
    assert "draining" in out + err and "cut off" not in out + err


class StoppingReactor:
    """Records stop() calls and, like a reactor, refuses a second one."""

    def __init__(self):
        self.stops = 0

    def callFromThread(self, function, *args):
        function(*args)

    def stop(self):
        self.stops += 1
        if self.stops > 1:
            raise ReactorNotRunning("Can't stop reactor that isn't running.")


def test_sigterm_while_already_stopping_is_quiet():
    """Ctrl-C reaches the workers and the parent, whose SIGTERM then finds them stopping already."""
    reactor = StoppingReactor()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm(reactor)
        reactor.stop()
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert reactor.stops == 2


class LostPort:
    """A port whose socket is already gone: Twisted's stopListening then answers None."""

    def stopListening(self):
        return None


def test_a_port_already_lost_does_not_stop_the_drain():
    clock = Clock()
    done = outcome(Deferred.fromCoroutine(Drain(clock, 1, 30).run([LostPort(), FakePort(clock)])))
    clock.advance(1)
    assert done == [0]
