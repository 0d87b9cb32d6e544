"""
Responses gathered and sent in one piece (L{authsrv.web.channel}), over real
loopback sockets: what reaches the client is byte for byte in order, kept
connections, pipelined requests, answers larger than the socket takes at
once and closing answers alike, and a small answer never passes through
Twisted's write buffer.
"""

from __future__ import annotations

import socket
import ssl
import time

import pytest
import pytest_twisted
from twisted.internet import reactor, tcp
from twisted.internet import ssl as ssl_options
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.protocol import Protocol
from twisted.internet.task import Clock, deferLater
from twisted.internet.threads import deferToThread
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

from authsrv.config import InputLimits
from authsrv.web.channel import Outbox
from authsrv.web.limits import LimitedChannel, LimitedSite
from slapd import make_tls_files

BIG = bytes(range(256)) * (64 * 1024)
"""16 MiB: more than a loopback socket takes in one send."""
SIZED = {b"/16k": BIG[:16 * 1024], b"/1m": BIG[:1024 * 1024]}
"""Answers held back in the outbox (under the gathering limit) and sent on as they are made (over it)."""
NARROW = {b"/narrow/1m": BIG[:1024 * 1024], b"/narrow/256k": BIG[:256 * 1024]}
"""Answers sent on a socket that takes 16 KiB at once."""


class Answers(Resource):
    isLeaf = True

    def __init__(self):
        super().__init__()
        self.made = 0

    def render_GET(self, request):
        if request.path == b"/big":
            return BIG
        if request.path in SIZED:
            self.made += 1
            return SIZED[request.path]
        if request.path in NARROW:  # a socket that takes little at once, as over a slow link
            request.channel.transport.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
            return NARROW[request.path]
        if request.path == b"/later":
            reactor.callLater(0.01, self._late, request)
            return NOT_DONE_YET
        return b"hello"

    def render_POST(self, request):
        return b"posted " + request.content.read()

    def _late(self, request):
        request.write(b"late")
        request.finish()


class Reader(Protocol):
    """Reads until C{done(received)} says the answers are all there, or the connection closes."""

    def __init__(self, done, at_least=0):
        self.received = bytearray()
        self.at_least = at_least
        self.finished = Deferred()
        self._done = done

    def dataReceived(self, data):
        self.received += data
        if len(self.received) >= self.at_least and self._done(bytes(self.received)) and not self.finished.called:
            self.finished.callback(bytes(self.received))

    def connectionLost(self, reason):
        if not self.finished.called:
            self.finished.callback(bytes(self.received))


@pytest.fixture
def port():
    site = LimitedSite(Answers(), limits=InputLimits(), reactor=reactor)
    listening = reactor.listenTCP(0, site, interface="127.0.0.1")
    yield listening.getHost().port
    listening.stopListening()


def get(path: str, close: bool = False) -> bytes:
    connection = b"Connection: close\r\n" if close else b""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + connection + b"\r\n"


def post(path: str, body: bytes) -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def bodies(received: bytes) -> list[bytes]:
    """The bodies of the answers in C{received}, in order (Content-Length or chunked)."""
    found = []
    while received:
        head, _, rest = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 "), head
        fields = dict(line.lower().split(b": ", 1) for line in head.split(b"\r\n")[1:])
        if b"content-length" in fields:
            length = int(fields[b"content-length"])
            assert len(rest) >= length
            body, rest = rest[:length], rest[length:]
        else:
            body = b""
            while True:
                size, _, rest = rest.partition(b"\r\n")
                length = int(size, 16)
                if length == 0:
                    rest = rest[2:]
                    break
                body, rest = body + rest[:length], rest[length + 2:]
        found.append(body)
        received = rest
    return found


def complete(count: int):
    def done(received: bytes) -> bool:
        try:
            return len(bodies(received)) == count
        except (ValueError, AssertionError, IndexError):
            return False
    return done


async def connect(port: int, count: int, at_least: int = 0) -> Reader:
    reader = Reader(complete(count), at_least)
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", port), reader)
    return reader


async def within(reader: Reader, seconds: float = 10) -> bytes:
    timer = reactor.callLater(seconds, reader.transport.abortConnection)
    received = await reader.finished
    if timer.active():
        timer.cancel()
    return received


@pytest_twisted.ensureDeferred
async def test_small_answers_on_a_kept_connection_go_through_the_outbox_and_skip_the_write_buffer(port, monkeypatch):
    registered, held = [], []
    start_writing, hold = tcp.Server.startWriting, Outbox.hold
    monkeypatch.setattr(tcp.Server, "startWriting", lambda self: (registered.append(self), start_writing(self)))
    monkeypatch.setattr(Outbox, "hold", lambda self, channel: (held.append(channel), hold(self, channel)))
    requests = (get("/small"), get("/later"), post("/small", b"form"), get("/small"))
    for count, request in enumerate(requests, start=1):
        if count == 1:
            reader = await connect(port, 1)
        else:
            reader.finished, reader._done = Deferred(), complete(count)
        reader.transport.write(request)
        assert len(bodies(await within(reader))) == count
    assert bodies(bytes(reader.received)) == [b"hello", b"late", b"posted form", b"hello"]
    assert registered == [] and len(held) == len(requests)
    reader.transport.loseConnection()


@pytest_twisted.ensureDeferred
async def test_pipelined_requests_are_answered_in_order(port):
    reader = await connect(port, 4)
    reader.transport.write(get("/small") + get("/later") + post("/small", b"form") + get("/later"))
    assert bodies(await within(reader)) == [b"hello", b"late", b"posted form", b"late"]
    reader.transport.loseConnection()


