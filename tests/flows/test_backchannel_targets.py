"""
Back-channel logout targets (server-side request forgery): a URI whose host
is or resolves to a link-local, cloud-metadata, unspecified, multicast or
broadcast address is refused at registration and at delivery, where it is
an audit outcome and never a request. A delivery resolves the name once,
with a fake resolver here, and connects to that address, sending the name.
"""

from __future__ import annotations

import tracemalloc

import pytest
import pytest_twisted
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.protocol import Factory
from twisted.internet.task import Clock, deferLater
from twisted.web.client import URI, Agent
from twisted.web.server import NOT_DONE_YET, Site

from authsrv.configsection import ConfigError
from authsrv.config import parse_config
from authsrv.flows import backchannel
from authsrv.flows.backchannel import BackchannelNotifier, PinnedEndpoints
from authsrv.protocol.targets import address_problem, backchannel_uri_problem

from conftest import admin, refused
from test_backchannel import FakeRelyingParty
from test_remote_documents import EndlessHeaders

def _outcomes(audit) -> dict[str, str]:
    return {e["client_id"]: e["outcome"] for e in audit.of("logout.backchannel")}


REFUSED = [
    ("169.254.169.254", "cloud metadata"),
    ("fd00:ec2::254", "cloud metadata"),
    ("::ffff:169.254.169.254", "cloud metadata"),
    ("64:ff9b::a9fe:a9fe", "cloud metadata"),
    ("169.254.10.1", "link-local"),
    ("fe80::1", "link-local"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("224.0.0.251", "multicast"),
    ("ff02::1", "multicast"),
    ("255.255.255.255", "broadcast"),
]
ALLOWED = ["127.0.0.1", "::1", "10.1.2.3", "192.168.0.10", "172.16.5.5", "fd12:3456::1", "203.0.113.7", "rp.example"]


@pytest.mark.parametrize("address, kind", REFUSED)
def test_refused_addresses(address, kind):
    assert kind in address_problem(address)


@pytest.mark.parametrize("address", ALLOWED)
def test_loopback_private_and_public_addresses_are_allowed(address):
    assert address_problem(address) is None


def test_registration_in_the_config_file_refuses_a_metadata_target():
    client = {"client_id": "web", "redirect_uris": ["https://shop.example/cb"],
              "backchannel_logout_uri": "https://169.254.169.254/latest/meta-data"}
    with pytest.raises(ConfigError, match=r"^clients\[0\]\.backchannel_logout_uri: .* cloud metadata address"):
        parse_config({"clients": [client]}, None)
    client["backchannel_logout_uri"] = "https://[fe80::1]/logout"
    with pytest.raises(ConfigError, match="link-local"):
        parse_config({"clients": [client]}, None)
    client["backchannel_logout_uri"] = "https://10.0.0.8/logout"
    assert parse_config({"clients": [client]}, None).clients[0].backchannel_logout_uri == "https://10.0.0.8/logout"


def test_a_back_channel_uri_must_be_http():
    assert "https" in backchannel_uri_problem("com.example.app:/logout")


@pytest_twisted.ensureDeferred
async def test_registration_by_the_operator_refuses_a_metadata_target(deployment):
    cwd, config = deployment
    result = await admin("--config", config, "client", "add", "web", "--redirect-uri", "https://shop.example/cb",
                         "--backchannel-logout-uri", "https://169.254.169.254/logout", cwd=cwd)
    refused(result, "--backchannel-logout-uri: 'https://169.254.169.254/logout' is refused")


class FakeResolver:
    """Answers each lookup with the next of C{answers} (a list of addresses, or an exception)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.asked: list[str] = []

    def __call__(self, host):
        self.asked.append(host)
        answer = self.answers.pop(0)
        return fail(answer) if isinstance(answer, Exception) else succeed(answer)


class Connections:
    """C{http_for}: notes each pinned address, hands out the fake relying party's client."""

    def __init__(self, rp: FakeRelyingParty):
        self.rp = rp
        self.pinned: list[str] = []

    def __call__(self, address):
        self.pinned.append(address)
        return self.rp.http


def deliver(uri, resolver, answers=()):
    clock = Clock()
    rp = FakeRelyingParty(answers)
    connections = Connections(rp)
    notifier = BackchannelNotifier(clock, connections, resolve=resolver)
    d = Deferred.fromCoroutine(notifier.deliver(uri, "the-logout-token", "first", "sid-1"))
    rp.http.flush()
    return clock, connections, d


@pytest.mark.parametrize("answer", [["169.254.169.254"], ["10.0.0.5", "fd00:ec2::254"], ["224.0.0.1"]])
def test_a_name_resolving_to_a_refused_address_gets_no_request(audit, answer):
    clock, connections, d = deliver("https://rp.example/logout", FakeResolver(answer))
    assert d.result.startswith("refused target (rp.example resolves to ")
    assert connections.pinned == [] and connections.rp.received == []
    assert _outcomes(audit) == {"first": d.result}
    assert clock.getDelayedCalls() == []


def test_a_refused_literal_address_is_not_even_resolved(audit):
    resolver = FakeResolver()
    _, connections, d = deliver("https://169.254.169.254/logout", resolver)
    assert d.result == "refused target (169.254.169.254 is a cloud metadata address)"
    assert resolver.asked == [] and connections.rp.received == []


def test_the_name_is_resolved_once_and_every_attempt_goes_to_that_address():
    resolver = FakeResolver(["192.0.2.10"], ["169.254.169.254"], ["169.254.169.254"])
    clock, connections, d = deliver("http://rp.example:9000/logout", resolver, [500, 503, 200])
    clock.advance(1)
    connections.rp.http.flush()
    clock.advance(5)
    connections.rp.http.flush()
    assert d.result == "delivered (HTTP 200) at attempt 3"
    assert resolver.asked == ["rp.example"]
    assert connections.pinned == ["192.0.2.10"]
    assert [r["url"] for r in connections.rp.received] == ["rp.example:9000/logout"] * 3


def test_a_failed_lookup_is_retried_and_then_given_up():
    resolver = FakeResolver(OSError("no answer"), OSError("no answer"), OSError("no answer"))
    clock, connections, d = deliver("http://rp.example/logout", resolver)
    clock.advance(1)
    clock.advance(5)
    assert d.result == "gave up after 3 attempts, last: OSError resolving the host"
    assert connections.rp.received == []


@pytest_twisted.ensureDeferred
async def test_the_default_client_connects_to_the_resolved_address_and_sends_the_name():
    rp = FakeRelyingParty()
    port = reactor.listenTCP(0, Site(rp), interface="127.0.0.1")
    number = port.getHost().port
    resolver = FakeResolver(["127.0.0.1"])
    try:
        notifier = BackchannelNotifier(reactor, backchannel.default_http_client(reactor), resolve=resolver)
        uri = f"http://rp.invalid:{number}/backchannel"
        outcome = await Deferred.fromCoroutine(notifier.deliver(uri, "the-logout-token", "first", "sid-1"))
    finally:
        await port.stopListening()
    assert outcome == "delivered (HTTP 200) at attempt 1"
    assert rp.received[0]["url"] == f"rp.invalid:{number}/backchannel"


def test_https_checks_the_certificate_against_the_name():
    class Policy:
        def __init__(self):
            self.asked = []

        def creatorForNetloc(self, hostname, port):
            self.asked.append((hostname, port))
            return object()

    policy = Policy()
    PinnedEndpoints(reactor, "192.0.2.10", policy).endpointForURI(URI.fromBytes(b"https://rp.example:8443/logout"))
    assert policy.asked == [(b"rp.example", 8443)]


class NeverFinishing(FakeRelyingParty):
    """Answers 200 and then never finishes the body."""

    def render_POST(self, request):
        super().render_POST(request)
        request.write(b"ok")
        self.held.append(request)
        return NOT_DONE_YET


@pytest_twisted.ensureDeferred
async def test_a_connection_is_aborted_at_its_lifetime_even_after_the_answer():
    """An answer whose body never ends would otherwise hold the socket for as long as the relying party likes."""
    rp = NeverFinishing()
    port = reactor.listenTCP(0, Site(rp), interface="127.0.0.1")
    clock = Clock()
    lifetime = backchannel.ATTEMPT_TIMEOUT

    def http_for(address):
        return HTTPClient(Agent.usingEndpointFactory(
            reactor, PinnedEndpoints(reactor, address, lifetime=lifetime, clock=clock)))

    try:
        notifier = BackchannelNotifier(reactor, http_for, resolve=FakeResolver(["127.0.0.1"]))
        uri = f"http://rp.invalid:{port.getHost().port}/backchannel"
        assert await Deferred.fromCoroutine(notifier.deliver(uri, "token", "first", "sid-1")) == \
            "delivered (HTTP 200) at attempt 1"
        lost: list = []
        rp.held[0].notifyFinish().addErrback(lost.append)
        clock.advance(lifetime)
        for _ in range(100):
            if lost:
                break
            await deferLater(reactor, 0.01)
        assert lost, "the connection is still open"
    finally:
        await port.stopListening()


@pytest_twisted.ensureDeferred
async def test_an_answer_whose_headers_never_end_is_cut_off():
    """
    The HTTP client keeps every header line: a relying party sending them
    without end filled the memory until the connection's lifetime ended.
    """
    port = reactor.listenTCP(0, Factory.forProtocol(EndlessHeaders), interface="127.0.0.1")
    tracemalloc.start()
    try:
        notifier = BackchannelNotifier(reactor, backchannel.default_http_client(reactor), retry_delays=(),
                                       resolve=FakeResolver(["127.0.0.1"]))
        uri = f"http://rp.invalid:{port.getHost().port}/backchannel"
        outcome = await Deferred.fromCoroutine(notifier.deliver(uri, "token", "first", "sid-1"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await port.stopListening()
    assert outcome == "gave up after 1 attempts, last: ResponseFailed"
    assert peak < 4 * 1024 * 1024
