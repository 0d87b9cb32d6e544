"""
The guarded fetcher of documents that clients name by URL, against a real
HTTP server on 127.0.0.1: private addresses and plain http refused unless
allowed, every resolved address checked and the connection pinned to the
checked one, no redirects, a size cap, a timeout, a cache held between a
floor and a ceiling.
"""

from __future__ import annotations

import json
import threading
import tracemalloc
import zlib
from functools import cache

import pytest
import pytest_twisted
from attrs import evolve
from twisted.internet import reactor
from twisted.internet.defer import Deferred, succeed
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.python.threadpool import ThreadPool
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from hanging_lookups import Hanging, drained, one_thread

from authsrv.config import parse_config
from authsrv.hostlookup import HostLookups, host_addresses
from authsrv.configsection import ConfigError
from authsrv.protocol.targets import private_address_problem
from authsrv.remote_documents import (
    Busy,
    DocumentTooLarge,
    FetchFailed,
    FetchPolicy,
    InvalidDocument,
    RefusedURL,
    RemoteDocuments,
    cache_seconds,
    url_problem,
)

JWKS = {"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "one"}]}
LOCAL = FetchPolicy(allow_private_addresses=True, allow_http=True, max_bytes=4096)


def gzipped(*parts: bytes, repeat: int = 1) -> bytes:
    """C{parts} as one gzip member, the middle one C{repeat} times, without holding the whole text at once."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    head, *middle, tail = parts if len(parts) > 1 else (b"", *parts, b"")
    packed = [packer.compress(head)]
    for _ in range(repeat):
        packed += [packer.compress(part) for part in middle]
    return b"".join([*packed, packer.compress(tail), packer.flush()])


@cache
def bomb() -> bytes:
    """About 60 KB that unpack to 64 MB: a network read of it unpacked whole takes megabytes."""
    return gzipped(b'{"pad": "', b" " * 1024 * 1024, b'"}', repeat=64)


class Documents(Resource):
    """Serves documents by path and counts the requests (and Host headers) it gets."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.requests: list[tuple[str, str]] = []
        self.pending: list = []
        self.cache_control = "max-age=600"

    def _hold(self, request) -> None:
        """Keeps C{request} unanswered in C{pending} while its connection is open."""
        self.pending.append(request)
        request.notifyFinish().addErrback(lambda _: self.pending.remove(request))

    def render_GET(self, request):
        path = request.path.decode()
        self.requests.append((path, request.getHeader("host")))
        if path == "/slow":
            self._hold(request)
            return NOT_DONE_YET
        if path == "/drip":
            request.setHeader("content-type", "application/json")
            request.write(b'{"keys": [')
            self._hold(request)
            return NOT_DONE_YET
        if path == "/redirect":
            request.redirect(b"/jwks")
            return b""
        if path == "/missing":
            request.setResponseCode(404)
            return b"{}"
        request.setHeader("content-type", "application/json")
        request.setHeader("cache-control", self.cache_control)
        if path == "/big":
            return b'{"pad": "' + b"x" * 10_000 + b'"}'
        if path == "/chunked-big":
            request.write(b'{"pad": "' + b"x" * 3000)
            request.write(b"x" * 3000 + b'"}')
            request.finish()
            return NOT_DONE_YET
        if path == "/empties":
            return b'{"a": [' + b",".join([b"{}"] * 1000) + b"]}"
        if path in ("/brotli", "/controls"):
            request.setHeader("content-encoding", "br" if path == "/brotli" else "br\x1b]0;owned\x07\x1b[2J")
            return b"\x00"
        if path in ("/gzip", "/bomb", "/broken-gzip"):
            request.setHeader("content-encoding", "gzip")
            if path == "/bomb":
                return bomb()
            packed = gzipped(json.dumps(JWKS).encode())
            return packed if path == "/gzip" else packed[:-12] + b"x" * 12
        if path == "/list":
            return b"[1, 2]"
        if path == "/text":
            return b"<html>"
        return json.dumps(JWKS).encode()


class EndlessHeaders(Protocol):
    """
    Answers 200 and then sends header lines as fast as the connection takes
    them, 16 MB of them (as good as endless, and cheap to run against code
    that keeps them all), and then nothing, keeping the connection open.
    """

    def connectionMade(self):
        self.transport.write(b"HTTP/1.1 200 OK\r\n")
        self.left = 2000
        self.transport.registerProducer(self, False)

    def resumeProducing(self):
        self.left -= 1
        if self.left:
            self.transport.write(b"X-Pad: " + b"a" * 8000 + b"\r\n")

    def pauseProducing(self):
        pass

    def stopProducing(self):
        pass


@pytest.fixture
def endless_headers():
    """The URL of a server whose answer's headers never end."""
    port = reactor.listenTCP(0, Factory.forProtocol(EndlessHeaders), interface="127.0.0.1")
    yield f"http://127.0.0.1:{port.getHost().port}/jwks"
    port.stopListening()


@pytest.fixture
def server():
    documents = Documents()
    port = reactor.listenTCP(0, Site(documents), interface="127.0.0.1")
    documents.base = f"http://127.0.0.1:{port.getHost().port}"
    yield documents
    for request in documents.pending:
        request.finish()
    port.stopListening()


def fetcher(policy=LOCAL, clock=None, resolve=None) -> RemoteDocuments:
    return RemoteDocuments(reactor, policy, clock=clock or Clock(), resolve=resolve)


@pytest_twisted.ensureDeferred
async def test_fetches_a_json_object_and_caches_it_for_its_max_age(server):
    clock = Clock()
    documents = fetcher(clock=clock)
    assert await documents.fetch(server.base + "/jwks") == JWKS
    clock.advance(599)
    assert await documents.fetch(server.base + "/jwks") == JWKS
    assert len(server.requests) == 1
    clock.advance(1)
    await documents.fetch(server.base + "/jwks")
    assert len(server.requests) == 2


@pytest_twisted.ensureDeferred
async def test_the_cache_holds_its_memory_budget_letting_the_oldest_go(server):
    """3 KB of empty objects take 70 KB parsed: a cap on entries alone let anyone who names URLs fill the memory."""
    documents = fetcher(FetchPolicy(allow_private_addresses=True, allow_http=True, cache_bytes=256 * 1024))
    urls = [f"{server.base}/empties?n={n}" for n in range(10)]
    for url in urls:
        await documents.fetch(url)
    assert 0 < documents.cached_bytes <= 256 * 1024
    await documents.fetch(urls[-1])
    assert len(server.requests) == 10
    await documents.fetch(urls[0])
    assert len(server.requests) == 11


@pytest_twisted.ensureDeferred
async def test_a_refetch_is_allowed_only_after_the_refetch_interval(server):
    clock = Clock()
    documents = fetcher(clock=clock)
    await documents.fetch(server.base + "/jwks")
    await documents.fetch(server.base + "/jwks", refetch=True)
    assert len(server.requests) == 1
    clock.advance(LOCAL.refetch_after)
    await documents.fetch(server.base + "/jwks", refetch=True)
    assert len(server.requests) == 2


def test_max_age_is_held_between_the_floor_and_the_ceiling():
    policy = FetchPolicy(cache_min=60, cache_max=3600)
    assert cache_seconds("max-age=0", policy) == 60
    assert cache_seconds("public, max-age=99999999", policy) == 3600
    assert cache_seconds("max-age=120", policy) == 120
    assert cache_seconds("no-store", policy) == 60
    assert cache_seconds(None, policy) == 60
    assert cache_seconds("max-age=junk", policy) == 60


@pytest_twisted.ensureDeferred
async def test_loopback_and_plain_http_are_refused_by_default_without_a_request(server):
    with pytest.raises(RefusedURL, match="must use https"):
        await fetcher(FetchPolicy()).fetch(server.base + "/jwks")
    with pytest.raises(RefusedURL, match="loopback"):
        await fetcher(FetchPolicy(allow_http=True)).fetch(server.base + "/jwks")
    assert server.requests == []


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.0.1", "100.64.0.1", "::1",
                                     "fd12::1", "::ffff:10.0.0.1", "169.254.169.254", "fe80::1", "0.0.0.0",
                                     "fec0::1"])
