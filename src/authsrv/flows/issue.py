"""
Minting the tokens of a grant, in one place for every grant type: an opaque
access token or an RFC 9068 JWT when it has an audience, a refresh token
when asked for, an ID token when the scope has openid. The grant handlers
decide what to mint and store it; nothing here touches the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attrs import frozen
from twisted.internet.defer import Deferred

from authsrv import events
from authsrv.protocol.errors import UnauthorizedClient
from authsrv.protocol.jwt_access import ACCESS_TOKEN_TYPE, access_token_claims
from authsrv.protocol.oidc import ID_TOKEN_TYPE, id_token_claims
from authsrv.protocol.scope import scope_text
from authsrv.records import AccessToken, Client, Grant, RefreshToken, User
from authsrv.tokens import fingerprint, new_token, token_hash


def client_alg(keystore, client: Client, setting: str) -> str:
    """
    The algorithm C{client}'s C{setting} chose: checked when it was set,
    but refused here if the keystore has stopped offering it since.
    """
    alg = getattr(client, setting)
    if alg not in keystore.algorithms:
        raise UnauthorizedClient(
            f"this client's {setting} is {alg}, which the server no longer offers;"
            " the operator must change the client or offer it again"
        )
    return alg


@frozen
class Issued:
    """A token response and the records that make its tokens live."""

    response: dict
    access: AccessToken
    refresh: RefreshToken | None


REPLAYED_CLAIMS, REPLAYED_ALG = "id_token_claims", "id_token_alg"
"""Where a sealed replay keeps the ID token to sign again (L{Minted.replayable}, L{TokenMinter.replayed})."""
REPLAYED_EXPIRY = "access_token_expires_at"
"""Where a sealed replay keeps when its access token expires, to count expires_in from the replay's time."""


@frozen
class Minted:
    """
    Tokens of a grant made, their records ready to store, the ID token
    (where the scope asks for one) as C{id_token}'s claims and algorithm,
    not yet signed: the signature, the largest cost of a token request,
    can then go on while the store writes the records (L{signed_beside}).
    """

    issued: Issued
    id_token: tuple[dict, str] | None
    sign: Callable[[dict, str], str]

    def signed(self) -> Issued:
        """The tokens with the ID token signed into the response; call it once."""
        if self.id_token is not None:
            self.issued.response["id_token"] = self.sign(*self.id_token)
        return self.issued

    def replayable(self) -> dict:
        """
        The response as a refresh's replay seals it: the ID token as its
        claims, so that the rotation need not wait for the signature; a
        replay signs them again (L{TokenMinter.replayed}), to the very same
        token under RS256, whose signatures depend on nothing else. The
        access token's expiry goes with it, so that a replay's expires_in
        is what is left of its lifetime, not all of it.
        """
        sealed = {**self.issued.response, REPLAYED_EXPIRY: self.issued.access.expires_at}
        if self.id_token is None:
            return sealed
        claims, alg = self.id_token
        return {**sealed, REPLAYED_CLAIMS: claims, REPLAYED_ALG: alg}


async def signed_beside(minted: Minted, writing: Deferred) -> tuple[Issued, Any]:
    """
    C{minted} signed while C{writing}, the store's write of its records, is
    under way, and then the write's outcome: a PostgreSQL server (or a
    store thread on a spare core) commits beside the signature instead of
    after it. Should the signature fail, the write's outcome is dropped
    with the request.
    """
    try:
        issued = minted.signed()
    except BaseException:
        writing.addErrback(lambda _: None)
        raise
    return issued, await writing


