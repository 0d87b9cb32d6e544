"""
The chat provider client against a platform that misbehaves on the wire: a
server on 127.0.0.1 (or whoever answers in the platform's name) that sends
headers or a body without end, drips its answer, never answers, or answers
garbage, errors and malformed tokens. Every call ends as
L{ChatProviderUnavailable} within the timeout, no connection outlives it,
and what the server may make the client take is bounded, as for the
server's other outbound requests (authsrv.remote_documents).
"""

from __future__ import annotations

import io
import json
import threading
import time
from contextlib import asynccontextmanager

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import ensureDeferred
from twisted.internet.interfaces import IPullProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock, deferLater
from twisted.logger import formatEvent, globalLogPublisher, textFileLogObserver
from twisted.python.threadpool import ThreadPool
from zope.interface import implementer

from hanging_lookups import Hanging, drained, one_thread

from authsrv.chat.config import ChatConfig
from authsrv.chat.crypto import key_from_text, new_key_text
from authsrv.chat.errors import ChatError, ChatProviderUnavailable, ChatRefreshRefused
from authsrv.chat.provider import LOOKUPS_WAITING, MAX_EXPIRES_IN, RECEIVE_LIMIT, ChatProvider, PlatformClient
from authsrv.hostlookup import HostLookups, host_addresses
from authsrv.tap import diagnostic_log_factory

TIMEOUT = 10
"""Seconds of the test's clock a call waits."""

CHUNK = b"X-Padding: " + b"a" * 1000 + b"\r\n"


@implementer(IPullProducer)
class Endless:
    """Writes C{chunk} again each time the transport asks for more, until the connection goes."""

    def __init__(self, connection: Wire, chunk: bytes):
        self._connection = connection
        self._chunk = chunk * 64

    def resumeProducing(self):
        self._connection.send(self._chunk)

    def stopProducing(self):
        pass


class Wire(Protocol):
    """One connection: once a request's head has arrived, the platform's script answers it."""

    def connectionMade(self):
        self.sent = 0
        self.closed = False
        self._received = b""
        self.asked = False
        self.factory.connections.append(self)

    def dataReceived(self, data):
        self._received += data
        if not self.asked and b"\r\n\r\n" in self._received:
            self.asked = True
            self.factory.script(self)

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.sent += len(data)
            self.transport.write(data)

    def endless(self, head: bytes, chunk: bytes) -> None:
        self.send(head)
        self.transport.registerProducer(Endless(self, chunk), False)

    def connectionLost(self, reason):
        self.closed = True


class Platform(Factory):
    """A scripted platform; C{script(wire)} answers, C{connections} are every connection it was given."""

    protocol = Wire

    def __init__(self, script):
        self.script = script
        self.connections: list[Wire] = []