def test_private_addresses_are_refused(address):
    assert private_address_problem(address)
    host = f"[{address}]" if ":" in address else address
    assert "is refused" in url_problem(f"https://{host}/jwks", FetchPolicy())


@pytest.mark.parametrize("address, kind", [("64:ff9b::7f00:1", "loopback"), ("64:ff9b::a00:1", "private"),
                                           ("64:ff9b::a9fe:a9fe", "metadata"), ("::7f00:1", "reserved"),
                                           ("64:ff9b:1::a00:1", "reserved")])
def test_ipv4_behind_nat64_and_reserved_ipv6_are_refused(address, kind):
    """A NAT64 translator carries 64:ff9b::a00:1 to 10.0.0.1; Python 3.11 calls ::/8 global."""
    assert kind in private_address_problem(address)


def test_public_addresses_and_names_pass_the_address_check():
    assert private_address_problem("93.184.216.34") is None
    assert private_address_problem("64:ff9b::5db8:d822") is None
    assert private_address_problem("2606:2800:220:1:248:1893:25c8:1946") is None
    assert url_problem("https://rp.example/jwks", FetchPolicy()) is None
    assert "user name" in url_problem("https://a:b@rp.example/jwks", FetchPolicy())
    assert "fragment" in url_problem("https://rp.example/jwks#x", FetchPolicy())


