"""
Back-channel logout (OIDC Back-Channel Logout 1.0): when a browser session
ends, every client that holds a grant from it and registered a
C{backchannel_logout_uri} gets a signed logout token by a direct POST.

Delivery runs beside the user's redirect, never before it: a slow or
unreachable relying party costs the user nothing. Each delivery is retried
a bounded number of times and its outcome is an audit event; no failure
reaches the user.
"""

from __future__ import annotations


from treq.client import HTTPClient
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater
from twisted.logger import Logger
from twisted.web.client import Agent

from authsrv import events
from authsrv.records import BrowserSession
from authsrv.tokens import new_token

LOGOUT_EVENT = "http://schemas.openid.net/event/backchannel-logout"
LOGOUT_TOKEN_TTL = 120
RETRY_DELAYS = (1.0, 5.0)
"""Seconds to wait before the second and third attempt; there is no fourth."""
ATTEMPT_TIMEOUT = 5.0

def logout_token(keystore, issuer: str, client_id: str, sub: str, sid: str, now: int) -> str:
    """
    A logout token (section 2.4): typ logout+jwt, the event claim, and never
    a nonce, so that it cannot pass for an ID token.
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
    return keystore.sign(claims, "RS256", "logout+jwt")


def _outcome(code: int) -> tuple[bool, str]:
    """
    Whether an answer ends the delivery, and how to report it: a 2xx
    succeeded, a 4xx other than 429 will not change by asking again.
    """
    if 200 <= code < 300:
        return True, f"delivered (HTTP {code})"
    if 300 <= code < 500 and code != 429:
        return True, f"refused (HTTP {code})"
    return False, f"HTTP {code}"


class BackchannelNotifier:
    """
    Sends logout tokens with C{http_client} (a treq-like client with
    C{post}), timing retries and timeouts on C{reactor}.
    """

    log = Logger()

    def __init__(self, reactor, http_client, *, retry_delays=RETRY_DELAYS, attempt_timeout=ATTEMPT_TIMEOUT):
        self._reactor = reactor
        self._http = http_client
        self._retry_delays = tuple(retry_delays)
        self._attempt_timeout = attempt_timeout

    def session_ended(self, store, keystore, issuer: str, session: BrowserSession) -> Deferred:
        """
        Notify every client of C{session}; fires with the outcomes once
        every delivery has ended, and never fails.
        """
        d = Deferred.fromCoroutine(self._session_ended(store, keystore, issuer, session))
        d.addErrback(lambda f: self.log.failure("back-channel logout of {sid} failed", f, sid=session.sid))
        return d

    async def _session_ended(self, store, keystore, issuer, session) -> list[str]:
        now = int(self._reactor.seconds())
        deliveries = []
        for client_id in await store.session_clients(session.sid):
            client = await store.get_client(client_id)
            if client is not None and client.backchannel_logout_uri:
                token = logout_token(keystore, issuer, client_id, session.sub, session.sid, now)
                deliveries.append(
                    Deferred.fromCoroutine(self.deliver(client.backchannel_logout_uri, token, client_id, session.sid))
                )
        return await gatherResults(deliveries)

    async def deliver(self, uri: str, token: str, client_id: str, sid: str) -> str:
        """POST C{token} to C{uri} until it is answered for good or the retries run out."""
        for attempt, delay in enumerate((0.0, *self._retry_delays), start=1):
            if delay:
                await deferLater(self._reactor, delay)
            final, answer = await self._attempt(uri, token)
            if final:
                break
        outcome = f"{answer} at attempt {attempt}" if final else f"gave up after {attempt} attempts, last: {answer}"
        events.backchannel_logout(client_id=client_id, session_id=sid, outcome=outcome)
        return outcome

    async def _attempt(self, uri: str, token: str) -> tuple[bool, str]:
        try:
            d = self._http.post(uri, data={"logout_token": token}, allow_redirects=False)
            response = await d.addTimeout(self._attempt_timeout, self._reactor)
        except Exception as e:
            # Whatever went wrong on the way (refused, reset, timed out) may pass.
            return False, type(e).__name__
        return _outcome(response.code)


def default_http_client(reactor) -> HTTPClient:
    """Plain HTTP(S) to relying parties, connecting within the attempt timeout."""
    return HTTPClient(Agent(reactor, connectTimeout=ATTEMPT_TIMEOUT))
