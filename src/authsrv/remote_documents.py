"""
JSON documents the server fetches from URLs that clients name (a client's
C{jwks_uri}, a client ID metadata document): anyone who can register a
client chooses the URL, so every fetch is guarded against server-side
request forgery and against answers that cost the server too much.

 - https only (plain http when the operator allows it, for tests and
   private deployments);
 - the host is resolved once, every address it resolves to is checked
   (no loopback, private, link-local or reserved address unless allowed),
   and the request connects to the checked address while sending the name
   as Host and checking the certificate against it, so that a name that
   resolves elsewhere a moment later (DNS rebinding) changes nothing;
 - at most C{fetches_in_flight} URLs fetched at once, a caller beyond
   that refused at once: anyone who may name URLs could otherwise have the
   server hold a connection and a resolver thread for each; and at most
   C{fetches_per_host} of them from one host, so that one party naming
   URLs that hang (its own client ID documents, say) cannot take every
   slot from the others;
 - no redirects, a timeout on the whole fetch, a cap on the body's size
   (unpacked: a gzipped answer is unpacked only as far as the cap, since a
   few kilobytes of it may unpack to gigabytes) and one on all the
   connection receives (headers without end); the connection is aborted
   at the timeout, so that a server dripping its answer, or never
   closing, holds no socket after the fetch has failed;
 - answers are cached for their C{Cache-Control: max-age}, held between a
   floor (a client cannot make the server fetch on every request) and a
   ceiling (a rotated key set is seen within a bounded time), and together
   held within a memory budget, the oldest let go first: anyone may name
   any number of URLs, and a small JSON text of empty objects takes twenty
   times its size once parsed.
"""

from __future__ import annotations

import re
import sys
import zlib
from ipaddress import ip_address
from urllib.parse import urlsplit

import treq
from attrs import frozen
from hyperlink import EncodedURL
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.client import Agent
from twisted.web.http_headers import Headers

from authsrv.configsection import Problems, Section
from authsrv.flows.backchannel import RESPONSE_BYTES, PinnedEndpoints, ReceiveLimit, resolve_host
from authsrv.hostlookup import LookupsBusy
from authsrv.protocol import jsontext
from authsrv.protocol.targets import address_problem, private_address_problem

_MAX_AGE = re.compile(r"(?:^|,)\s*max-age\s*=\s*\"?(\d+)\"?\s*(?:,|$)", re.I)
_NO_CACHE = re.compile(r"(?:^|,)\s*(no-store|no-cache)\s*(?:,|$)", re.I)
_CODINGS = re.compile(r"[-!#$%&'*+.^_`|~0-9a-z, ]{1,64}")
"""
A Content-Encoding named in the log as sent: codings' names (RFC 9110
section 8.4.1, tokens), lower-cased. The site's own bytes otherwise, a
newline or an escape sequence written into a text log or onto a terminal.
"""


class RemoteDocumentError(Exception):
    """A document could not be had; the message says why, fit for an operator or a client's developer."""


class RefusedURL(RemoteDocumentError):
    """The URL may not be fetched: not https, or its host is or resolves to a refused address."""


class FetchFailed(RemoteDocumentError):
    """The fetch went wrong on the way: no answer in time, a connection error, a status other than 200."""


class Busy(FetchFailed):
    """As many URLs as allowed are being fetched already: no fault of this one's, worth asking again."""


class DocumentTooLarge(RemoteDocumentError):
    """The answer is larger than the configured cap."""


class InvalidDocument(RemoteDocumentError):
    """The answer is not a JSON object."""


@frozen
class FetchPolicy:
    """
    C{[remote_documents]}: how the server fetches documents that clients
    name; times in seconds, sizes in bytes.
    """

    timeout: int = 5
    max_bytes: int = 64 * 1024
    cache_min: int = 300
    cache_max: int = 86400
    refetch_after: int = 30
    """An unknown key may make the server fetch a cached key set again, at most this often."""
    allow_private_addresses: bool = False
    allow_http: bool = False
    cache_bytes: int = 16 * 1024 * 1024
    """The memory the cached documents may take together, as parsed (not as fetched)."""
    fetches_in_flight: int = 16
    fetches_per_host: int = 4
    """How many of the C{fetches_in_flight} one host's URLs may hold at once."""