def test_link_local_and_metadata_stay_refused_even_when_private_addresses_are_allowed():
    assert "metadata" in url_problem("http://169.254.169.254/latest", LOCAL)
    assert "link-local" in url_problem("http://[fe80::1]/x", LOCAL)


@pytest_twisted.ensureDeferred
async def test_a_name_is_refused_when_any_of_its_addresses_is_private(server):
    resolved = []

    def resolve(host):
        resolved.append(host)
        return succeed(["93.184.216.34", "10.0.0.7"])

    with pytest.raises(RefusedURL, match="rp.example resolves to 10.0.0.7 is a private"):
        await fetcher(FetchPolicy(), resolve=resolve).fetch("https://rp.example/jwks")
    assert resolved == ["rp.example"]


@pytest_twisted.ensureDeferred
async def test_the_connection_goes_to_the_checked_address_and_sends_the_name(server):
    """A name that would resolve elsewhere a moment later (DNS rebinding) changes nothing: it is resolved once."""
    port = server.base.rsplit(":", 1)[1]
    answers = [["127.0.0.1"], ["169.254.169.254"]]
    documents = fetcher(resolve=lambda host: succeed(answers.pop(0)))
    assert await documents.fetch(f"http://docs.example:{port}/jwks") == JWKS
    assert server.requests == [("/jwks", f"docs.example:{port}")]
    assert answers == [["169.254.169.254"]]


@pytest.fixture
def reactor_pool_held():
    """Every thread of the reactor's pool held, as by lookups of names whose servers never answer."""
    release = threading.Event()
    for _ in range(reactor.getThreadPool().max):
        reactor.callInThread(release.wait)
    yield
    release.set()


@pytest_twisted.ensureDeferred
async def test_names_are_looked_up_on_a_pool_of_their_own(server, reactor_pool_held):
    """
    A name whose servers never answer holds a thread past the fetch's
    timeout: on the reactor's pool, ten of them held every lookup the server
    makes (relying parties, the chat platform) and this fetch timed out.
    """
    if host_addresses("localhost")[:1] != ["127.0.0.1"]:
        pytest.skip("localhost is not 127.0.0.1 first here")
    lookups = ThreadPool(minthreads=0, maxthreads=1, name="test-lookups")
    lookups.start()
    try:
        documents = RemoteDocuments(reactor, LOCAL, clock=Clock(), resolve=HostLookups(reactor, lookups, 1))
        port = server.base.rsplit(":", 1)[1]
        fetching = Deferred.fromCoroutine(documents.fetch(f"http://localhost:{port}/jwks"))
        assert await fetching.addTimeout(LOCAL.timeout, reactor) == JWKS
    finally:
        lookups.stop()


@pytest_twisted.ensureDeferred
async def test_lookups_of_fetches_that_timed_out_are_skipped_and_those_waiting_are_capped(server):
    """
    While a name's servers hang, each fetch times out and frees its place,
    but its lookup stayed queued, without end: after the outage the pool ran
    every stale lookup before a fresh one. Now a timed-out fetch's lookup
    never runs, and a fetch beyond the lookups allowed to wait is L{Busy}.
    """
    hanging = Hanging("127.0.0.1")
    port = server.base.rsplit(":", 1)[1]
    clock = Clock()
    with one_thread(hanging) as lookups:
        documents = fetcher(evolve(LOCAL, fetches_in_flight=1), clock, HostLookups(reactor, lookups, 1, hanging))
        first = Deferred.fromCoroutine(documents.fetch(f"http://first.example:{port}/jwks"))
        assert hanging.started.wait(10)
        clock.advance(LOCAL.timeout)
        stale = Deferred.fromCoroutine(documents.fetch(f"http://stale.example:{port}/jwks"))
        clock.advance(LOCAL.timeout)
        for fetch in (first, stale):
            with pytest.raises(FetchFailed, match="no answer within"):
                await fetch
        with pytest.raises(Busy, match="refused.example is not looked up: host name lookups waiting for a thread: 1,"):
            await documents.fetch(f"http://refused.example:{port}/jwks")
        hanging.release.set()
        await drained(lookups)
        assert await documents.fetch(f"http://fresh.example:{port}/jwks") == JWKS
        assert hanging.looked == ["first.example", "fresh.example"]


