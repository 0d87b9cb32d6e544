"""
Back-channel logout (OIDC Back-Channel Logout 1.0): when a browser session
ends, every client that holds a grant from it and registered a
C{backchannel_logout_uri} gets a signed logout token by a direct POST.

Delivery runs beside the user's redirect (or the operator's answer), never
before it: a slow or unreachable relying party costs the user nothing.
Each delivery is retried a bounded number of times and its outcome is an
audit event; no failure reaches the user. The notifier keeps the
deliveries in flight, so that a stopping server or a finishing operator
command waits for them, and cuts off (and reports) those still running
after its timeout.

The relying party's host is resolved once per delivery, off the reactor
thread, and every attempt connects to that address (a name that later
resolves elsewhere, DNS rebinding, changes nothing) while sending the name
in the Host header and checking an HTTPS certificate against it. A host
that is or resolves to an address the server must not reach
(L{authsrv.protocol.targets}) gets no request: the outcome is a refused
target.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from treq.client import HTTPClient
from twisted.internet.defer import CancelledError, Deferred, DeferredList
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IResolutionReceiver, IStreamClientEndpoint
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.web.client import Agent, BrowserLikePolicyForHTTPS
from twisted.web.iweb import IAgentEndpointFactory
from zope.interface import implementer

from authsrv import events
from authsrv.hostlookup import addresses_of
from authsrv.protocol.targets import address_problem
from authsrv.records import BrowserSession
from authsrv.tokens import new_token

LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"
LOGOUT_TOKEN_TTL = 120
RETRY_DELAYS = (1.0, 5.0)
"""Seconds to wait before the second and third attempt; there is no fourth."""
ATTEMPT_TIMEOUT = 5.0
RESPONSE_BYTES = 64 * 1024
"""What one connection may receive beyond a body the caller reads: TLS's handshake, an answer's headers."""
DELIVERED = "delivered"
REFUSED = "refused"
"""How a final answer's outcome begins, so that metrics can tell the two from giving up."""

def logout_token(keystore, issuer: str, client_id: str, sub: str, sid: str, now: int, alg: str) -> str:
    """
    A logout token (section 2.4): typ logout+jwt, the event claim, and never
    a nonce, so that it cannot pass for an ID token; signed with C{alg}, the
    client's ID token algorithm, since the client checks both alike.
    """
    claims = {
        "iss": issuer,
        "aud": client_id,
        "iat": now,
        "exp": now + LOGOUT_TOKEN_TTL,
        "jti": new_token(16),
        "sub": sub,
        "sid": sid,
        "events": {LOGOUT_EVENT: {}},
    }
    return keystore.sign(claims, alg, "logout+jwt")


def _outcome(code: int) -> tuple[bool, str]:
    """
    Whether an answer ends the delivery, and how to report it: a 2xx
    succeeded, a 4xx other than 429 will not change by asking again.
    """
    if 200 <= code < 300:
        return True, f"{DELIVERED} (HTTP {code})"
    if 300 <= code < 500 and code != 429:
        return True, f"{REFUSED} (HTTP {code})"
    return False, f"HTTP {code}"


class RefusedTarget(Exception):
    """A relying party's host is or resolves to an address the server must not reach."""


def resolve_host(reactor, host: str) -> Deferred:
    """Every address C{host} resolves to, by the reactor's name resolver (getaddrinfo on its thread pool)."""
    d: Deferred[list[str]] = Deferred()
    addresses: list[str] = []

    @implementer(IResolutionReceiver)
    class Receiver:
        def resolutionBegan(self, resolution):
            pass

        def addressResolved(self, address):
            addresses.append(address.host)

        def resolutionComplete(self):
            if not d.called:  # not timed out meanwhile
                d.callback(addresses)

    reactor.nameResolver.resolveHostName(Receiver(), host)
    return d


async def pinned_address(resolve, uri: str) -> str:
    """
    The one address deliveries to C{uri} connect to: its host if that is an
    address, else the first the name resolves to; L{RefusedTarget} when any
    of them is a refused address.
    """
    host = urlsplit(uri).hostname or ""
    addresses = await addresses_of(host, resolve)
    for address in addresses:
        problem = address_problem(address)
        if problem:
            raise RefusedTarget(problem if address == host else f"{host} resolves to {problem}")
    return addresses[0]


