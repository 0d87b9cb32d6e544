"""
UserInfo (OIDC Core 5.3) with RFC 6750 bearer tokens: the claims the access
token's scopes release about a user who may still use the service. One
indexed lookup of the token, which brings its user's ban along, and the
identity backend's record (docs/design.md, Speed targets).
"""

from __future__ import annotations

from authsrv.flows.standing import standing
from authsrv.protocol.errors import InsufficientScope, InvalidToken
from authsrv.protocol.oidc import user_claims
from authsrv.tokens import token_hash


class UserInfoFlow:
    """
    C{claims} is an L{authsrv.flows.claims.ClaimsSource}. Only tokens meant
    for UserInfo are accepted: opaque ones, or JWTs whose audience names
    the issuer; a token for another resource server never reads the profile.
    """

    def __init__(self, *, store, identity, claims, issuer: str):
        self._issuer = issuer
        self._store = store
        self._identity = identity
        self._claims = claims

    async def userinfo(self, access_token: str, now: int) -> dict:
        """The UserInfo response for C{access_token}, or an RFC 6750 error."""
        access = await self._store.find_access_token(token_hash(access_token), now)
        if access is None:
            raise InvalidToken("the access token is unknown, expired or revoked")
        if not access.for_user:
            raise InvalidToken("the access token was issued to a client for itself (client_credentials): no user")
        if access.audience and self._issuer not in access.audience:
            raise InvalidToken("the access token is meant for another resource server, not UserInfo")
        if "openid" not in access.scope:
            raise InsufficientScope("UserInfo needs an access token with the scope openid")
        state = await standing(self._identity, self._store, access.sub, now, access.user_ban)
        if not state.allowed:
            raise InvalidToken("the access token is unknown, expired or revoked")
        return {"sub": access.sub, **user_claims(await self._claims.user(state.user), access.scope)}