@pytest_twisted.ensureDeferred
async def test_a_name_resolving_to_nothing_fails(server):
    with pytest.raises(FetchFailed, match="resolves to no address"):
        await fetcher(resolve=lambda host: succeed([])).fetch("https://rp.example/jwks")


@pytest_twisted.ensureDeferred
async def test_redirects_are_not_followed(server):
    with pytest.raises(FetchFailed, match="HTTP 302"):
        await fetcher().fetch(server.base + "/redirect")
    assert [path for path, _ in server.requests] == ["/redirect"]


@pytest_twisted.ensureDeferred
async def test_an_error_status_fails(server):
    with pytest.raises(FetchFailed, match="HTTP 404"):
        await fetcher().fetch(server.base + "/missing")


@pytest_twisted.ensureDeferred
async def test_a_body_over_the_cap_is_refused(server):
    with pytest.raises(DocumentTooLarge, match="more than the 4096"):
        await fetcher().fetch(server.base + "/big")
    with pytest.raises(DocumentTooLarge, match="more than the 4096"):
        await fetcher().fetch(server.base + "/chunked-big")


@pytest_twisted.ensureDeferred
async def test_a_gzipped_answer_is_read_and_its_unpacked_size_capped_as_it_unpacks(server):
    """
    A compression bomb: the HTTP client unpacked each network read whole
    before the cap was looked at, so a 64 KB read took 64 MB for a
    document capped at 64 KB, once for each fetch in flight.
    """
    assert await fetcher().fetch(server.base + "/gzip") == JWKS
    tracemalloc.start()
    try:
        with pytest.raises(DocumentTooLarge, match="more than the 4096 bytes allowed"):
            await fetcher().fetch(server.base + "/bomb")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024


@pytest_twisted.ensureDeferred
async def test_headers_without_end_are_cut_off_at_the_cap(endless_headers):
    """
    The cap held the body only: headers sent without end were all kept
    until the timeout, gigabytes on a fast link (3 GB in 5 s on loopback).
    """
    with pytest.raises(DocumentTooLarge, match="sends more than the 69632 bytes allowed for an answer"):
        await fetcher(clock=reactor).fetch(endless_headers)


@pytest_twisted.ensureDeferred
async def test_a_broken_gzip_answer_or_another_encoding_is_no_document(server):
    with pytest.raises(InvalidDocument, match="cannot be read: its gzip encoding is broken"):
        await fetcher().fetch(server.base + "/broken-gzip")
    with pytest.raises(InvalidDocument, match="is sent with Content-Encoding br; only gzip is read"):
        await fetcher().fetch(server.base + "/brotli")


@pytest_twisted.ensureDeferred
async def test_a_content_encoding_that_names_no_coding_is_not_repeated_into_the_log(server):
    """
    The document's site chose the bytes of its Content-Encoding, which the
    refusal (logged as the reason a client's document is refused) repeated:
    a terminal's escape sequences and BEL, into the operator's log.
    """
    with pytest.raises(InvalidDocument) as refused:
        await fetcher().fetch(server.base + "/controls")
    assert "a Content-Encoding no coding names" in str(refused.value)
    assert str(refused.value).isprintable() and "owned" not in str(refused.value)


@pytest_twisted.ensureDeferred
async def test_only_a_json_object_is_a_document(server):
    with pytest.raises(InvalidDocument, match="not a JSON object"):
        await fetcher().fetch(server.base + "/list")
    with pytest.raises(InvalidDocument, match="cannot be read: it is not valid JSON"):
        await fetcher().fetch(server.base + "/text")


@pytest_twisted.ensureDeferred
async def test_a_server_that_does_not_answer_times_out(server):
    clock = Clock()
    documents = fetcher(clock=clock)
    fetching = Deferred.fromCoroutine(documents.fetch(server.base + "/slow"))
    while not server.pending:
        await deferred_later()
    clock.advance(LOCAL.timeout)
    with pytest.raises(FetchFailed, match=f"no answer within {LOCAL.timeout} s"):
        await fetching


@pytest_twisted.ensureDeferred
async def test_a_server_dripping_its_answer_loses_the_connection_at_the_timeout(server):
    """Otherwise every URL that drips a byte now and then holds a socket for hours after its fetch failed."""
    clock = Clock()
    fetching = Deferred.fromCoroutine(fetcher(clock=clock).fetch(server.base + "/drip"))
    while not server.pending:
        await deferred_later()
    lost: list = []
    server.pending[0].notifyFinish().addErrback(lost.append)
    clock.advance(LOCAL.timeout)
    with pytest.raises(FetchFailed, match="no answer within"):
        await fetching
    for _ in range(100):
        if lost:
            break
        await deferred_later()
    assert lost, "the connection is still open"