def fetch_policy(section: Section, checked: Problems) -> FetchPolicy:
    """C{[remote_documents]}, each mistake noted in C{checked} with its default standing in."""
    defaults = FetchPolicy()
    values = {name: checked.take(section.duration, name, getattr(defaults, name), fallback=getattr(defaults, name))
              for name in ("timeout", "cache_min", "cache_max", "refetch_after")}
    if values["timeout"] == 0:
        checked.add(section.error("timeout", "must be longer than zero"))
        values["timeout"] = defaults.timeout
    for name, low in {"max_bytes": 1024, "cache_bytes": 1024 * 1024, "fetches_in_flight": 1,
                      "fetches_per_host": 1}.items():
        values[name] = checked.take(section.int, name, getattr(defaults, name), minimum=low,
                                    fallback=getattr(defaults, name))
    for name in ("allow_private_addresses", "allow_http"):
        values[name] = checked.take(section.bool, name, getattr(defaults, name), fallback=getattr(defaults, name))
    if values["cache_max"] < values["cache_min"]:
        checked.add(section.error("cache_max", "must not be shorter than cache_min"))
        values["cache_max"] = values["cache_min"]
    checked.done(section)
    return FetchPolicy(**values)


def url_problem(url: str, policy: FetchPolicy) -> str | None:
    """
    What is wrong with C{url} as a document's address under C{policy}, or
    None; a name is checked again, by its addresses, at each fetch.
    """
    try:
        parts = urlsplit(url)
        parts.port
    except ValueError as e:
        return f"{url!r} is not a valid URL ({e})"
    if parts.scheme != "https" and not (parts.scheme == "http" and policy.allow_http):
        return f"{url!r} must use https"
    if not parts.hostname:
        return f"{url!r} has no host"
    if parts.username or parts.password:
        return f"{url!r} must not carry a user name or password"
    if parts.fragment or "#" in url:
        return f"{url!r} must not have a fragment"
    problem = _host_problem(parts.hostname, policy)
    return f"{url!r} is refused: {problem}" if problem else None


def _host_problem(address: str, policy: FetchPolicy) -> str | None:
    return address_problem(address) if policy.allow_private_addresses else private_address_problem(address)


def cache_seconds(cache_control: str | None, policy: FetchPolicy) -> int:
    """How long an answer with C{cache_control} is kept: its max-age, held between the floor and the ceiling."""
    if cache_control and _NO_CACHE.search(cache_control):
        return policy.cache_min
    match = _MAX_AGE.search(cache_control or "")
    seconds = int(match.group(1)) if match else policy.cache_min
    return max(policy.cache_min, min(policy.cache_max, seconds))


class _TooLarge(Exception):
    """Stops reading a body (treq closes the connection when its collector raises)."""


class _Body:
    """
    A body as it arrives, unpacked from gzip when it was sent so, never
    beyond one byte more than C{limit}: the rest of what arrived stays
    packed until L{_TooLarge} closes the connection.
    """

    def __init__(self, limit: int, *, gzipped: bool):
        self.data = bytearray()
        self._limit = limit
        self._unpacker = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None

    def take(self, chunk: bytes) -> None:
        if len(self.data) > self._limit:  # what arrives after the refusal, before the connection is closed
            raise _TooLarge()
        if self._unpacker is not None:
            chunk = self._unpacker.decompress(chunk, self._limit + 1 - len(self.data))
        self.data.extend(chunk)
        if len(self.data) > self._limit:
            raise _TooLarge()

    def complete(self) -> bool:
        """Whether a gzipped body came to its end rather than being cut short."""
        return self._unpacker is None or self._unpacker.eof


