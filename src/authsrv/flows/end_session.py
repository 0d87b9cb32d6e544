"""
RP-initiated logout (OIDC RP-Initiated Logout 1.0).

The request names its client only through an ID token we signed: a forged
hint, an unknown or not end-session-enabled client, or an unregistered
post-logout redirect URI is answered with an error page, never a redirect,
so that the endpoint cannot be turned into an open redirector.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlencode, urlsplit, urlunsplit

from attrs import frozen
from jwcrypto.common import JWException
from jwcrypto.jws import JWS

from authsrv.records import Client

_COMPACT_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
_ID_TOKEN_TYPES = ("jwt", "application/jwt")


class LogoutRefused(Exception):
    """A logout request that is shown to the user as an error, never redirected."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@frozen
class Logout:
    """A validated request: its client and where the browser goes next (None: our page)."""

    client: Client
    location: str | None


def hint_claims(hint: str, keystore, issuer: str) -> dict:
    """
    The claims of an ID token we signed for C{issuer}. Its expiry is not
    checked: a user ends a session long after the ID token expired, and the
    signature alone proves the token came from us (RP-Initiated Logout 1.0
    section 2).
    """
    if not _COMPACT_JWS.fullmatch(hint):
        raise LogoutRefused("The sign-out request carries no valid ID token.")
    token = JWS()
    token.allowed_algs = list(keystore.algorithms)
    try:
        token.deserialize(hint)
        token.verify(keystore.public_keyset())
        header = token.jose_header
        claims = json.loads(token.payload)
    except (JWException, ValueError):
        raise LogoutRefused("The sign-out request carries an ID token this service did not issue.") from None
    typ = header.get("typ")
    if not isinstance(claims, dict) or (typ is not None and str(typ).lower() not in _ID_TOKEN_TYPES):
        raise LogoutRefused("The sign-out request carries a token that is not an ID token.")
    if claims.get("iss") != issuer:
        raise LogoutRefused("The sign-out request carries an ID token of another issuer.")
    if not isinstance(claims.get("sub"), str):
        raise LogoutRefused("The sign-out request carries an ID token without a subject.")
    return claims


def _audience(claims: dict) -> str:
    """The one client an ID token was issued to."""
    aud = claims.get("aud")
    if isinstance(aud, list) and len(aud) == 1:
        aud = aud[0]
    if not isinstance(aud, str):
        raise LogoutRefused("The sign-out request carries an ID token that names no single client.")
    return aud


def post_logout_location(uri: str, state: str | None) -> str:
    """The registered URI with C{state} added to whatever query it already has."""
    if state is None:
        return uri
    parts = urlsplit(uri)
    added = urlencode({"state": state})
    return urlunsplit(parts._replace(query=f"{parts.query}&{added}" if parts.query else added))


async def check_request(store, keystore, issuer: str, params: dict[str, str]) -> Logout:
    """Validate an end-session request; L{LogoutRefused} says what is wrong."""
    hint = params.get("id_token_hint")
    if hint is None:
        raise LogoutRefused("The sign-out request must carry id_token_hint.")
    claims = hint_claims(hint, keystore, issuer)
    client_id = _audience(claims)
    if params.get("client_id", client_id) != client_id:
        raise LogoutRefused("The client_id does not match the client the ID token was issued to.")
    client = await store.get_client(client_id)
    if client is None or not client.end_session_enabled:
        raise LogoutRefused("This application may not sign users out here.")
    uri = params.get("post_logout_redirect_uri")
    if uri is not None and uri not in client.post_logout_redirect_uris:
        raise LogoutRefused("The post_logout_redirect_uri is not registered for this application.")
    location = None if uri is None else post_logout_location(uri, params.get("state"))
    return Logout(client, location)
