"""
UserInfo (OIDC Core 5.3) with RFC 6750 bearer tokens and RFC 9449 DPoP-bound
ones: the claims the access token's scopes release about a user who may
still use the service. One indexed lookup of the token, which brings its
user's ban along and says whether a proof must come with it, and the
identity backend's record (docs/design.md, Speed targets); the proof's
single-use step only for a bound token.
"""

from __future__ import annotations

from authsrv.flows.standing import standing
from authsrv.protocol.bearer import BEARER, DPOP
from authsrv.protocol.dpop import Proof
from authsrv.protocol.errors import DpopChallenge, InsufficientScope, InvalidDpopProof, InvalidToken, UseDpopNonce
from authsrv.protocol.oidc import user_claims
from authsrv.tokens import token_hash


class UserInfoFlow:
    """
    C{claims} is an L{authsrv.flows.claims.ClaimsSource}. Only tokens meant
    for UserInfo are accepted: opaque ones, or JWTs whose audience names
    the issuer; a token for another resource server never reads the profile.
    """

    def __init__(self, *, store, identity, claims, issuer: str, dpop=None):
        self._issuer = issuer
        self._url = issuer + "/oauth2/userinfo"
        self._dpop = dpop
        self._store = store
        self._identity = identity
        self._claims = claims

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
    ) -> dict:
        """
        The UserInfo response for C{access_token}, presented by C{scheme}
        (L{authsrv.protocol.bearer.access_credential}) with the request's
        DPoP header lines and C{method}; or an RFC 6750 / RFC 9449 error.
        """
        access = await self._store.find_access_token(token_hash(access_token), now)
        if access is None:
            raise InvalidToken("the access token is unknown, expired or revoked")
        if access.jkt is not None:
            proof = await self._check_proof(access_token, scheme, dpop, method, now)
            if proof.jkt != access.jkt:
                raise DpopChallenge(
                    "invalid_dpop_proof", "the DPoP proof is signed with another key than the token is bound to")
        elif scheme == DPOP:
            raise InvalidToken("this access token is not DPoP-bound: send it as Authorization: Bearer")
        if access.audience and self._issuer not in access.audience:
            raise InvalidToken("the access token is meant for another resource server, not UserInfo")
        if "openid" not in access.scope:
            raise InsufficientScope("UserInfo needs an access token with the scope openid")
        state = await standing(self._identity, self._store, access.sub, now, access.user_ban)
        if not state.allowed:
            raise InvalidToken("the access token is unknown, expired or revoked")
        return {"sub": access.sub, **user_claims(await self._claims.user(state.user), access.scope)}
