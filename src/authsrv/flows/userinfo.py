"""
UserInfo (OIDC Core 5.3) with RFC 6750 bearer tokens and RFC 9449 DPoP-bound
ones: the claims the access token's scopes release about a user who may
still use the service. One indexed lookup of the token, which brings its
user's ban and linked chat account along and says whether a proof must
come with it, and the identity backend's record (docs/design.md, Speed
targets); the proof's single-use step only for a bound token. When the
server offers signed responses, a client that set
C{userinfo_signed_response_alg} gets them as a JWT (OIDC Core 5.3.2); only
then is the client looked up.
"""

from __future__ import annotations

from authsrv.flows.issue import client_alg
from authsrv.flows.standing import standing
from authsrv.protocol.bearer import BEARER, DPOP
from authsrv.protocol.dpop import Proof
from authsrv.protocol.errors import (
    DpopChallenge,
    InsufficientScope,
    InvalidDpopProof,
    InvalidToken,
    OAuthError,
    ServerError,
    UnauthorizedClient,
    UseDpopNonce,
)
from authsrv.protocol.oidc import user_claims
from authsrv.tokens import token_hash


class UserInfoFlow:
    """
    C{claims} is an L{authsrv.flows.claims.ClaimsSource}. Only tokens meant
    for UserInfo are accepted: opaque ones, or JWTs whose audience names
    the issuer; a token for another resource server never reads the profile.
    C{signer}, a L{UserInfoSigner}, only when signed responses are offered.
    """

    def __init__(self, *, store, identity, claims, issuer: str, signer=None, dpop=None):
        self._issuer = issuer
        self._url = issuer + "/oauth2/userinfo"
        self._dpop = dpop
        self._store = store
        self._identity = identity
        self._claims = claims
        self._signer = signer

    async def _check_proof(self, access_token: str, scheme: str, dpop: list[bytes] | None, method: str,
                           now: int) -> Proof:
        """A DPoP-bound token's proof (RFC 9449 section 7.1); a L{DpopChallenge} when it lacks one."""
        if scheme != DPOP:
            raise DpopChallenge(
                "invalid_token", "this access token is DPoP-bound: send it as Authorization: DPoP with a DPoP proof")
        if self._dpop is None:
            raise DpopChallenge("invalid_token", "DPoP is not offered here any more; get a new access token")
        if not dpop:
            raise DpopChallenge("invalid_dpop_proof", "a DPoP-bound access token needs a DPoP proof header")
        try:
            return await self._dpop.verify(dpop, method=method, url=self._url, now=now, access_token=access_token)
        except UseDpopNonce as e:
            raise DpopChallenge(e.error, e.description, e.nonce) from None
        except InvalidDpopProof as e:
            raise DpopChallenge(e.error, e.description) from None

    async def userinfo(
        self, access_token: str, now: int, *, scheme: str = BEARER, dpop: list[bytes] | None = None,
        method: str = "GET",
    ) -> dict | str:
        """
        The UserInfo response for C{access_token}, presented by C{scheme}
        (L{authsrv.protocol.bearer.access_credential}) with the request's
        DPoP header lines and C{method}: its claims, or their compact JWS
        when its client asks for one; or an RFC 6750 / RFC 9449 error.
        """
        access = await self._store.find_access_token(
            token_hash(access_token), now, link_provider=self._claims.link_provider
        )
        if access is None:
            raise _refusal(scheme == DPOP, InvalidToken("the access token is unknown, expired or revoked"))
        bound = access.jkt is not None
        if not access.for_user:
            raise _refusal(bound or scheme == DPOP, InvalidToken(
                "the access token was issued to a client for itself (client_credentials): no user"))
        if bound:
            proof = await self._check_proof(access_token, scheme, dpop, method, now)
            if proof.jkt != access.jkt:
                raise DpopChallenge(
                    "invalid_dpop_proof", "the DPoP proof is signed with another key than the token is bound to")
        elif scheme == DPOP:
            raise InvalidToken("this access token is not DPoP-bound: send it as Authorization: Bearer")
        if access.audience and self._issuer not in access.audience:
            raise _refusal(bound, InvalidToken("the access token is meant for another resource server, not UserInfo"))
        if "openid" not in access.scope:
            raise _refusal(bound, InsufficientScope("UserInfo needs an access token with the scope openid", "openid"))
        state = await standing(self._identity, self._store, access.sub, now, access.user_ban)
        if not state.allowed:
            raise _refusal(bound, InvalidToken("the access token is unknown, expired or revoked"))
        user = await self._claims.user(state.user, access.linked_user_id)
        claims = {"sub": access.sub, **user_claims(user, access.scope)}
        if self._signer is None:
            return claims
        return await self._signer.sign(access.client_id, claims)


def _refusal(dpop: bool, error: InvalidToken | InsufficientScope) -> OAuthError:
    """
    C{error} with the challenge its request calls for: a DPoP one when the
    token is DPoP-bound or came as C{Authorization: DPoP} (RFC 9449 section
    7.1), so that a DPoP client is never asked for a Bearer token.
    """
    return DpopChallenge.instead_of(error) if dpop else error


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
        try:
            alg = client_alg(self._keystore, client, "userinfo_signed_response_alg")
        except UnauthorizedClient as e:  # the server's own setting to mend; RFC 6750 has no error for it
            raise ServerError(e.description) from None
        return self._keystore.sign({"iss": self._issuer, "aud": client_id, **claims}, alg, "JWT")
