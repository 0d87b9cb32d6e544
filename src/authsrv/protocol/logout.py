"""
RP-initiated logout parameters (OIDC RP-Initiated Logout 1.0, section 2).

The request names its client only through an ID token this server signed: a
forged hint, a token of another issuer or of no single client is a
L{PageError}, shown to the user and never redirected, so that the endpoint
cannot be turned into an open redirector.
"""

from __future__ import annotations

import re

from jwcrypto.common import JWException
from jwcrypto.jws import JWS

from authsrv.protocol import jsontext
from authsrv.protocol.errors import PageError
from authsrv.protocol.urls import with_query

TITLE = "Sign-out failed"
_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_ID_TOKEN_TYPES = ("jwt", "application/jwt")


def refused(message: str) -> PageError:
    return PageError(400, TITLE, message)


def hint_claims(hint: str, keyset, algorithms, issuer: str) -> dict:
    """
    The claims of an ID token signed with a key of C{keyset} for C{issuer}.
    Its expiry is not checked: a user ends a session long after the ID token
    expired, and the signature alone proves the token came from us.
    """
    if not _COMPACT_JWS.fullmatch(hint):
        raise refused("The sign-out request carries no valid ID token.")
    token = JWS()
    token.allowed_algs = list(algorithms)
    try:
        token.deserialize(hint)
        token.verify(keyset)
        header = token.jose_header
        claims = jsontext.loads(token.payload)
    except (JWException, ValueError):
        raise refused("The sign-out request carries an ID token this service did not issue.") from None
    typ = header.get("typ")
    if not isinstance(claims, dict) or (typ is not None and str(typ).lower() not in _ID_TOKEN_TYPES):
        raise refused("The sign-out request carries a token that is not an ID token.")
    if claims.get("iss") != issuer:
        raise refused("The sign-out request carries an ID token of another issuer.")
    if not isinstance(claims.get("sub"), str):
        raise refused("The sign-out request carries an ID token without a subject.")
    return claims


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
