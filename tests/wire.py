"""
One listener's site fed raw bytes over a StringTransport with a Clock, and
the parsing of what it writes back: for the input limits, drain and
transport tests.
"""

from __future__ import annotations

import json
from http.client import HTTPResponse
from io import BytesIO

from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure

from authsrv.config import parse_config
from authsrv.drain import Drain
from authsrv.service import site_factory, web_root

from fakes import FakeIdentity, FakeKeystore, FakeStore, no_password_hashes

BASE = "http://127.0.0.1:8080"


class Listener:
    """One listener's site over a fake store, driven by a Clock."""

    def __init__(self, limits=None, server=None, sections=None):
        """C{sections}: more of the configuration, beside C{[limits]} and C{[server]}."""
        self.clock = Clock()
        config = parse_config(
            {"server": {"public_url": BASE, **(server or {})}, "limits": limits or {}, **(sections or {})}, None
        )
        self.config = config
        root = web_root(config, self.clock, FakeStore(), FakeKeystore(), FakeIdentity(), lambda: None,
                        hash_password=no_password_hashes)
        self.drain = Drain(self.clock, config.shutdown.delay, config.shutdown.timeout)
        self.site = site_factory(root, config, self.drain, self.clock)()

    def connect(self, host="127.0.0.1", port=40000):
        address = IPv4Address("TCP", host, port)
        transport = StringTransport(peerAddress=address)
        protocol = self.site.buildProtocol(address)
        protocol.makeConnection(transport)
        return protocol, transport

    def send(self, data: bytes, host="127.0.0.1"):
        protocol, transport = self.connect(host)
        protocol.dataReceived(data)
        return protocol, transport

    def close(self, protocol, transport):
        protocol.connectionLost(Failure(ConnectionDone()))

    def assert_serves(self):
        """The site still answers a new connection."""
        protocol, transport = self.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = parse(transport)
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        self.close(protocol, transport)


def parse(transport) -> tuple[int, dict, bytes]:
    """The first complete response written to C{transport}."""

    class Sock:
        def makefile(self, mode):
            return BytesIO(transport.value())

    response = HTTPResponse(Sock())
    response.begin()
    body = response.read()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, body


def request_head(method: str, target: str, headers: dict | None = None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
