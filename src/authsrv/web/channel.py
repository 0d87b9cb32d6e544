"""
How the site's connections hand responses to the socket.

twisted.web writes a response in pieces (the status line and headers, the
body, the last chunk) into the transport's buffer, which registers the
socket with epoll for writability and unregisters it once the reactor has
sent it: two C{epoll_ctl} calls and a dispatch through the reactor for every
response. A L{GatheringChannel} gathers a request's response while it is
answered; on a busy server the responses of one turn of the reactor are
sent together, each with one C{send}, at the start of the next turn
(L{Outbox}), so that it still answers a batch of requests before it reads
the next one (bench/README.md, "One send per response"); a server that
answers one request a turn sends each answer the moment it is done.
"""

from __future__ import annotations

from typing import Callable

from twisted.internet import abstract, tcp
from twisted.web.http import HTTPChannel
from twisted.web.http_headers import Headers

GATHER_LIMIT = 64 * 1024
"""Bytes a response may gather before they are sent on, so a large answer is never held whole."""


def _plain_tcp(transport) -> bool:
    return type(transport) is tcp.Server


def _nothing_queued(transport) -> bool:
    """
    Whether C{transport} is a plain TCP connection, open, with nothing in
    its own buffer (the attributes of Twisted's C{FileDescriptor} that hold
    what is not yet sent), so that bytes sent now arrive in order.
    """
    return (
        _plain_tcp(transport)
        and transport.connected
        and not transport.disconnecting
        and not transport._tempDataBuffer
        and transport.offset == len(transport.dataBuffer)
    )


def socket_of(transport) -> abstract.FileDescriptor | None:
    """
    The Twisted C{FileDescriptor} (the TCP connection) under C{transport}:
    itself, or the one a TLS or PROXY-protocol wrapper writes to; None for
    any other transport (a test's).
    """
    while not isinstance(transport, abstract.FileDescriptor):
        transport = getattr(transport, "transport", None)
        if transport is None:
            return None
    return transport


def unsent_bytes(connection: abstract.FileDescriptor) -> int:
    """How many bytes written to C{connection} (L{socket_of}) its socket has not yet taken."""
    return len(connection.dataBuffer) - connection.offset + connection._tempDataLen


def send_now(transport, data: bytes) -> None:
    """
    C{data} to C{transport}: as much as the socket takes at once when
    nothing is queued ahead (L{_nothing_queued}); the rest, or all of it on any other
    transport (TLS, a PROXY-protocol wrapper, a test's) or on any socket
    error, through the transport's own buffer, which then also notices a
    lost connection.
    """
    if _nothing_queued(transport):
        try:
            sent = transport.socket.send(data)
        except OSError:
            sent = 0
        if sent == len(data):
            return
        data = data[sent:]
    transport.write(data)


class Outbox:
    """
    The channels holding a finished response, sent at the start of the
    reactor's next turn (C{call_later(0, ...)} runs before it polls again).
    While turns answer one request each (one client, or few), the first
    answer of a turn is sent at once instead: holding it would only delay
    it, by the rest of its request's work (the access log line, the
    request's teardown) and the turn's end. A turn that answered two or
    more makes the next hold all of its answers again, which keeps a busy
    server's batches whole (bench/README.md, "A lone answer at once").
    """

    def __init__(self, call_later: Callable):
        self._call_later = call_later
        self._channels: list[GatheringChannel] = []
        self._answered = 0
        self._alone = True

    def hold(self, channel: GatheringChannel) -> None:
        self._answered += 1
        if self._answered == 1:
            self._call_later(0, self._send)
            if self._alone:
                channel.send_held()
                return
        self._channels.append(channel)

    def _send(self) -> None:
        self._alone, self._answered = self._answered <= 1, 0
        channels, self._channels = self._channels, []
        for channel in channels:
            channel.send_held()