def canned(status: int, body: bytes, content_type: bytes = b"application/json"):
    """A script answering C{status} with C{body}, then closing."""
    def script(wire: Wire) -> None:
        wire.send(b"HTTP/1.1 %d Whatever\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                  % (status, content_type, len(body), body))
        wire.transport.loseConnection()

    return script


def token_answer(**fields) -> bytes:
    return json.dumps({"access_token": "at", "refresh_token": "rt", "token_type": "Bearer", "expires_in": 3600,
                       "scope": "identify", **fields}).encode()


@asynccontextmanager
async def platform(script, host: str = "127.0.0.1", lookups: ThreadPool | None = None, *,
                   lookup=host_addresses, waiting: int = LOOKUPS_WAITING):
    """
    C{script} served on 127.0.0.1, and a provider whose endpoints all name it
    by C{host}, looked up by C{lookup} on C{lookups} (a pool of its own by
    default), at most C{waiting} lookups waiting.
    """
    served = Platform(script)
    port = reactor.listenTCP(0, served, interface="127.0.0.1")
    own = lookups is None
    if own:
        lookups = ThreadPool(minthreads=0, maxthreads=1)
        lookups.start()
    clock = Clock()
    base = f"http://{host}:{port.getHost().port}"
    config = ChatConfig(
        encryption_key=key_from_text(new_key_text()), client_id="client", client_secret="secret",
        token_url=base + "/token", user_url=base + "/me", revocation_url=base + "/revoke",
        timeout=TIMEOUT, lock_ttl=TIMEOUT + 1,
    )
    try:
        yield served, clock, ChatProvider(clock, PlatformClient(reactor, HostLookups(reactor, lookups, waiting, lookup), TIMEOUT, clock=clock), config)
    finally:
        for wire in served.connections:
            wire.transport.abortConnection()
        if own:
            lookups.stop()
        await port.stopListening()


async def until(condition, seconds: float = 5.0) -> bool:
    """Let the reactor run until C{condition()} holds, for at most C{seconds} of real time."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        await deferLater(reactor, 0.01, lambda: None)
    return True


CALLS = {
    "refresh": lambda provider: provider.refresh("stored-refresh-token"),
    "exchange_code": lambda provider: provider.exchange_code("code", "verifier", "https://auth.test/cb"),
    "current_user": lambda provider: provider.current_user("access-token"),
    "revoke": lambda provider: provider.revoke("access-token", "access_token"),
}


@pytest.mark.parametrize("method", sorted(CALLS))
@pytest_twisted.ensureDeferred
async def test_headers_without_end_are_cut_off(method):
    """Twisted's HTTP client keeps every header line a server sends: the connection is cut past the limit."""
    async with platform(lambda wire: wire.endless(b"HTTP/1.1 200 OK\r\n", CHUNK)) as (served, clock, provider):
        d = ensureDeferred(CALLS[method](provider))
        assert await until(lambda: d.called), "the call is still reading headers"
        with pytest.raises(ChatProviderUnavailable, match="too large"):
            await d
        assert await until(lambda: served.connections[0].closed)
        assert RECEIVE_LIMIT < served.connections[0].sent < 32 * RECEIVE_LIMIT


@pytest.mark.parametrize("framing", [b"Transfer-Encoding: chunked\r\n\r\n", b"Content-Length: 99999999999\r\n\r\n"])
@pytest_twisted.ensureDeferred
async def test_a_body_without_end_is_cut_off(framing):
    chunk = b"400\r\n" + b"a" * 1024 + b"\r\n" if b"chunked" in framing else b"a" * 1024
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + framing
    async with platform(lambda wire: wire.endless(head, chunk)) as (served, clock, provider):
        d = ensureDeferred(provider.refresh("stored-refresh-token"))
        assert await until(lambda: d.called)
        with pytest.raises(ChatProviderUnavailable, match="too large"):
            await d
        assert await until(lambda: served.connections[0].closed)


def drip(wire: Wire) -> None:
    """Headers, then one byte of a promised body, then nothing: a peer that keeps the socket."""
    wire.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")


def silent(wire: Wire) -> None:
    pass


def headers_dripped(wire: Wire) -> None:
    wire.send(b"HTTP/1.1 200 OK\r\nX-Slow: 1\r\n")


@pytest.mark.parametrize("script", [drip, silent, headers_dripped])
@pytest.mark.parametrize("method", sorted(CALLS))
@pytest_twisted.ensureDeferred
async def test_an_answer_that_never_ends_holds_no_socket_past_the_timeout(script, method):
    async with platform(script) as (served, clock, provider):
        d = ensureDeferred(CALLS[method](provider))
        assert await until(lambda: bool(served.connections) and served.connections[0].asked)
        await deferLater(reactor, 0.05, lambda: None)
        assert not d.called
        clock.advance(TIMEOUT)
        assert d.called, "the call outlived its timeout"
        with pytest.raises(ChatProviderUnavailable):
            await d
        assert await until(lambda: served.connections[0].closed), "the connection outlived the call"


GARBAGE = {
    "a server error": canned(500, b"Internal Server Error", b"text/plain"),
    "an HTML error page": canned(502, b"<html><body><h1>Bad Gateway</h1></body></html>", b"text/html"),
    "an HTML page with 200": canned(200, b"<html><body>Welcome</body></html>", b"text/html"),
    "broken JSON": canned(200, b'{"access_token": "at", '),
    "a JSON array": canned(200, b'["at"]'),
    "JSON text as text/plain that is not JSON": canned(200, b"access_token=at", b"text/plain"),
    "no access token": canned(200, json.dumps({"token_type": "Bearer", "expires_in": 3600}).encode()),
    "an empty access token": canned(200, token_answer(access_token="")),
    "a numeric access token": canned(200, token_answer(access_token=12345)),
    "an object refresh token": canned(200, token_answer(refresh_token={"token": "rt"})),
    "a numeric scope": canned(200, token_answer(scope=7)),
    "a negative expires_in": canned(200, token_answer(expires_in=-5)),
    "a zero expires_in": canned(200, token_answer(expires_in=0)),
    "a text expires_in": canned(200, token_answer(expires_in="3600")),
    "a boolean expires_in": canned(200, token_answer(expires_in=True)),
    "another token type": canned(200, token_answer(token_type="mac")),
    "a 429": canned(429, b'{"message": "You are being rate limited."}'),
    "a 403": canned(403, b'{"message": "Forbidden"}'),
    "a redirect": canned(302, b""),
    "a 400 without an error code": canned(400, b'{"message": "Bad"}'),
}


NOT_AN_ID = [b"{}", b'{"id": ""}', b'{"id": ["1"]}', b'{"id": true}', json.dumps({"id": "9" * 300}).encode(),
             b"<html></html>"]


@pytest.mark.parametrize("method, script", [
    *(("refresh", GARBAGE[answer]) for answer in sorted(GARBAGE)),
    *(("exchange_code", GARBAGE[answer])
      for answer in ["an HTML error page", "broken JSON", "a numeric access token", "a redirect"]),
    *(("current_user", canned(200, body)) for body in NOT_AN_ID),
    *(("revoke", GARBAGE[answer]) for answer in ["a server error", "an HTML error page", "a 403", "a redirect"]),
])
@pytest_twisted.ensureDeferred
async def test_garbage_answers_are_unavailable(method, script):
    async with platform(script) as (_, _clock, provider):
        with pytest.raises(ChatProviderUnavailable):
            await CALLS[method](provider)


@pytest_twisted.ensureDeferred
async def test_a_lifetime_of_centuries_is_taken_as_a_year():
    async with platform(canned(200, token_answer(expires_in=10 ** 30))) as (_, _clock, provider):
        tokens = await provider.refresh("stored-refresh-token")
        assert (tokens.access_token, tokens.refresh_token, tokens.expires_in) == ("at", "rt", MAX_EXPIRES_IN)


@pytest_twisted.ensureDeferred
async def test_invalid_grant_refuses_the_refresh_token():
    async with platform(canned(400, b'{"error": "invalid_grant"}')) as (_, _clock, provider):
        with pytest.raises(ChatRefreshRefused):
            await provider.refresh("stored-refresh-token")


@pytest.mark.parametrize("method", ["refresh", "exchange_code"])
@pytest_twisted.ensureDeferred
async def test_an_error_code_of_other_characters_than_oauths_is_neither_logged_nor_shown(method, logged):
    """
    The platform's error code went into the log line and the refusal's
    message as sent: a newline wrote a line of the platform's own into a
    text log, and ESC sequences reached the operator's terminal.
    """
    body = json.dumps({"error": "invalid_grant\nlevel=error forged line \x1b[2J"}).encode()
    async with platform(canned(400, body)) as (_, _clock, provider):
        with pytest.raises(ChatError) as refused:
            await CALLS[method](provider)
    told = [formatEvent(e) for e in logged if e.get("log_namespace") == "authsrv.chat.provider"]
    assert told and "a malformed error code" in str(refused.value)
    assert not [text for text in [*told, str(refused.value)] if "\n" in text or "\x1b" in text or "forged" in text]


@pytest_twisted.ensureDeferred
async def test_interim_answers_without_end_write_no_line_each_to_the_diagnostic_log():
    """
    Twisted's HTTP client logged a line for each 1xx answer it skipped:
    one answer's worth of bytes of C{100 Continue} made thousands of lines.
    """
    out = io.StringIO()
    observer = diagnostic_log_factory(textFileLogObserver, "text")(out)
    globalLogPublisher.addObserver(observer)
    try:
        async with platform(lambda wire: wire.endless(b"", b"HTTP/1.1 100 Continue\r\n\r\n")) as (_, _clock, provider):
            with pytest.raises(ChatProviderUnavailable, match="too large"):
                await provider.refresh("stored-refresh-token")
    finally:
        globalLogPublisher.removeObserver(observer)
    lines = out.getvalue().splitlines()
    assert len(lines) < 20 and not [line for line in lines if "Ignoring unexpected" in line], lines


@pytest_twisted.ensureDeferred
async def test_the_platforms_name_is_looked_up_on_the_pool_it_is_given():
    """
    A lookup may outlast any timeout when the platform's name servers never
    answer: it takes a thread of the platform's own pool, so the reactor's
    (which hashes passwords, say) stays free.
    """
    lookups = ThreadPool(minthreads=0, maxthreads=1)
    lookups.start()
    stuck = threading.Event()
    lookups.callInThread(stuck.wait)
    try:
        async with platform(canned(200, token_answer()), host="localhost", lookups=lookups) as (served, _, provider):
            d = ensureDeferred(provider.refresh("stored-refresh-token"))
            await deferLater(reactor, 0.3, lambda: None)
            assert not d.called and not served.connections, "the name was looked up elsewhere"
            stuck.set()
            assert (await d).access_token == "at"
    finally:
        stuck.set()
        lookups.stop()


@pytest_twisted.ensureDeferred
async def test_lookups_given_up_on_are_skipped_and_those_waiting_are_capped():
    """
    While the platform's name servers hang, calls time out but their lookups
    stayed queued, without end, and the pool ran every one of them before a
    fresh call's after the outage: now a lookup whose call timed out never
    runs, and a call beyond the lookups allowed to wait is unavailable at once.
    """
    hanging = Hanging("127.0.0.1")
    with one_thread(hanging) as lookups:
        async with platform(canned(200, token_answer()), host="chat.test", lookups=lookups, lookup=hanging,
                            waiting=2) as (served, clock, provider):
            calls = [ensureDeferred(provider.refresh("stored-refresh-token"))]
            assert hanging.started.wait(10)
            calls += [ensureDeferred(provider.refresh("stored-refresh-token")) for _ in range(2)]
            with pytest.raises(ChatProviderUnavailable, match="cannot be reached"):
                await provider.refresh("stored-refresh-token")
            clock.advance(TIMEOUT)
            for call in calls:
                with pytest.raises(ChatProviderUnavailable):
                    await call
            hanging.release.set()
            await drained(lookups)
            assert (await provider.refresh("stored-refresh-token")).access_token == "at"
            assert len(hanging.looked) == 2 and len(served.connections) == 1


@pytest_twisted.ensureDeferred
async def test_an_address_that_refuses_the_connection_gives_way_to_the_next():
    """A name with an address that refuses (IPv6 without a route, say) is still reached at its others."""
    async with platform(canned(200, token_answer()), host="chat.test",
                        lookup=lambda host: ["127.0.0.2", "127.0.0.1"]) as (served, _, provider):
        assert (await provider.refresh("stored-refresh-token")).access_token == "at"
        assert len(served.connections) == 1
