"""
UserInfo (OIDC Core 5.3) with RFC 6750 bearer tokens: the claims the access
token's scopes release about a user who may still use the service. One
indexed lookup of the token, which brings its user's ban along, and the
identity backend's record (docs/design.md, Speed targets). When the server
offers signed responses, a client that set C{userinfo_signed_response_alg}
gets them as a JWT (OIDC Core 5.3.2); only then is the client looked up.
"""

from __future__ import annotations

from authsrv.flows.issue import client_alg
from authsrv.flows.standing import standing
from authsrv.protocol.errors import InsufficientScope, InvalidToken
from authsrv.protocol.oidc import user_claims
from authsrv.tokens import token_hash


class UserInfoFlow:
    """
    C{claims} is an L{authsrv.flows.claims.ClaimsSource}. Only tokens meant
    for UserInfo are accepted: opaque ones, or JWTs whose audience names
    the issuer; a token for another resource server never reads the profile.
    C{signer}, a L{UserInfoSigner}, only when signed responses are offered.
    """

    def __init__(self, *, store, identity, claims, issuer: str, signer=None):
        self._issuer = issuer
        self._store = store
        self._identity = identity
        self._claims = claims
        self._signer = signer

    async def userinfo(self, access_token: str, now: int) -> dict | str:
        """
        The UserInfo response for C{access_token}: its claims, or their
        compact JWS when its client asks for one; or an RFC 6750 error.
        """
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
        claims = {"sub": access.sub, **user_claims(await self._claims.user(state.user), access.scope)}
        if self._signer is None:
            return claims
        return await self._signer.sign(access.client_id, claims)


class UserInfoSigner:
    """
    Signs UserInfo responses for the clients that asked (C{clients} answers
    C{get_client}): with C{iss} and C{aud} as OIDC Core 5.3.2 recommends.
    """

    def __init__(self, *, clients, keystore, issuer: str):
        self._clients = clients
        self._keystore = keystore
        self._issuer = issuer

    async def sign(self, client_id: str, claims: dict) -> dict | str:
        """C{claims} as the client C{client_id} asked for them: signed, or as they are."""
        client = await self._clients.get_client(client_id)
        if client is None or client.userinfo_signed_response_alg is None:
            return claims
        alg = client_alg(self._keystore, client, "userinfo_signed_response_alg")
        return self._keystore.sign({"iss": self._issuer, "aud": client_id, **claims}, alg, "JWT")
