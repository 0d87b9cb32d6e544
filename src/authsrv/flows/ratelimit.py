"""
Request rates per client (docs/design.md, Rate limits): token buckets in memory,
so every limit is per instance.

A bucket holds up to C{count} tokens, refills at C{count} per C{per}
seconds, and each request takes one: a client may burst C{count} requests,
then keeps to the rate. A bucket untouched for C{per} seconds is full again,
so dropping it loses nothing; tables drop such buckets a few at a time as
new keys arrive, and never hold more than C{max_keys}. The check of a known
key is one dict lookup and a little arithmetic: introspection runs it on
every request.
"""

from __future__ import annotations

from collections.abc import Callable
from math import ceil

from attrs import frozen

from authsrv import events
from authsrv.flows.clients import authenticate_client
from authsrv.protocol.client_assertion import assertion_params
from authsrv.protocol.errors import OAuthError
from authsrv.protocol.forwarded import address_key
from authsrv.protocol.rates import Rate, parse_rate
from authsrv.records import Client

DEFAULT_RATE = "100/s"
"""Each client's rate at each endpoint, and the internal API's per address, unless configured."""
MAX_KEYS = 10_000
"""Buckets per table at most; at the cap a new key pushes out the oldest."""
SWEEP_STEPS = 2
"""Old buckets looked at per new key: enough to drop idle ones faster than keys arrive."""
PUBLIC = "public"
"""The key of an address's one bucket for all the public clients it names."""
REPORT_WINDOW = 60.0
"""Seconds between two audit events for one bucket, so refusals cannot flood the log."""


@frozen
class RateSettings:
    """C{[rate_limits]}: rates are L{Rate} or None for no limit."""

    default: Rate | None = parse_rate(DEFAULT_RATE)
    internal: Rate | None = parse_rate(DEFAULT_RATE)
    exempt_first_party: bool = False


class RateLimited(OAuthError):
    """
    A request over its rate; C{retry_after} is in whole seconds, at least 1.
    OAuth registers no code for this: C{too_many_requests} is HTTP's name for
    429 (RFC 6585), as other servers answer it.
    """

    error = "too_many_requests"
    status = 429

    def __init__(self, retry_after: int):
        super().__init__(f"too many requests; try again in {retry_after} second{'s' if retry_after != 1 else ''}")
        self.retry_after = retry_after


class _Bucket:
    __slots__ = ("tokens", "stamp", "per", "reported")

    def __init__(self, tokens: float, stamp: float, per: int):
        self.tokens = tokens
        self.stamp = stamp
        self.per = per
        self.reported = float("-inf")


class Buckets:
    """One table of buckets by key, for one endpoint and one kind of key."""

    def __init__(self, max_keys: int = MAX_KEYS):
        self._buckets: dict[str, _Bucket] = {}
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str, rate: Rate, now: float) -> float:
        """Take a token from C{key}'s bucket: 0.0, or the seconds until one is there."""
        bucket = self._buckets.get(key)
        count = rate.count
        if bucket is None:
            self._make_room(now)
            bucket = self._buckets[key] = _Bucket(count, now, rate.per)
        elif now > bucket.stamp:
            tokens = bucket.tokens + (now - bucket.stamp) * count / rate.per
            bucket.tokens = tokens if tokens < count else count
            bucket.stamp = now
            bucket.per = rate.per
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) * rate.per / count

    def wait(self, key: str, rate: Rate, now: float) -> float:
        """The seconds until C{key}'s bucket holds a token (0.0: it holds one now), taking none."""
        bucket = self._buckets.get(key)
        if bucket is None:
            return 0.0
        tokens = bucket.tokens + max(0.0, now - bucket.stamp) * rate.count / rate.per
        return 0.0 if tokens >= 1 else (1 - tokens) * rate.per / rate.count

    def give_back(self, key: str, rate: Rate) -> None:
        """Return a token taken from C{key}'s bucket for what proved not to be its request."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.tokens = min(rate.count, bucket.tokens + 1)

    def report_due(self, key: str, now: float) -> bool:
        """Whether this refusal is C{key}'s first in L{REPORT_WINDOW} seconds."""
        bucket = self._buckets[key]
        if now - bucket.reported < REPORT_WINDOW:
            return False
        bucket.reported = now
        return True

    def _make_room(self, now: float) -> None:
        """
        Look at the oldest buckets: drop the idle ones (full by now), move
        busy ones to the back, unless the table is full: then the oldest goes.
        """
        buckets = self._buckets
        for _ in range(SWEEP_STEPS):
            if not buckets:
                return
            key = next(iter(buckets))
            bucket = buckets.pop(key)
            if now - bucket.stamp < bucket.per and len(buckets) < self._max_keys - 1:
                buckets[key] = bucket


