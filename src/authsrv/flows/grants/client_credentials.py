"""
grant_type=client_credentials (RFC 6749 section 4.4): a confidential client
asks for a token for itself, no user involved. The scope is limited to the
client's registered C{scopes} (all of them when none is asked for); a
C{resource} it may request (RFC 8707) makes the token an RFC 9068 JWT for
that audience. No refresh token (section 4.4.3) and no ID token (there is
no user); the grant exists so that introspection and revocation treat the
token like any other, and lives as long as its one token.
"""

from __future__ import annotations

from authsrv.flows.issue import issued_event
from authsrv.protocol.errors import InvalidClient, InvalidScope, InvalidTarget, UnauthorizedClient
from authsrv.protocol.scope import parse_scope
from authsrv.records import NO_USER, Client, Grant
from authsrv.tokens import new_token

USER_SCOPES = frozenset({"openid", "offline_access"})
"""Scopes that only mean something for a user; a client's token for itself never carries them."""


def client_scope(client: Client, params: dict[str, str]) -> frozenset[str]:
    """The scope asked for, within what the client may ask for; all of that when none is asked (or a blank one)."""
    allowed = frozenset(client.scopes) - USER_SCOPES
    asked = parse_scope(params.get("scope", ""))
    if not asked:
        return allowed
    if asked & USER_SCOPES:
        raise InvalidScope(f"{' and '.join(sorted(asked & USER_SCOPES))} need a user; client_credentials has none")
    if not asked <= allowed:
        raise InvalidScope(f"this client may not ask for {' '.join(sorted(asked - allowed))}")
    return asked


def client_audience(client: Client, params: dict[str, str]) -> tuple[str, ...]:
    resource = params.get("resource")
    if resource is None:
        return ()
    if resource not in client.resources:
        raise InvalidTarget("resource is not one this client may request")
    return (resource,)


class ClientCredentialsGrant:
    """C{minter} is a L{authsrv.flows.issue.TokenMinter}; C{limits} gives the token's lifetime."""

    grant_type = "client_credentials"

    def __init__(self, *, store, minter, limits):
        self._store = store
        self._minter = minter
        self._limits = limits

    async def exchange(self, client: Client, params: dict[str, str], now: int, jkt: str | None = None,
                       address: str | None = None) -> dict:
        if client.is_public:
            raise UnauthorizedClient("client_credentials is for confidential clients only")
        scope = client_scope(client, params)
        audience = client_audience(client, params)
        grant = Grant(
            grant_id=new_token(16), client_id=client.client_id, sub=NO_USER, scope=scope, resource=audience,
            auth_time=now, created_at=now, expires_at=now + self._limits.access_token_ttl, amr=(),
        )
        issued = self._minter.mint_for_client(grant, client, scope=scope, audience=audience, now=now, jkt=jkt)
        if await self._store.start_grant(grant, issued.access) is False:
            raise InvalidClient("client authentication failed")  # removed since this instance cached it
        issued_event(issued, client.client_id, self.grant_type, address)
        return issued.response
