"""
Clients are read on every token, introspection and revocation request and
change rarely, so each lookup is kept for a couple of seconds: an operator's
change reaches every instance within that time, and the hot paths save a
trip through the store. A client_credentials request is the exception: its
secret alone mints a token, so its client is read from the store every
time, and a secret ended or a client removed on another instance stops it
at once. The server key that client secret hashes are keyed with never
changes, so it is read once. Unknown client_ids are kept apart, in a small
table of their own, so that a flood of junk ids never pushes a real client
out and sends its next request to the store.
"""

from __future__ import annotations

import math
from typing import Protocol

from twisted.logger import Logger

from authsrv import events
from authsrv.client_secrets import SecretKeeper
from authsrv.flows.server_keys import ServerKeys
from authsrv.protocol.client_assertion import (
    CLOCK_SKEW,
    HMAC_ALGS,
    assertion_kid,
    assertion_params,
    public_keyset,
    secret_keyset,
    unverified_client_id,
    verified_claims,
)
from authsrv.protocol.clientauth import CLIENT_SECRET_JWT, PRIVATE_KEY_JWT, authenticate, client_credentials
from authsrv.protocol.errors import InvalidClient, InvalidRequest
from authsrv.protocol.profiles import assertion_algorithms, issuer_audience_only
from authsrv.records import Client
from authsrv.remote_documents import RemoteDocumentError
from authsrv.sealing import Unsealable
from authsrv.tokens import CLIENT_SECRET_KEY

log = Logger()
TTL = 2.0
MAX_ENTRIES = 10_000
"""Known clients kept at most; at the cap the table is emptied."""
MAX_UNKNOWN = 1_000
"""Unknown client_ids kept at most (anyone may send any), emptied at the cap without touching known clients."""


class ClientCache:
    """Provides C{get_client} like the store, answering recent lookups from memory."""

    def __init__(self, store, clock, ttl: float = TTL, assertions: "AssertionChecker | None" = None):
        self.assertions = assertions
        self._store = store
        self._clock = clock
        self._ttl = ttl
        self._entries: dict[str, tuple[float, Client]] = {}
        self._unknown: dict[str, float] = {}
        self._keys = ServerKeys(store)

    async def secret_key(self) -> bytes:
        """The server key of client secret hashes, from the store on first use."""
        return await self._keys.get(CLIENT_SECRET_KEY)

    def seconds(self) -> float:
        """The clock's time, which decides whether a rotated-out client secret still works."""
        return self._clock.seconds()

    async def get_client(self, client_id: str, fresh: bool = False) -> Client | None:
        """
        The client, from memory unless C{fresh} asks for the store's record
        (which is then kept); a known client costs one dict lookup and a
        compare, an unknown id one more lookup in its own table.
        """
        now = self._clock.seconds()
        entry = self._entries.get(client_id)
        if entry is not None and entry[0] > now and not fresh:
            return entry[1]
        if not fresh and self._unknown.get(client_id, 0.0) > now:
            return None
        client = await self._store.get_client(client_id)
        if client is None:
            self._entries.pop(client_id, None)
            _keep(self._unknown, MAX_UNKNOWN, client_id, now + self._ttl)
        else:
            self._unknown.pop(client_id, None)
            _keep(self._entries, MAX_ENTRIES, client_id, (now + self._ttl, client))
        return client


def _keep(table: dict, cap: int, key: str, value) -> None:
    """Put C{key} in C{table}, emptied first when it holds C{cap} entries: lookups are short-lived."""
    if len(table) >= cap:
        table.clear()
    table[key] = value


class AssertionGate(Protocol):
    """What an assertion's check tells the rate limiter, so that an attempt is counted before its costly part."""

    def before(self, client: Client) -> None:
        """C{client} is named and takes assertions; its keys are at hand, the signature not yet checked."""

    def verified(self, client: Client) -> None:
        """The assertion verified as C{client}'s, its jti not yet used up."""