class EndpointLimit:
    """The buckets of one endpoint: by client id, and by client address."""

    def __init__(self, name: str, clock, max_keys: int = MAX_KEYS):
        self.name = name
        self._clock = clock
        self.by_client = Buckets(max_keys)
        self.by_address = Buckets(max_keys)

    def address(self, address: str, rate: Rate | None) -> None:
        """Count a request from C{address}; raises L{RateLimited} over C{rate}."""
        if rate is not None:
            self.count(self.by_address, address_key(address), rate, client_id=None, address=address)

    def count(self, buckets: Buckets, key: str, rate: Rate, *, client_id: str | None, address: str | None) -> None:
        """Take from C{key}'s bucket in C{buckets}; raises L{RateLimited} when it is empty."""
        now = self._clock.seconds()
        wait = buckets.take(key, rate, now)
        if wait:
            self._refuse(buckets, key, wait, now, client_id, address)

    def check(self, buckets: Buckets, key: str, rate: Rate, *, client_id: str | None, address: str | None) -> None:
        """Raise L{RateLimited} if C{key}'s bucket in C{buckets} is empty, taking nothing from it."""
        now = self._clock.seconds()
        wait = buckets.wait(key, rate, now)
        if wait:
            self._refuse(buckets, key, wait, now, client_id, address)

    def _refuse(self, buckets: Buckets, key: str, wait: float, now: float, client_id: str | None,
                address: str | None) -> None:
        retry_after = max(1, ceil(wait))
        if buckets.report_due(key, now):
            events.rate_limited(endpoint=self.name, client_id=client_id, address=address, retry_after=retry_after)
        raise RateLimited(retry_after)