class BackchannelNotifier:
    """
    Sends logout tokens with C{http_for(address)} (a treq-like client with
    C{post} that connects to C{address} whatever the URI's host), resolving
    hosts with C{resolve(host)} (a Deferred list of addresses), timing
    retries and timeouts on C{reactor}.
    """

    log = Logger()

    def __init__(self, reactor, http_for, *, resolve=None, retry_delays=RETRY_DELAYS, attempt_timeout=ATTEMPT_TIMEOUT):
        self._reactor = reactor
        self._http_for = http_for
        self._resolve = resolve or (lambda host: resolve_host(reactor, host))
        self._retry_delays = tuple(retry_delays)
        self._attempt_timeout = attempt_timeout
        self._in_flight: set[Deferred] = set()
        self._cut_off = False

    def session_ended(self, store, keystore, issuer: str, session: BrowserSession) -> Deferred:
        """
        Notify every client of C{session}; fires once every delivery has
        ended or been cut off (L{settle}), and never fails. Nobody needs to
        wait for it: L{settle} does.
        """
        d = Deferred.fromCoroutine(self._session_ended(store, keystore, issuer, session))
        d.addErrback(self._failed, session.sid)
        self._in_flight.add(d)
        d.addBoth(self._ended, d)
        return d

    def _failed(self, failure, sid: str) -> None:
        if not failure.check(CancelledError):  # cut off by settle, which reported each delivery
            self.log.failure("back-channel logout of {sid} failed", failure, sid=sid)

    def _ended(self, result, d: Deferred):
        self._in_flight.discard(d)
        return result

    async def settle(self, timeout: float | None = None) -> int:
        """
        Wait for the deliveries in flight, each bounded by its retries and
        timeouts; those still running C{timeout} seconds on (if given) are
        cut off, each with its audit event. Fires with how many sessions'
        notices were cut off.
        """
        waiting = list(self._in_flight)
        if not waiting:
            return 0
        cut: list[Deferred] = []

        def cut_off():
            self._cut_off = True
            cut.extend(self._in_flight)
            for d in list(cut):
                d.cancel()

        timer = self._reactor.callLater(timeout, cut_off) if timeout is not None else None
        await DeferredList(waiting)
        if timer is not None and timer.active():
            timer.cancel()
        return len(cut)

    async def _session_ended(self, store, keystore, issuer, session) -> list[str]:
        now = int(self._reactor.seconds())
        deliveries = []
        for client_id in await store.session_clients(session.sid):
            client = await store.get_client(client_id)
            if client is not None and client.backchannel_logout_uri:
                alg = client.id_token_signed_response_alg
                if alg not in keystore.algorithms:
                    self.log.error("no logout token for {client_id}: its {alg} is no longer offered",
                                   client_id=client_id, alg=alg)
                    continue
                token = logout_token(keystore, issuer, client_id, session.sub, session.sid, now, alg)
                deliveries.append(
                    Deferred.fromCoroutine(self.deliver(client.backchannel_logout_uri, token, client_id, session.sid))
                )
        # Each delivery fails only when cut off, which it reports itself.
        return [outcome for delivered, outcome in await DeferredList(deliveries, consumeErrors=True) if delivered]

    async def deliver(self, uri: str, token: str, client_id: str, sid: str) -> str:
        """
        POST C{token} to C{uri} until it is answered for good or the retries
        run out; the host is resolved at the first attempt that can, and
        then kept.
        """
        http = None
        attempt = 0
        try:
            for attempt, delay in enumerate((0.0, *self._retry_delays), start=1):
                if delay:
                    await deferLater(self._reactor, delay)
                if http is None:
                    try:
                        address = await Deferred.fromCoroutine(pinned_address(self._resolve, uri)).addTimeout(
                            self._attempt_timeout, self._reactor
                        )
                    except RefusedTarget as e:
                        outcome = f"refused target ({e})"
                        events.backchannel_logout(client_id=client_id, session_id=sid, outcome=outcome)
                        return outcome
                    except CancelledError:
                        raise
                    except Exception as e:
                        self._unless_cut_off()
                        final, answer = False, f"{type(e).__name__} resolving the host"
                        continue
                    http = self._http_for(address)
                final, answer = await self._attempt(http, uri, token)
                if final:
                    break
                self._unless_cut_off()
        except CancelledError:
            events.backchannel_logout(client_id=client_id, session_id=sid,
                                      outcome=f"cut off at shutdown (attempt {attempt})")
            raise
        outcome = f"{answer} at attempt {attempt}" if final else f"gave up after {attempt} attempts, last: {answer}"
        events.backchannel_logout(client_id=client_id, session_id=sid, outcome=outcome)
        return outcome

    def _unless_cut_off(self) -> None:
        """
        L{CancelledError} once L{settle} has cut the deliveries off: a
        cancelled request may fail as anything (the HTTP client wraps it).
        """
        if self._cut_off:
            raise CancelledError()

    async def _attempt(self, http, uri: str, token: str) -> tuple[bool, str]:
        try:
            d = http.post(uri, data={"logout_token": token}, allow_redirects=False)
            response = await d.addTimeout(self._attempt_timeout, self._reactor)
        except CancelledError:
            raise
        except Exception as e:
            # Whatever went wrong on the way (refused, reset, timed out) may pass.
            return False, type(e).__name__
        return _outcome(response.code)