class TokenMinter:
    """C{limits} gives the token lifetimes; C{keystore} signs."""

    def __init__(self, *, keystore, issuer: str, limits):
        self._keystore = keystore
        self._issuer = issuer
        self._limits = limits

    def mint(
        self, grant: Grant, client: Client, user: User, *,
        scope: frozenset[str], audience: tuple[str, ...], nonce: str | None,
        refresh_scope: frozenset[str] | None, now: int,
        jkt: str | None = None, refresh_jkt: str | None = None,
    ) -> Minted:
        """
        New tokens of C{grant}, the ID token still to sign (L{Minted}); a
        refresh token of C{refresh_scope} unless None, living the idle time
        but never past the grant's absolute end. C{jkt} binds the access
        token to a DPoP key, C{refresh_jkt} the refresh token (RFC 9449
        sections 6 and 5).
        """
        limits = self._limits
        client_id = client.client_id
        access_value, access = self._access(grant, client, grant.sub, scope, audience, now, jkt)
        response = self._response(access_value, access, jkt)
        refresh_token = None
        if refresh_scope is not None:
            refresh_value = new_token()
            refresh_token = RefreshToken(
                token_hash=token_hash(refresh_value), grant_id=grant.grant_id, client_id=client_id, sub=grant.sub,
                scope=refresh_scope, issued_at=now,
                expires_at=min(now + limits.refresh_token_idle_ttl, grant.expires_at), jkt=refresh_jkt,
            )
            response["refresh_token"] = refresh_value
        issued = Issued(response, access, refresh_token)
        if "openid" not in scope:
            return Minted(issued, None, self._sign_id_token)
        id_alg = client_alg(self._keystore, client, "id_token_signed_response_alg")
        claims = id_token_claims(
            issuer=self._issuer, client_id=client_id, user=user, scope=scope, auth_time=grant.auth_time,
            sid=grant.sid, nonce=nonce, access_token=access_value, now=now, ttl=limits.id_token_ttl,
            alg=id_alg, amr=grant.amr, acr=grant.acr,
        )
        return Minted(issued, (claims, id_alg), self._sign_id_token)

    def _sign_id_token(self, claims: dict, alg: str) -> str:
        return self._keystore.sign(claims, alg=alg, typ=ID_TOKEN_TYPE)

    def replayed(self, sealed: dict, now: int) -> dict:
        """
        The response a replay had sealed (L{Minted.replayable}), its ID
        token signed again and its expires_in counted to C{now} (RFC 6749
        section 5.1: the access token's lifetime, which the grace window
        has partly spent); one sealed whole, ID token included, as replays
        were before, is answered as it is.
        """
        response = dict(sealed)
        expires_at = response.pop(REPLAYED_EXPIRY, None)
        if isinstance(expires_at, int):
            response["expires_in"] = max(0, expires_at - now)
        claims, alg = response.pop(REPLAYED_CLAIMS, None), response.pop(REPLAYED_ALG, None)
        if claims is not None:
            response["id_token"] = self._sign_id_token(claims, alg)
        return response

    def mint_for_client(self, grant: Grant, client: Client, *, scope: frozenset[str], audience: tuple[str, ...],
                        now: int, jkt: str | None = None) -> Issued:
        """
        The one access token of a client's grant for itself
        (client_credentials): a JWT names the client as its subject (RFC
        9068 section 2.2); no refresh token, no ID token.
        """
        access_value, access = self._access(grant, client, client.client_id, scope, audience, now, jkt,
                                            for_user=False)
        return Issued(self._response(access_value, access, jkt), access, None)

    def _access(self, grant: Grant, client: Client, sub: str, scope: frozenset[str], audience: tuple[str, ...],
                now: int, jkt: str | None = None, for_user: bool = True) -> tuple[str, AccessToken]:
        """
        An opaque access token, or an RFC 9068 JWT (signed as the client
        chose) when it has an audience, and its record; C{jkt} binds it to
        a DPoP key. It ends with its grant at the latest: a refresh near the
        grant's absolute end must not buy an hour past it. A JWT carries
        the user's auth_time unless it is a client's token for itself
        (C{for_user} false), where no one signed in.
        """
        client_id = client.client_id
        ttl = min(self._limits.access_token_ttl, grant.expires_at - now)
        jti = None
        if audience:
            jti = new_token(16)
            claims = access_token_claims(
                issuer=self._issuer, sub=sub, client_id=client_id, audience=audience, scope=scope,
                auth_time=grant.auth_time if for_user else None, jti=jti, now=now, ttl=ttl, jkt=jkt,
            )
            access_alg = client_alg(self._keystore, client, "access_token_signed_response_alg")
            value = self._keystore.sign(claims, alg=access_alg, typ=ACCESS_TOKEN_TYPE)
        else:
            value = new_token()
        access = AccessToken(
            token_hash=token_hash(value), grant_id=grant.grant_id, client_id=client_id, sub=grant.sub,
            scope=scope, audience=audience, jti=jti, issued_at=now, expires_at=now + ttl, jkt=jkt,
        )
        return value, access

    @staticmethod
    def _response(access_value: str, access: AccessToken, jkt: str | None = None) -> dict:
        response = {
            "access_token": access_value,
            "token_type": "Bearer" if jkt is None else "DPoP",
            "expires_in": access.expires_at - access.issued_at,
        }
        if access.scope:  # a client's token for itself may have none, and "" is no scope (RFC 6749 section 3.3)
            response["scope"] = scope_text(access.scope)
        return response


def issued_event(issued: Issued, client_id: str, grant_type: str, address: str | None) -> None:
    """C{address}: the caller's, as the token endpoint found it."""
    events.token_issued(
        sub=issued.access.sub, client_id=client_id, grant_id=issued.access.grant_id, grant_type=grant_type,
        token_fp=fingerprint(issued.response["access_token"]), address=address,
    )