@pytest_twisted.ensureDeferred
async def test_fetches_beyond_the_limit_in_flight_are_refused_at_once(server):
    """Each fetch holds a connection and a resolver thread: anyone naming URLs must not have them all."""
    clock = Clock()
    documents = fetcher(FetchPolicy(allow_private_addresses=True, allow_http=True, fetches_in_flight=2), clock)
    slow = [Deferred.fromCoroutine(documents.fetch(f"{server.base}/slow?n={n}")) for n in range(2)]
    with pytest.raises(Busy, match="2 other documents are being fetched; try again"):
        await documents.fetch(server.base + "/jwks")
    while len(server.pending) < 2:
        await deferred_later()
    assert [path for path, _ in server.requests] == ["/slow", "/slow"]
    clock.advance(LOCAL.timeout)
    for fetching in slow:
        with pytest.raises(FetchFailed):
            await fetching
    assert await documents.fetch(server.base + "/jwks") == JWKS


@pytest_twisted.ensureDeferred
async def test_one_host_naming_urls_that_hang_cannot_take_every_fetch_in_flight(server):
    """
    Anyone may name URLs (a client ID metadata document, a jwks_uri in
    one): a party naming many that hang held every one of the 16 fetches
    in flight, and every other client's fetch was refused as busy until
    they timed out. One host holds at most its share (4 by default); the
    others are fetched beside it.
    """
    clock = Clock()
    policy = FetchPolicy(allow_private_addresses=True, allow_http=True)
    documents = fetcher(policy, clock, resolve=lambda host: succeed(["127.0.0.1"]))
    port = server.base.rsplit(":", 1)[1]
    hanging = []
    for n in range(4):
        hanging.append(Deferred.fromCoroutine(documents.fetch(f"http://hang.example:{port}/slow?n={n}")))
    for n in range(4, 16):
        refused = Deferred.fromCoroutine(documents.fetch(f"http://HANG.example.:{port}/slow?n={n}"))
        assert refused.called, "refused at once, not fetched"
        with pytest.raises(Busy, match="4 other documents of hang.example are being fetched; try again"):
            await refused
    while len(server.pending) < 4:
        await deferred_later()
    assert await documents.fetch(f"http://good.example:{port}/jwks") == JWKS
    assert [path for path, _ in server.requests].count("/slow") == 4
    clock.advance(policy.timeout)
    for fetching in hanging:
        with pytest.raises(FetchFailed):
            await fetching
    assert await documents.fetch(f"http://hang.example:{port}/jwks") == JWKS


@pytest_twisted.ensureDeferred
async def test_concurrent_fetches_of_one_url_share_one_request(server):
    documents = fetcher()
    first = Deferred.fromCoroutine(documents.fetch(server.base + "/jwks"))
    second = Deferred.fromCoroutine(documents.fetch(server.base + "/jwks"))
    assert await first == await second == JWKS
    assert len(server.requests) == 1


def deferred_later() -> Deferred:
    from twisted.internet.task import deferLater

    return deferLater(reactor, 0.01)


def test_the_config_section_is_checked():
    policy = parse_config({"remote_documents": {"timeout": "2s", "allow_http": True}}, None).remote_documents
    assert (policy.timeout, policy.allow_http, policy.allow_private_addresses) == (2, True, False)
    with pytest.raises(ConfigError, match="remote_documents.cache_max: must not be shorter than cache_min"):
        parse_config({"remote_documents": {"cache_min": "1h", "cache_max": "1m"}}, None)
    with pytest.raises(ConfigError, match="remote_documents.timeout: must be longer than zero"):
        parse_config({"remote_documents": {"timeout": 0}}, None)
    assert parse_config({}, None).remote_documents.cache_bytes == 16 * 1024 * 1024
    with pytest.raises(ConfigError, match="remote_documents.fetches_in_flight"):
        parse_config({"remote_documents": {"fetches_in_flight": 0}}, None)
    with pytest.raises(ConfigError, match="remote_documents.fetches_per_host"):
        parse_config({"remote_documents": {"fetches_per_host": 0}}, None)
    assert parse_config({"remote_documents": {"fetches_per_host": 2}}, None).remote_documents.fetches_per_host == 2
    with pytest.raises(ConfigError, match="remote_documents.cache_bytes"):
        parse_config({"remote_documents": {"cache_bytes": 1000}}, None)