class AssertionChecker:
    """
    private_key_jwt and client_secret_jwt
    (L{authsrv.protocol.client_assertion}): a private_key_jwt client's keys
    are its registered C{jwks}, or its C{jwks_uri} fetched by C{documents}
    (a L{authsrv.remote_documents.RemoteDocuments}), fetched again when an
    assertion names a key it lacks; a client_secret_jwt client's key is its
    secret, opened by C{secrets} (None: the method is not offered). Each
    jti is claimed in the C{store} until the assertion expires, so a replay
    fails. C{audiences} are what an assertion's aud may name (the issuer
    first, then the token endpoint: RFC 7523 section 3, OIDC Core section
    9); at the pushed authorization request endpoint also its own URL,
    C{pushed_endpoint} (RFC 9126 section 2).
    """

    def __init__(self, *, store, documents, audiences: tuple[str, ...], secrets: SecretKeeper | None = None,
                 pushed_endpoint: str | None = None):
        self._store = store
        self._documents = documents
        self._audiences = audiences
        self._pushed_audiences = audiences if pushed_endpoint is None else (*audiences, pushed_endpoint)
        self._secrets = secrets

    async def check(self, client: Client | None, assertion: str, now: int, consume: bool,
                    pushed: bool = False, address: str | None = None, gate: AssertionGate | None = None) -> Client:
        """
        The client C{assertion} authenticates, sent to the pushed request
        endpoint when C{pushed}; C{address}, the request's, is what the
        audit event of a replay names; C{gate} is told just before the
        signature is checked, and just after: nothing waits between, so a
        count taken before is handed back before another request runs. A
        C{jwks_uri} is fetched before: its fetches are bounded by
        L{authsrv.remote_documents} (cached, shared by concurrent callers,
        fetched again at most every C{refetch_after}), not per request.
        """
        method = client.token_endpoint_auth_method if client is not None else None
        hmac = method == CLIENT_SECRET_JWT and self._secrets is not None
        if client is None or not (method == PRIVATE_KEY_JWT or hmac):
            raise InvalidClient(
                "client authentication failed: this client does not authenticate with a client assertion"
            )
        if method == PRIVATE_KEY_JWT:
            keyset, algorithms = await self._keys(client, assertion), assertion_algorithms(client)
        else:
            keyset, algorithms = self._secret_keys(client, now), HMAC_ALGS
        if gate is not None:
            gate.before(client)
        audiences = self._pushed_audiences if pushed else self._audiences
        claims = verified_claims(assertion, client.client_id, keyset, audiences, now, algorithms,
                                 issuer_only=issuer_audience_only(client))
        if gate is not None:
            gate.verified(client)
        kept_until = math.ceil(claims["exp"]) + CLOCK_SKEW  # as long as the assertion is accepted at all
        if consume and not await self._store.claim_jti(client.client_id, claims["jti"], kept_until, now):
            events.assertion_replayed(client_id=client.client_id, address=address)
            raise InvalidClient("client authentication failed: this client_assertion was already used")
        return client

    def _secret_keys(self, client: Client, now: int):
        try:
            secrets = self._secrets.secrets(client, now) if self._secrets is not None else ()
        except Unsealable:
            log.error("the sealed secret of client {client_id} does not open with the [client_secrets] key;"
                      " rotate the client's secret", client_id=client.client_id)
            secrets = ()
        if not secrets:
            raise InvalidClient("client authentication failed: the client's secret cannot be read on this server")
        return secret_keyset(secrets)

    async def _keys(self, client: Client, assertion: str):
        if client.jwks is not None:
            return public_keyset(client.jwks)
        if client.jwks_uri is None:
            raise InvalidClient("client authentication failed: the client has no registered keys")
        kid = assertion_kid(assertion)
        refetch = False
        while True:
            try:
                keyset = public_keyset(await self._documents.fetch(client.jwks_uri, refetch=refetch))
            except (RemoteDocumentError, ValueError) as e:
                log.warn("jwks_uri of client {client_id} unusable: {reason}", client_id=client.client_id, reason=str(e))
                raise InvalidClient(
                    "client authentication failed: the client's jwks_uri could not be fetched or holds no usable keys"
                ) from None
            if kid is None or keyset.get_key(kid) is not None or refetch:
                return keyset
            refetch = True


async def authenticate_client(
    clients, authorization: bytes | None, params: dict[str, str], *, pushed: bool = False,
    address: str | None = None, gate: AssertionGate | None = None,
) -> Client:
    """
    The client a token, introspection, revocation or (C{pushed}) pushed
    authorization request comes from (client_secret_basic,
    client_secret_post, private_key_jwt, client_secret_jwt, or a public
    client by its client_id), or L{authsrv.protocol.errors.InvalidClient}.
    An assertion is used up; C{gate} is told of its check (the rate limiter
    counts it: L{AssertionGate}). A client_credentials request's
    client is read from the store, not from the cache. C{address} is the
    request's where its route has it (a replayed assertion's audit event
    names it), else None.
    """
    fresh = params.get("grant_type") == "client_credentials"
    assertion = assertion_params(params)
    if assertion is not None:
        if authorization and authorization[:6].lower() == b"basic ":
            raise InvalidRequest("use one client authentication method, not Basic and client_assertion both")
        client_id = unverified_client_id(assertion)
        if params.get("client_id", client_id) != client_id:
            raise InvalidClient("client authentication failed: client_id differs from the assertion's iss")
        if clients.assertions is None:
            raise InvalidClient("client authentication failed: this server accepts no client assertions")
        client = await clients.get_client(client_id, fresh)
        return await clients.assertions.check(client, assertion, int(clients.seconds()), True, pushed, address, gate)
    credentials = client_credentials(authorization, params)
    client = await clients.get_client(credentials.client_id, fresh)
    return authenticate(client, credentials, await clients.secret_key(), int(clients.seconds()))