class ReceiveLimit:
    """
    At most C{most} bytes received on each connection, TLS and headers
    included: the HTTP client keeps however many header lines a peer
    sends. C{exceeded} tells a connection aborted for it from another failure.
    """

    def __init__(self, most: int):
        self.most = most
        self.exceeded = False


@implementer(IAgentEndpointFactory)
class PinnedEndpoints:
    """
    Connects to one resolved address, whatever a URI's host: the Agent
    still sends the name as Host, and HTTPS checks the certificate against
    the name. Every connection is aborted C{lifetime} seconds after it is
    made (on C{clock}, the reactor by default), so that a peer that never
    finishes its answer holds no socket beyond the caller's own timeout,
    and once it has received more than its L{ReceiveLimit}.
    """

    def __init__(self, reactor, address: str, tls=None, *, lifetime: float = ATTEMPT_TIMEOUT, clock=None,
                 limit: ReceiveLimit | None = None):
        self._reactor = reactor
        self._address = address
        self._tls = tls or BrowserLikePolicyForHTTPS()
        self._lifetime = lifetime
        self._clock = clock or reactor
        self._limit = limit or ReceiveLimit(RESPONSE_BYTES)

    def endpointForURI(self, uri):
        tcp = TCP6ClientEndpoint if ":" in self._address else TCP4ClientEndpoint
        endpoint = _LimitedLifetime(tcp(self._reactor, self._address, uri.port, timeout=ATTEMPT_TIMEOUT),
                                    self._clock, self._lifetime, self._limit)
        if uri.scheme == b"https":
            return wrapClientTLS(self._tls.creatorForNetloc(uri.host, uri.port), endpoint)
        return endpoint


class _Deadline(ProtocolWrapper):
    """
    Aborts the TCP connection at its deadline: neither a body dripped a byte
    at a time nor a TLS close the peer never answers keeps it open, and an
    answer nobody reads is let go. Aborts it too past its receive limit.
    """

    def makeConnection(self, transport):
        self._timer = self.factory.clock.callLater(self.factory.lifetime, transport.abortConnection)
        self._left = self.factory.limit.most
        super().makeConnection(transport)

    def dataReceived(self, data):
        self._left -= len(data)
        if self._left < 0:
            self.factory.limit.exceeded = True
            self.transport.abortConnection()
            return
        super().dataReceived(data)

    def connectionLost(self, reason):
        if self._timer.active():
            self._timer.cancel()
        super().connectionLost(reason)


class _DeadlineFactory(WrappingFactory):
    protocol = _Deadline

    def __init__(self, wrapped, clock, lifetime: float, limit: ReceiveLimit):
        super().__init__(wrapped)
        self.clock = clock
        self.lifetime = lifetime
        self.limit = limit


@implementer(IStreamClientEndpoint)
class _LimitedLifetime:
    """An endpoint whose connections last at most C{lifetime} seconds on C{clock}, and receive at most C{limit}."""

    def __init__(self, endpoint, clock, lifetime: float, limit: ReceiveLimit):
        self._endpoint = endpoint
        self._clock = clock
        self._lifetime = lifetime
        self._limit = limit

    def connect(self, factory):
        wrapping = _DeadlineFactory(factory, self._clock, self._lifetime, self._limit)
        return self._endpoint.connect(wrapping).addCallback(lambda protocol: protocol.wrappedProtocol)


def default_http_client(reactor):
    """
    C{http_for(address)}: plain HTTP(S) to relying parties, connecting to
    C{address} within the attempt timeout.
    """
    def http_for(address: str) -> HTTPClient:
        return HTTPClient(Agent.usingEndpointFactory(reactor, PinnedEndpoints(reactor, address)))

    return http_for