class ClientRateLimits:
    """
    Which bucket a token, pushed authorization, introspection or revocation request counts
    against, decided before the expensive work: the authenticated client's
    own bucket, at its C{rate_limit} or the default. A public client has no
    secret, so anyone can send its id: it counts per address, one caller
    cannot use up its rate for all its users, and one bucket holds all the
    public clients an address names, so naming several multiplies nothing.
    A request that does not authenticate (an unknown id, a wrong secret)
    counts against the default under its address, so neither junk ids nor
    someone else's id spend a real client's bucket. UserInfo counts per
    address: the token's client is only known after a store lookup. Pushes
    and device authorizations of public clients also count per address
    alone, at C{public_pushes} and C{public_devices} (L{public_pushes},
    L{public_devices}).

    A client assertion's signature costs more to check than a secret (an
    RSA or ECDSA verify), so its attempt is counted against its address
    before the check (L{_AssertionCount}) and handed back once it verifies:
    an address over its rate gets its 429 with no signature checked, as
    does a client over its own.
    """

    def __init__(self, *, clock, clients, settings: RateSettings, max_keys: int = MAX_KEYS,
                 public_pushes: Rate | None = None, public_devices: Rate | None = None):
        self._clients = clients
        self.default = settings.default
        """The rate of what does not authenticate, and of clients without a rate of their own."""
        self._exempt_first_party = settings.exempt_first_party
        self._public_pushes = public_pushes
        self._public_devices = public_devices
        self._rates: dict[str, Rate | None] = {}
        self.token = EndpointLimit("token", clock, max_keys)
        self.introspection = EndpointLimit("introspection", clock, max_keys)
        self.revocation = EndpointLimit("revocation", clock, max_keys)
        self.pushed = EndpointLimit("par", clock, max_keys)
        self.public_pushes = Buckets(max_keys)
        """
        Pushes of public clients by address alone, at C{public_pushes}: each
        is kept in the store until used or expired, and anyone may send a
        public client's id, so an address may keep only so many waiting,
        whatever its rate and whichever public clients it names (as
        L{authsrv.config.Limits.pending_per_address} caps waiting sign-ins).
        """
        self.public_devices = Buckets(max_keys)
        """
        Device authorizations of public clients by address alone, at
        C{public_devices}: each waits in the store for its code's life, and
        at the token endpoint's rate one address would keep tens of
        thousands waiting, whichever public clients it names.
        """
        self.userinfo = EndpointLimit("userinfo", clock, max_keys)

    async def client_request(self, limit: EndpointLimit, authorization: bytes | None, params: dict[str, str],
                             address_of: Callable[[], str]) -> Client | None:
        """
        Count a client's request at C{limit}; raises L{RateLimited} over its
        rate. Fires with the client when it authenticated, checked here in
        full (an assertion used up), so that the endpoint need not check the
        same credentials again; with None when it did not authenticate and
        no signature was checked: the endpoint says why. An assertion whose
        signature was checked and failed raises its error here.
        """
        if _carries_assertion(params):
            return await self._assertion_request(limit, authorization, params, address_of())
        client = await self._authenticated(authorization, params, limit is self.pushed)
        if client is None:
            limit.address(address_of(), self.default)
            return None
        if limit is self.pushed and client.is_public and self._public_pushes is not None:
            address = address_of()
            limit.count(self.public_pushes, address_key(address), self._public_pushes,
                        client_id=client.client_id, address=address)
        rate = self.rate_of(client)
        if rate is None:
            return client
        if client.is_public:
            address = address_of()
            limit.count(limit.by_address, f"{address_key(address)} {PUBLIC}", rate,
                        client_id=client.client_id, address=address)
        else:
            limit.count(limit.by_client, client.client_id, rate, client_id=client.client_id, address=None)
        return client

    async def device_request(self, authorization: bytes | None, params: dict[str, str],
                             address_of: Callable[[], str]) -> Client | None:
        """
        Count a device authorization request (RFC 8628 section 3.1) as a
        token request, and a public client's also against its address's
        waiting device authorizations; raises L{RateLimited} over either.
        """
        client = await self.client_request(self.token, authorization, params, address_of)
        if client is not None and client.is_public and self._public_devices is not None:
            address = address_of()
            self.token.count(self.public_devices, address_key(address), self._public_devices,
                             client_id=client.client_id, address=address)
        return client

    def rate_of(self, client: Client) -> Rate | None:
        """The rate C{client} is held to: None for none (its own "off", or first-party and exempt)."""
        if self._exempt_first_party and client.first_party:
            return None
        text = client.rate_limit
        if text is None:
            return self.default
        if text in self._rates:
            return self._rates[text]
        try:
            rate = parse_rate(text)
        except ValueError:
            rate = self.default
        if len(self._rates) >= MAX_KEYS:
            self._rates.clear()
        self._rates[text] = rate
        return rate

    async def _assertion_request(self, limit: EndpointLimit, authorization: bytes | None, params: dict[str, str],
                                 address: str) -> Client | None:
        """
        An assertion checked in full under L{_AssertionCount}; one that failed
        before its signature was checked (an unknown client, one without
        keys) counts against its address as any request that does not
        authenticate.
        """
        count = _AssertionCount(self, limit, address)
        try:
            return await authenticate_client(self._clients, authorization, params, pushed=limit is self.pushed,
                                              address=address, gate=count)
        except RateLimited:
            raise
        except OAuthError:
            if count.counted:
                raise
        limit.address(address, self.default)
        return None

    def userinfo_request(self, address: str) -> None:
        self.userinfo.address(address, self.default)

    async def _authenticated(self, authorization: bytes | None, params: dict[str, str],
                             pushed: bool) -> Client | None:
        """The client the request authenticates as, or None; the flow reports why not."""
        try:
            return await authenticate_client(self._clients, authorization, params, pushed=pushed)
        except OAuthError:
            return None


class _AssertionCount:
    """
    The L{authsrv.flows.clients.AssertionGate} of one assertion request: an
    attempt counted against its address before its signature is checked (a
    client over its own rate refused first, taking nothing), handed back to
    the address and taken from the client once it verifies. Nothing between
    taking and handing back waits, so a client's own requests, however many
    at once, never hold its address's tokens.
    """

    def __init__(self, rates: ClientRateLimits, limit: EndpointLimit, address: str):
        self._rates = rates
        self._limit = limit
        self._address = address
        self.counted = False

    def before(self, client: Client) -> None:
        limit, rate = self._limit, self._rates.rate_of(client)
        if rate is not None:
            limit.check(limit.by_client, client.client_id, rate, client_id=client.client_id, address=None)
        limit.address(self._address, self._rates.default)
        self.counted = True

    def verified(self, client: Client) -> None:
        limit, default = self._limit, self._rates.default
        if default is not None:
            limit.by_address.give_back(address_key(self._address), default)
        rate = self._rates.rate_of(client)
        if rate is not None:
            limit.count(limit.by_client, client.client_id, rate, client_id=client.client_id, address=None)


def _carries_assertion(params: dict[str, str]) -> bool:
    """Whether C{params} authenticate with a client assertion (a malformed one does not: it fails cheaply)."""
    try:
        return assertion_params(params) is not None
    except OAuthError:
        return False
