"""
PROXY protocol listeners (C{haproxy:}) that drop a connection whose version
1 header does not carry two addresses and two ports, as the protocol's
specification (HAProxy's proxy-protocol.txt, section 2.1) asks of a
receiver: "If any of the fields is invalid or missing, the connection must
be dropped".

Twisted's parser took any bytes but a space as an address, so a proxy that
is misconfigured or compromised could make any text (control characters
too) the client's address in the access and audit logs and the rate-limit
keys; a port that is no number, or an address that is no UTF-8, raised out
of the reactor as an unhandled error.

A header must arrive within the listener's C{[limits] header_timeout}, as
an HTTP request's headers must: a header that stalls (a version 2 one
announcing 65,535 bytes, a version 1 line never ended) held its
connection until the idle timeout.
"""

from __future__ import annotations

import ipaddress

from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.interfaces import IStreamServerEndpoint
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.protocols.haproxy._wrapper import HAProxyProtocolWrapper, HAProxyWrappingFactory
from twisted.protocols.haproxy._exceptions import InvalidProxyHeader
from twisted.protocols.haproxy._info import ProxyInfo
from twisted.protocols.haproxy._v1parser import V1Parser
from zope.interface import implementer

from authsrv.web.quiet import QuietWarnings

log = Logger()

_ADDRESSES = {b"TCP4": ipaddress.IPv4Address, b"TCP6": ipaddress.IPv6Address}


def _is_port(value: bytes) -> bool:
    return value.isdigit() and len(value) <= 5 and int(value) <= 65535


def header_problem(line: bytes) -> str | None:
    """
    What is wrong with a PROXY protocol version 1 header C{line} (without
    its CRLF), or None: after C{PROXY} and C{TCP4} or C{TCP6}, a source and
    a destination address of that family, as the specification writes
    them (no zone, no leading zeros), then two ports, 0 to 65535, each
    field after exactly one space. C{PROXY UNKNOWN} and anything after it
    is valid: the connection keeps the proxy's own address.
    """
    fields = line.split(b" ")
    if fields[:2] == [b"PROXY", b"UNKNOWN"]:
        return None
    family = _ADDRESSES.get(fields[1]) if len(fields) > 1 and fields[0] == b"PROXY" else None
    if family is None:
        return "it does not begin with PROXY TCP4, PROXY TCP6 or PROXY UNKNOWN"
    if len(fields) != 6:
        return "it does not carry exactly two addresses and two ports, each after one space"
    for address in fields[2:4]:
        try:
            family(address.decode("ascii"))
        except ValueError:
            return f"an address is not a {fields[1].decode()} address"
        if b"%" in address:
            return "an address carries a zone"
    if not (_is_port(fields[4]) and _is_port(fields[5])):
        return "a port is not a number from 0 to 65535"
    return None


class _CheckedV1Parser(V1Parser):
    """
    Twisted's version 1 parser, refusing a header L{header_problem} finds
    fault with; it keeps that fault. It takes a bare C{PROXY UNKNOWN}, the
    header a proxy sends for a connection of its own (a health check),
    which Twisted's parser dropped for lack of the fields that may follow.
    """

    problem: str | None = None

    def parse(self, line: bytes):  # type: ignore[override]  # a classmethod in Twisted; an instance keeps its problem
        self.problem = header_problem(line)
        if self.problem is not None:
            raise InvalidProxyHeader()
        if line.split(b" ", 2)[1] == b"UNKNOWN":
            return ProxyInfo(line, None, None)
        return V1Parser.parse(line)


