"""
/healthz and /readyz as a load balancer reads them: ready, degraded while
one identity backend of several is down, and unavailable while starting or
while the store or the keystore fails or hangs; degraded while identity backends do.
"""

from __future__ import annotations

import pytest
from treq.testing import StubTreq
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock

from authsrv.config import parse_config
from authsrv.flows.readiness import PROBE_SUB, TIMEOUT
from authsrv.identity.chain import IdentityChain
from authsrv.identity.errors import BackendUnavailable
from authsrv.service import web_root

from fakes import FakeKeystore, FakeStore, no_password_hashes

BASE = "https://auth.example.com"


class Backend:
    """An identity backend that only answers user lookups, as C{answer()} says."""

    def __init__(self):
        self.answer = lambda: succeed(None)
        self.asked: list[str] = []

    def user_by_id(self, sub):
        self.asked.append(sub)
        return self.answer()


class Keystore(FakeKeystore):
    def __init__(self):
        super().__init__()
        self.answer = lambda: succeed(False)

    def reload(self):
        return self.answer()


@pytest.fixture
def server():
    class Server:
        clock = Clock()
        store = FakeStore()
        keystore = Keystore()
        ldap = Backend()
        static = Backend()
        problem = None

    server = Server()
    identity = IdentityChain([server.ldap, server.static], ["ldap", "static"])
    config = parse_config({"server": {"public_url": BASE}}, None)
    root = web_root(config, server.clock, server.store, server.keystore, identity, lambda: server.problem,
                    hash_password=no_password_hashes)
    server.http = StubTreq(root)
    return server


def readyz(server, advance: float = 0.0, path: str = "/readyz"):
    """(status, JSON body) of C{path}, the clock moved by C{advance} while it runs."""
    d = server.http.get(BASE + path)
    server.clock.advance(advance)
    server.http.flush()
    results: list = []
    d.addCallback(lambda response: response.json().addCallback(lambda body: (response.code, body)))
    d.addBoth(results.append)
    server.http.flush()
    assert results, "the request did not finish"
    return results[0]


def down():
    return fail(BackendUnavailable("directory down"))


def test_liveness_checks_nothing_else(server):
    server.store.answer = down
    server.keystore.answer = down
    assert readyz(server, path="/healthz") == (200, {"status": "ok"})


def test_ready_when_every_part_answers(server):
    assert readyz(server) == (200, {"status": "ready"})
    assert server.ldap.asked == [PROBE_SUB] and server.static.asked == [PROBE_SUB]


def test_degraded_while_one_identity_backend_is_down(server):
    server.ldap.answer = down
    assert readyz(server) == (200, {"status": "degraded", "unreachable": ["identity:ldap"]})


def test_only_degraded_while_every_identity_backend_is_down(server):
    """A directory is shared by every instance: its outage must not take them all out of rotation."""
    server.ldap.answer = down
    server.static.answer = down
    assert readyz(server) == (200, {"status": "degraded", "unreachable": ["identity:ldap", "identity:static"]})


def test_unavailable_while_the_keystore_fails(server):
    server.keystore.answer = lambda: fail(OSError("disk gone"))
    assert readyz(server) == (503, {
        "status": "unavailable", "reason": "keystore unreachable", "unreachable": ["keystore"],
    })


def test_unavailable_while_the_store_fails_and_an_identity_backend_too(server):
    server.store.answer = lambda: fail(ConnectionError("down"))
    server.static.answer = down
    assert readyz(server) == (503, {
        "status": "unavailable", "reason": "store unreachable", "unreachable": ["store", "identity:static"],
    })


def test_a_hanging_part_counts_as_down_after_the_timeout(server):
    server.keystore.answer = Deferred
    server.ldap.answer = Deferred
    assert readyz(server, advance=TIMEOUT) == (503, {
        "status": "unavailable", "reason": "keystore unreachable", "unreachable": ["keystore", "identity:ldap"],
    })


def test_unavailable_while_starting_without_asking_anyone(server):
    server.problem = "starting"
    assert readyz(server) == (503, {"status": "unavailable", "reason": "starting"})
    assert server.ldap.asked == []