class RemoteDocuments:
    """
    Fetches and caches JSON objects under a L{FetchPolicy}. C{resolve(host)}
    gives a Deferred list of addresses, by the reactor's resolver by
    default; the server gives it L{authsrv.hostlookup.HostLookups} on a
    pool of the fetcher's own. A lookup outlasts the fetch's timeout when a name's servers never
    answer, which anyone naming URLs can arrange: on the reactor's pool, ten
    such lookups held every thread it has, and every other name the server
    looks up (a relying party's, the chat platform's) waited behind them;
    one refused as L{LookupsBusy} makes the fetch L{Busy}. Each fetch
    connects to the checked address whatever the URL's host
    (L{PinnedEndpoints}); C{clock} times the cache and the timeout (the
    reactor by default).
    """

    def __init__(self, reactor, policy: FetchPolicy, *, resolve=None, clock=None):
        self._reactor = reactor
        self._clock = clock or reactor
        self.policy = policy
        self._resolve = resolve or (lambda host: resolve_host(reactor, host))
        self._cache: dict[str, tuple[float, float, dict, int]] = {}
        """url -> (fetched at, expires at, document, its footprint), the oldest first"""
        self.cached_bytes = 0
        self._in_flight: dict[str, list[Deferred]] = {}
        self._per_host: dict[str, int] = {}
        """host -> how many of its URLs are being fetched"""

    async def fetch(self, url: str, *, refetch: bool = False) -> dict:
        """
        The JSON object at C{url}, from the cache while it is fresh. With
        C{refetch} (the caller found the cached one lacking, say without the
        key an assertion names), fetched again unless it was fetched within
        C{refetch_after}. Raises a L{RemoteDocumentError}.
        """
        now = self._clock.seconds()
        cached = self._cache.get(url)
        if cached is not None:
            fetched_at, expires_at, document, _ = cached
            stale = now >= expires_at or (refetch and now - fetched_at >= self.policy.refetch_after)
            if not stale:
                return document
        waiter: Deferred = Deferred()
        host = _host_of(url)
        if url in self._in_flight:
            self._in_flight[url].append(waiter)
        elif len(self._in_flight) >= self.policy.fetches_in_flight:
            raise Busy(f"{url} is not fetched: {len(self._in_flight)} other documents are being fetched; try again"
                       " in a few seconds")
        elif self._per_host.get(host, 0) >= self.policy.fetches_per_host:
            raise Busy(f"{url} is not fetched: {self._per_host[host]} other documents of {host} are being fetched;"
                       " try again in a few seconds")
        else:
            self._in_flight[url] = [waiter]
            self._per_host[host] = self._per_host.get(host, 0) + 1
            fetching = Deferred.fromCoroutine(self._fetch(url)).addTimeout(
                self.policy.timeout, self._clock, onTimeoutCancel=_timed_out)
            fetching.addBoth(self._landed, url, host)
        try:
            return await waiter
        except RemoteDocumentError:
            raise
        except Exception as e:
            raise FetchFailed(f"fetching {url} failed: {_reason(e, self.policy)}") from None

    def _landed(self, result, url: str, host: str) -> None:
        """One fetch of C{url} at a time: concurrent callers all get the same answer."""
        self._per_host[host] -= 1
        if not self._per_host[host]:
            del self._per_host[host]
        for waiter in self._in_flight.pop(url):
            waiter.errback(result) if isinstance(result, Failure) else waiter.callback(result)

    async def _fetch(self, url: str) -> dict:
        problem = url_problem(url, self.policy)
        if problem:
            raise RefusedURL(problem)
        host = urlsplit(url).hostname or ""
        address = await self._checked_address(host)
        limit = ReceiveLimit(self.policy.max_bytes + RESPONSE_BYTES)
        # Not treq: it unpacks a gzipped answer a network read at a time, whole, before anyone may count it.
        agent = Agent.usingEndpointFactory(self._reactor, PinnedEndpoints(
            self._reactor, address, lifetime=self.policy.timeout, clock=self._clock, limit=limit))
        try:
            return await self._answer(url, agent)
        except Exception:
            if limit.exceeded:
                raise DocumentTooLarge(f"{url} sends more than the {limit.most} bytes allowed for an answer"
                                       " (its headers and body)") from None
            raise

    async def _answer(self, url: str, agent: Agent) -> dict:
        """The document C{agent} fetches from C{url}, cached."""
        response = await agent.request(b"GET", EncodedURL.from_text(url).to_uri().to_text().encode("ascii"),
                                       Headers({"Accept": ["application/json"], "Accept-Encoding": ["gzip"]}))
        if response.code != 200:
            _drop(response)
            raise FetchFailed(f"{url} answered HTTP {response.code}, not 200")
        encoding = ",".join(response.headers.getRawHeaders("content-encoding", [])).strip().lower()
        if encoding not in ("", "identity", "gzip", "x-gzip"):
            _drop(response)
            named = (f"Content-Encoding {encoding}" if _CODINGS.fullmatch(encoding)
                     else "a Content-Encoding no coding names")
            raise InvalidDocument(f"{url} is sent with {named}; only gzip is read")
        gzipped = encoding.endswith("gzip")
        length = response.length
        if not gzipped and isinstance(length, int) and length > self.policy.max_bytes:
            _drop(response)
            raise DocumentTooLarge(f"{url} is {length} bytes, more than the {self.policy.max_bytes} allowed")
        body = _Body(self.policy.max_bytes, gzipped=gzipped)
        try:
            await treq.collect(response, body.take)
        except _TooLarge:
            raise DocumentTooLarge(f"{url} is more than the {self.policy.max_bytes} bytes allowed") from None
        except zlib.error:
            raise InvalidDocument(f"{url} cannot be read: its gzip encoding is broken") from None
        if not body.complete():
            raise InvalidDocument(f"{url} cannot be read: its gzip encoding is broken (cut short)")
        try:
            document = jsontext.loads(body.data)
        except ValueError as e:
            raise InvalidDocument(f"{url} cannot be read: {e}") from None
        if not isinstance(document, dict):
            raise InvalidDocument(f"{url} is not a JSON object")
        cache_control = ",".join(filter(None, response.headers.getRawHeaders("cache-control", []))) or None
        self._keep(url, document, cache_seconds(cache_control, self.policy))
        return document

    def _keep(self, url: str, document: dict, seconds: int) -> None:
        """Caches C{document}, letting the oldest go until the budget holds it (or nothing else is left)."""
        self.forget(url)
        size = _footprint(url, document)
        while self._cache and self.cached_bytes + size > self.policy.cache_bytes:
            self.forget(next(iter(self._cache)))
        now = self._clock.seconds()
        self._cache[url] = (now, now + seconds, document, size)
        self.cached_bytes += size

    def forget(self, url: str) -> None:
        """Drops C{url}'s cached document, one its caller found invalid, say: its fix is then fetched at once."""
        cached = self._cache.pop(url, None)
        if cached is not None:
            self.cached_bytes -= cached[3]

    async def _checked_address(self, host: str) -> str:
        """The address to connect to: C{host} itself, or the first it resolves to, once every one is checked."""
        try:
            return str(ip_address(host))
        except ValueError:
            pass
        try:
            addresses = await self._resolve(host)
        except LookupsBusy as e:
            raise Busy(f"{host} is not looked up: {e}; try again in a few seconds") from None
        except Exception as e:
            raise FetchFailed(f"{host} could not be resolved ({type(e).__name__})") from None
        if not addresses:
            raise FetchFailed(f"{host} resolves to no address")
        for address in addresses:
            problem = _host_problem(address, self.policy)
            if problem:
                raise RefusedURL(f"{host} resolves to {problem}")
        return addresses[0]


def _host_of(url: str) -> str:
    """The host whose share of the fetches C{url} takes: its name as DNS compares names, or the URL when it has none."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        host = None
    return host.rstrip(".") if host else url


def _footprint(url: str, document: dict) -> int:
    """The bytes a cached document takes in memory, its URL with it, counted once when it is fetched."""
    return sys.getsizeof(url) + sum(sys.getsizeof(part) for part in jsontext.parts(document))


def _timed_out(result, timeout) -> None:
    """Whatever a fetch cut short by its timeout ended with (a cancelled request, say), it timed out."""
    raise TimeoutError()


def _reason(error: Exception, policy: FetchPolicy) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer within {policy.timeout} s"
    return type(error).__name__


def _drop(response) -> None:
    """Closes the connection of an unwanted answer instead of reading its body."""
    def refuse(data: bytes) -> None:
        raise _TooLarge()

    treq.collect(response, refuse).addErrback(lambda failure: None)
