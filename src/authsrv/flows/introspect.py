"""
Token introspection (RFC 7662, docs/design.md Introspection fields): whether an
access or refresh token is active and what it says, told only to the client
it was issued to, a client its audience names, or a resource server the
operator allowed to introspect any token. Revoked tokens and tokens of users
who are banned, disabled or gone are inactive, JWT access tokens included;
a client's token for itself (client_credentials) has no user to ask about,
and names the client as its sub, as its JWT does (RFC 9068 section 2.2).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from authsrv.flows.clients import authenticate_client
from authsrv.flows.standing import standing
from authsrv.protocol.errors import InvalidClient
from authsrv.protocol.jwt_access import audience_claim
from authsrv.protocol.params import require
from authsrv.protocol.scope import scope_text
from authsrv.records import AccessToken, Client, RefreshToken
from authsrv.tokens import token_hash

INACTIVE = {"active": False}

_Lookup = Callable[[Any, str, int], Awaitable[AccessToken | RefreshToken | None]]


async def _active_access(store, hashed: str, now: int) -> AccessToken | None:
    return await store.find_access_token(hashed, now)


async def _active_refresh(store, hashed: str, now: int) -> RefreshToken | None:
    token = await store.get_refresh_token(hashed)
    if token is None or token.consumed_at is not None or token.revoked or token.expires_at <= now:
        return None
    return token


def _visible(client: Client, token: AccessToken | RefreshToken) -> bool:
    """
    Its own tokens; access tokens whose audience names the client or a
    resource it serves; any access token for an C{introspect_any} client.
    Refresh tokens of other clients never: they are credentials, not claims
    a resource server needs.
    """
    if token.client_id == client.client_id:
        return True
    if not isinstance(token, AccessToken):
        return False
    return client.introspect_any or any(
        audience == client.client_id or audience in client.audiences for audience in token.audience
    )


def describe(token: AccessToken | RefreshToken, issuer: str) -> dict:
    """The active response's fields for C{token}."""
    answer = {
        "active": True,
        "client_id": token.client_id,
        "sub": token.sub if isinstance(token, RefreshToken) or token.for_user else token.client_id,
        "exp": token.expires_at,
        "iat": token.issued_at,
        "iss": issuer,
    }
    if token.scope:
        answer["scope"] = scope_text(token.scope)
    if token.jkt is not None:
        answer["cnf"] = {"jkt": token.jkt}
    if isinstance(token, RefreshToken):
        answer["token_type"] = "refresh_token"
        return answer
    answer["token_type"] = "Bearer" if token.jkt is None else "DPoP"
    if token.audience:
        answer["aud"] = audience_claim(token.audience)
    if token.jti is not None:
        answer["jti"] = token.jti
    return answer


class IntrospectionFlow:
    def __init__(self, *, store, clients, identity, issuer: str):
        self._store = store
        self._clients = clients
        self._identity = identity
        self._issuer = issuer

    async def introspect(
        self, authorization: bytes | None, params: dict[str, str], now: int, checked: Client | None = None,
    ) -> dict:
        """
        The introspection response for the client the request authenticates;
        public clients may not introspect (they could not keep the answer to
        themselves anyway). token_type_hint only decides which lookup comes
        first. C{checked}: the client the rate limiter already authenticated
        from these credentials.
        """
        client = checked or await authenticate_client(self._clients, authorization, params)
        if client.is_public:
            raise InvalidClient("a public client may not introspect tokens")
        hashed = token_hash(require(params, "token"))
        lookups: tuple[_Lookup, ...] = (_active_access, _active_refresh)
        if params.get("token_type_hint") == "refresh_token":
            lookups = lookups[::-1]
        for lookup in lookups:
            token = await lookup(self._store, hashed, now)
            if token is not None:
                break
        else:
            return INACTIVE
        if not _visible(client, token):
            return INACTIVE
        if isinstance(token, RefreshToken) or token.for_user:
            state = await standing(self._identity, self._store, token.sub, now, token.user_ban)
            if not state.allowed:
                return INACTIVE
        return describe(token, self._issuer)
