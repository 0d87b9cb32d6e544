"""
The user a grant is for, asked for again at every token request: a user
who is gone, disabled or banned ends the grant instead (docs/design.md, Bans).
"""

from __future__ import annotations

from authsrv import events
from authsrv.flows.standing import standing
from authsrv.protocol.errors import InvalidGrant, InvalidTarget
from authsrv.records import NOT_READ, Client, NotRead, User


class GrantUsers:
    """
    C{claims} is an L{authsrv.flows.claims.ClaimsSource}; the grants pass
    L{link_provider} to their token and code lookups.
    """

    def __init__(self, *, store, identity, claims):
        self._store = store
        self._identity = identity
        self._claims = claims

    @property
    def link_provider(self) -> str | None:
        return self._claims.link_provider

    async def allowed(self, grant_id: str, sub: str, client_id: str, now: int, *, address: str | None,
                      link: str | None | NotRead = NOT_READ, **ban) -> User:
        """
        The user as tokens describe them, or L{InvalidGrant} after revoking
        the grant. C{ban=} and C{link} pass the ban record and the linked
        chat account id a lookup already read; C{address} is the token
        request's, which the audit event names.
        """
        state = await standing(self._identity, self._store, sub, now, **ban)
        if not state.allowed:
            if await self._store.revoke_grant(grant_id, now):
                events.grant_revoked(sub=sub, client_id=client_id, grant_id=grant_id, reason="user not allowed",
                                     address=address)
            raise InvalidGrant("the user may no longer use this service")
        return await self._claims.user(state.user, link)


def audience(params: dict[str, str], granted: tuple[str, ...], client: Client) -> tuple[str, ...]:
    """
    The access token's audience: what the grant allows, or one of it (RFC
    8707 section 2.2), among the resources the client may still request: one
    the operator took off the client since is no longer in its tokens, as a
    client's changed settings apply to its next token (docs/design.md, Changed
    clients).
    """
    allowed = tuple(r for r in granted if r in client.resources)
    resource = params.get("resource")
    if resource is None:
        return allowed
    if resource not in granted:
        raise InvalidTarget("resource was not granted in the authorization request")
    if resource not in allowed:
        raise InvalidTarget("this client may no longer request that resource; leave resource out or name another")
    return (resource,)


OFFLINE_ACCESS = frozenset({"offline_access"})


def granted_scope(scope: frozenset[str], offline: bool) -> frozenset[str]:
    """
    The scope of the tokens a code or device grant issues: without
    offline_access when no refresh token comes with them (the client may not
    use the refresh_token grant), since the scope answered is what was
    granted (RFC 6749 section 5.1) and a client reads offline_access as a
    refresh token to keep.
    """
    return scope if offline or "offline_access" not in scope else scope - OFFLINE_ACCESS