@pytest_twisted.ensureDeferred
async def test_an_answer_larger_than_the_socket_takes_arrives_whole_and_before_the_next(port):
    reader = await connect(port, 3, at_least=len(BIG))
    reader.transport.write(get("/big") + get("/small"))
    reader.transport.write(get("/later"))
    assert bodies(await within(reader)) == [BIG, b"hello", b"late"]
    reader.transport.loseConnection()


@pytest_twisted.ensureDeferred
async def test_an_answer_that_closes_the_connection_arrives_whole_first(port):
    for path in ("/small", "/later"):
        reader = await connect(port, 2)
        reader.transport.write(get(path, close=True))
        received = await within(reader)
        assert bodies(received) == [b"late" if path == "/later" else b"hello"]
        assert not reader.transport.connected


@pytest.mark.parametrize(("path", "count"), [(b"/16k", 1600), (b"/1m", 64)])
@pytest_twisted.ensureDeferred
async def test_a_client_that_reads_no_answers_gets_no_more_made_than_its_socket_takes(path, count):
    answers = Answers()
    listening = reactor.listenTCP(0, LimitedSite(answers, limits=InputLimits(), reactor=reactor), interface="127.0.0.1")
    reader = Reader(lambda received: received.count(b"HTTP/1.1 200 ") == count, at_least=count * len(SIZED[path]))
    await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", listening.getHost().port), reader)
    reader.transport.pauseProducing()
    reader.transport.write(get(path.decode()) * count)
    made = -1
    for _ in range(50):
        if answers.made == made:
            break
        made = answers.made
        await deferLater(reactor, 0.2)
    assert 0 < answers.made < count // 2
    reader.transport.resumeProducing()
    assert (await within(reader, 30)).count(b"HTTP/1.1 200 ") == count
    reader.transport.loseConnection()
    await listening.stopListening()


def read_slowly(port: int, path: str, chunk: int, pause: float, seconds: float, tls: bool) -> tuple[int, str, float]:
    """
    GET C{path} with Connection: close on a socket of a small receive
    buffer, reading C{chunk} bytes every C{pause} seconds for at most
    C{seconds}: the bytes received, how the connection ended, and when the
    client let go of it (holding it a second after the answer's end, as a
    TLS client that sends no close alert may).
    """
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    raw.connect(("127.0.0.1", port))
    client = ssl._create_unverified_context().wrap_socket(raw) if tls else raw
    with client:
        client.sendall(get(path, close=True))
        received, how = 0, "still open"
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                data = client.recv(chunk)
            except (ConnectionResetError, ssl.SSLError):
                how = "reset"
                break
            if not data:
                how = "closed"
                time.sleep(1)
                break
            received += len(data)
            time.sleep(pause)
        return received, how, time.monotonic()


@pytest.mark.parametrize("tls", [False, True], ids=["tcp", "tls"])
@pytest.mark.parametrize(("path", "chunk", "pause", "whole"), [
    ("/narrow/1m", 16 * 1024, 0.01, True),
    ("/narrow/256k", 16 * 1024, 0.25, True),
    ("/narrow/1m", 256, 0.5, False),
], ids=["fast", "steady", "trickle"])
@pytest_twisted.ensureDeferred
async def test_a_closing_answer_reaches_a_slow_reader_whole_and_one_that_barely_reads_is_aborted(
        monkeypatch, tmp_path, path, chunk, pause, whole, tls):
    """
    The abort of a connection the server closes waits for a client still
    taking its answer (about 1.6 MB a second for some 0.7 s, or 64 KiB a
    second for 4 s, against an abort time of 2 s), not for one taking
    next to nothing (512 bytes a second), whose connection the server has
    let go of within seconds. Over TLS, a connection whose socket holds
    the rest of the answer is closed as over TCP, not aborted, though the
    client never answers the close alert. The margins are wide (the steady
    client takes eight times the bytes it must in each period, the trickle
    waits four periods) so that a busy machine's pauses decide nothing.
    """
    monkeypatch.setattr(LimitedChannel, "abortTimeout", 2.0)
    site = LimitedSite(Answers(), limits=InputLimits(), reactor=reactor)
    if tls:
        make_tls_files(tmp_path)
        options = ssl_options.DefaultOpenSSLContextFactory(str(tmp_path / "server.key"), str(tmp_path / "server.pem"))
        listening = reactor.listenSSL(0, site, options, interface="127.0.0.1")
    else:
        listening = reactor.listenTCP(0, site, interface="127.0.0.1")
    reading = deferToThread(read_slowly, listening.getHost().port, path, chunk, pause, 20 if whole else 8, tls)
    let_go = None
    while not reading.called:
        if let_go is None and site.open_connections == 0:
            let_go = time.monotonic()
        await deferLater(reactor, 0.05)
    received, how, client_let_go = await reading
    if whole:
        assert how == "closed" and received > len(NARROW[path.encode()])
    else:
        assert received < len(NARROW[path.encode()]) // 2
    assert let_go is not None and let_go < client_let_go
    await listening.stopListening()


class Holding:
    """A channel holding a finished answer, as the outbox sees it."""

    def __init__(self, name: str, sent: list[str]):
        self.name, self._sent = name, sent

    def send_held(self):
        self._sent.append(self.name)


def test_a_lone_answer_goes_at_once_and_a_busy_turns_answers_at_its_end():
    clock, sent = Clock(), []
    outbox = Outbox(clock.callLater)

    def turn(names: str) -> list[str]:
        """Answers C{names} in one turn; what went before the turn's end."""
        for name in names:
            outbox.hold(Holding(name, sent))
        before = list(sent)
        clock.advance(0)
        assert sent[len(sent) - len(names):] == list(names)
        sent.clear()
        return before

    assert turn("a") == ["a"]
    assert turn("bcd") == ["b"]
    assert turn("ef") == []
    assert turn("g") == []
    assert turn("h") == ["h"]