class CheckedProxyWrapper(HAProxyProtocolWrapper):
    """
    Twisted's PROXY protocol wrapper with a L{_CheckedV1Parser}, which logs
    the connections it drops: Twisted's dropped one without a header (the
    proxy not told to send one), or with a header it could not read, without
    a word. Anyone who reaches the listener can make drops, so at most one
    line a minute is logged (L{QuietWarnings}), counting those held back.
    A header not read within the factory's C{header_timeout} is dropped
    too. Once the header is read, the connection's reads
    go straight to the wrapped protocol, with no step of this wrapper (nor
    of Twisted's) per read.
    """

    _deadline = None

    def makeConnection(self, transport) -> None:
        if self.factory.header_timeout is not None:
            self._deadline = self.factory.clock.callLater(self.factory.header_timeout, self._too_slow)
        super().makeConnection(transport)

    def dataReceived(self, data: bytes) -> None:
        if self.disconnecting:
            return
        if self._parser is None and len(data) >= 8 and data[:5] == V1Parser.PROXYSTR:
            self._parser = _CheckedV1Parser()
        super().dataReceived(data)
        if self._proxyInfo is not None:
            self._stop_deadline()
            self.dataReceived = self.wrappedProtocol.dataReceived  # type: ignore[method-assign]
            return
        if self.disconnecting:
            self._stop_deadline()
            self._log_drop(_drop_reason(self._parser))

    def connectionLost(self, reason):
        self._stop_deadline()
        super().connectionLost(reason)

    def _too_slow(self) -> None:
        self._deadline = None
        self.loseConnection()
        self._log_drop(f"it did not arrive within {self.factory.header_timeout} seconds ([limits] header_timeout)")

    def _stop_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _log_drop(self, problem: str) -> None:
        held = self.factory.quiet.due("dropped")
        if held is not None:
            log.warn("PROXY protocol header from {proxy} dropped: {problem}; check the proxy's configuration"
                     " ({held} more dropped since the last such line)",
                     proxy=getattr(self.getPeer(), "host", None), problem=problem, held=held)

    def getPeer(self):
        """
        The client's address the header names, or the proxy's own when it
        names none that is an IP address: C{UNKNOWN}, a version 2 C{LOCAL}
        or C{UNSPEC}, or a Unix socket's path (a connection the proxy took
        on a Unix socket), which is no client's address, and would make
        every client the proxy took there one in the logs and the rate-limit
        keys.
        """
        return self._address("source") or self.transport.getPeer()

    def getHost(self):
        """
        The address the client reached, as the header names it, or this
        listener's own when it names none that is an IP address (L{getPeer}):
        a request without a Host header is named by it (twisted.web's
        C{getRequestHostname}), and a Unix socket's path, which has no
        host, made such a request (HAProxy's default health check) a 500.
        """
        return self._address("destination") or self.transport.getHost()

    def _address(self, which: str) -> IPv4Address | IPv6Address | None:
        address = getattr(self._proxyInfo, which, None)
        return address if isinstance(address, (IPv4Address, IPv6Address)) else None


def _drop_reason(parser) -> str:
    """Why the wrapper dropped a connection whose header C{parser} (None before any) was reading."""
    if parser is None:
        return "the connection does not begin with a PROXY protocol header (version 1 or 2) of at least 8 bytes"
    return getattr(parser, "problem", None) or "it is not a well-formed PROXY protocol header"


def _header_timeout(factory) -> int | None:
    """
    The C{[limits] header_timeout} of the site C{factory}; None for a
    factory that only binds the port (the parent of workers), which never
    takes a connection.
    """
    limits = getattr(factory, "limits", None)
    return None if limits is None else limits.header_timeout


class CheckedProxyFactory(HAProxyWrappingFactory):
    """
    Wraps a listener's connections in L{CheckedProxyWrapper}s, whose drops
    it logs quietly; C{clock} says the time and times each header, which
    must arrive within C{header_timeout} seconds (None: not timed).
    """

    protocol = CheckedProxyWrapper  # type: ignore[assignment]  # Twisted types it as its own wrapper class

    def __init__(self, wrappedFactory, clock, header_timeout: int | None):
        super().__init__(wrappedFactory)
        self.clock = clock
        self.header_timeout = header_timeout
        self.quiet = QuietWarnings(log, clock)


@implementer(IStreamServerEndpoint)
class CheckedProxyEndpoint:
    """
    A listening endpoint whose connections begin with a PROXY protocol
    header, checked (L{CheckedProxyWrapper}); C{clock} (the reactor) times
    the lines logged of dropped connections.
    """

    def __init__(self, wrapped, clock):
        self._wrapped = wrapped
        self._clock = clock

    def listen(self, factory):
        return self._wrapped.listen(CheckedProxyFactory(factory, self._clock, _header_timeout(factory)))


class ProxyBeforeTLS:
    """
    Stands in for the reactor where the C{ssl:} endpoint of a
    C{haproxy:ssl:} listener listens: a proxy sends the PROXY header in the
    clear, ahead of the client's TLS handshake, so each connection is read
    as the header, then TLS, then HTTP. Twisted's own wrapping looks for the
    header inside TLS, where no proxy puts it, and every handshake failed
    without a word. Everything else goes to the reactor.
    """

    def __init__(self, reactor):
        self._reactor = reactor

    def __getattr__(self, name):
        return getattr(self._reactor, name)

    def listenSSL(self, port, factory, contextFactory, backlog=50, interface=""):
        tls = TLSMemoryBIOFactory(contextFactory, False, factory)
        proxied = CheckedProxyFactory(tls, self._reactor, _header_timeout(factory))
        return self._reactor.listenTCP(port, proxied, backlog, interface)