class GatheringChannel(HTTPChannel):
    """
    An L{HTTPChannel} that gathers each response from the moment its
    request has arrived whole until it is done, then hands it to C{outbox}
    (an L{Outbox}; without one, or on a transport other than plain TCP, it
    is sent at once). Held bytes are always sent before anything else is
    written to the connection, before it reads on and before it closes.
    A response that streams through a producer, or passes L{GATHER_LIMIT},
    is sent on as it comes; one written in parts without a producer waits
    until it is done (every route here writes its answer at once). The
    answers of pipelined requests are held up to L{GATHER_LIMIT} too, and
    while the transport's buffer is full no further request is parsed
    (L{pauseProducing}).
    """

    outbox: Outbox | None = None
    _gathered: list[bytes] | None = None
    _gathered_bytes = 0
    _held: list[bytes] | None = None
    _held_bytes = 0

    def send_held(self) -> None:
        held, self._held = self._held, None
        if held and self.transport is not None:
            send_now(self.transport, b"".join(held))

    def _send_gathered(self) -> None:
        """Send what is held and gathered, and stop gathering until the next request."""
        gathered, self._gathered, self._gathered_bytes = self._gathered, None, 0
        self.send_held()
        if gathered and self.transport is not None:
            send_now(self.transport, b"".join(gathered))

    def _gather(self, gathered: list[bytes], pieces) -> None:
        gathered.extend(pieces)
        self._gathered_bytes += sum(map(len, pieces))
        if self._gathered_bytes > GATHER_LIMIT:
            self._send_gathered()
            self._gathered = []

    def dataReceived(self, data):
        if self._held:
            self.send_held()
        super().dataReceived(data)

    def allContentReceived(self):
        self._gathered = []
        self._gathered_bytes = 0
        super().allContentReceived()

    def writeHeaders(self, version, code, reason, headers):
        gathered = self._gathered
        if gathered is None or not isinstance(headers, Headers):
            self._send_gathered()
            return super().writeHeaders(version, code, reason, headers)
        pieces = [version, b" ", code, b" ", reason, b"\r\n"]
        for name, values in headers.getAllRawHeaders():
            for value in values:
                pieces += (name, b": ", value, b"\r\n")
        pieces.append(b"\r\n")
        self._gather(gathered, pieces)

    def write(self, data):
        gathered = self._gathered
        if gathered is None:
            self.send_held()
            return super().write(data)
        self._gather(gathered, (data,))

    def writeSequence(self, iovec):
        gathered = self._gathered
        if gathered is None:
            self.send_held()
            return super().writeSequence(iovec)
        self._gather(gathered, iovec)

    def pauseProducing(self):
        """
        The transport's buffer is full, the client not reading its answers:
        read and parse no further request until it drains. twisted.web
        stops reading only between requests, and answers the pipelined
        requests it has read all the same, so that a client sending small
        requests it never reads the answers to had them all kept in memory.
        """
        super().pauseProducing()
        self.paused = True
        self._networkProducer.pauseProducing()

    def resumeProducing(self):
        """The transport's buffer has drained: the requests read meanwhile are parsed, and reading goes on."""
        super().resumeProducing()
        if self.paused:
            self.paused = False
            if self._buffer:
                self.dataReceived(b"")

    def registerProducer(self, producer, streaming):
        self._send_gathered()
        super().registerProducer(producer, streaming)

    def requestDone(self, request):
        """
        Hold the finished response for the outbox, unless the next request
        is already waiting in the buffer (it is read at once, and may be
        answered before the outbox's turn) or there is no outbox to hold it.
        (The buffer holds an empty piece after every request with a body.)
        """
        gathered = self._gathered
        if gathered and self.outbox is not None and not any(self._dataBuffer) and _plain_tcp(self.transport):
            self._gathered, self._gathered_bytes, size = None, 0, self._gathered_bytes
            if self._held is None:
                self._held, self._held_bytes = gathered, size
                self.outbox.hold(self)
            else:
                self._held += gathered
                self._held_bytes += size
                if self._held_bytes > GATHER_LIMIT:
                    self.send_held()
        else:
            self._send_gathered()
        super().requestDone(request)

    def loseConnection(self):
        self._send_gathered()
        super().loseConnection()

    def connectionLost(self, reason):
        self._gathered = self._held = None
        super().connectionLost(reason)
