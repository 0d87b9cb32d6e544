"""
RP-initiated logout parameters (OIDC RP-Initiated Logout 1.0, section 2).

The request names its client only through an ID token this server signed: a
forged hint, a token of another issuer or of no single client is a
L{PageError}, shown to the user and never redirected, so that the endpoint
cannot be turned into an open redirector.
"""

from __future__ import annotations

import re
from typing import Callable

from jwcrypto.common import JWException, base64url_decode
from jwcrypto.jwk import JWK
from jwcrypto.jws import JWS

from authsrv.protocol import jsontext
from authsrv.protocol.client_assertion import is_numeric_date
from authsrv.protocol.errors import PageError
from authsrv.protocol.urls import with_query

TITLE = "Sign-out failed"
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_ID_TOKEN_TYPES = ("jwt", "application/jwt")


def refused(message: str) -> PageError:
    return PageError(400, TITLE, message)


def hint_claims(hint: str, hint_key: Callable[[str], JWK | None], issuer: str) -> dict:
    """
    The claims of an ID token for C{issuer} signed with the key its C{kid}
    names, as C{hint_key} (the keystore's) gives it, with that key's one
    algorithm. Its expiry is not checked: a user ends a session long after
    the ID token expired, and the signature alone proves the token came
    from us. But it must be an ID token: the other tokens we sign differ in
    typ (C{at+jwt}, C{logout+jwt}), or, for a signed UserInfo answer, in
    having no C{iat} and C{exp} (OIDC Core sections 2 and 5.3.2).
    """
    if not _COMPACT_JWS.fullmatch(hint):
        raise refused("The sign-out request carries no valid ID token.")
    kid = _kid(hint)
    key = None if kid is None else hint_key(kid)
    token = JWS()
    try:
        if key is None:
            raise ValueError("no key of ours has this kid")
        token.allowed_algs = [key.get("alg")]
        token.deserialize(hint)
        token.verify(key)
        header = token.jose_header
        claims = jsontext.loads(token.payload)
    except (JWException, ValueError):
        raise refused("The sign-out request carries an ID token this service did not issue.") from None
    typ = header.get("typ")
    if (not isinstance(claims, dict) or (typ is not None and str(typ).lower() not in _ID_TOKEN_TYPES)
            or not all(is_numeric_date(claims.get(name)) for name in ("iat", "exp"))):
        raise refused("The sign-out request carries a token that is not an ID token.")
    if claims.get("iss") != issuer:
        raise refused("The sign-out request carries an ID token of another issuer.")
    if not isinstance(claims.get("sub"), str):
        raise refused("The sign-out request carries an ID token without a subject.")
    return claims


def _kid(hint: str) -> str | None:
    """
    The C{kid} of a compact JWS's protected header, read before verifying
    only to pick the one key to verify with.
    """
    try:
        header = jsontext.loads(base64url_decode(hint.split(".", 1)[0]))
    except ValueError:
        return None
    kid = header.get("kid") if isinstance(header, dict) else None
    return kid if isinstance(kid, str) else None


def hint_audience(claims: dict) -> str:
    """The one client an ID token was issued to."""
    aud = claims.get("aud")
    if isinstance(aud, list) and len(aud) == 1:
        aud = aud[0]
    if not isinstance(aud, str):
        raise refused("The sign-out request carries an ID token that names no single client.")
    return aud


def post_logout_location(uri: str, state: str | None) -> str:
    """The registered URI with C{state} added to whatever query it already has."""
    return with_query(uri, {} if state is None else {"state": state})
