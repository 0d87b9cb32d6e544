"""
OpenID Connect Core claims: what the ID token and UserInfo say about a user
for a set of scopes (docs/design.md, UserInfo fields), and at_hash (OIDC Core
3.1.3.6). Pure: values in, values out.
"""

from __future__ import annotations

import base64
import hashlib

from authsrv.records import User

ID_TOKEN_TYPE = "JWT"

_HASHES = {"RS256": hashlib.sha256, "ES256": hashlib.sha256, "EdDSA": hashlib.sha512}
"""The hash of each signing algorithm, for at_hash (EdDSA with Ed25519: SHA-512)."""


def at_hash(access_token: str, alg: str = "RS256") -> str:
    """The left half of the access token's hash under C{alg}'s hash, base64url."""
    digest = _HASHES[alg](access_token.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest[: len(digest) // 2]).rstrip(b"=").decode("ascii")


def user_claims(user: User, scope: frozenset[str]) -> dict:
    """
    The claims C{scope} releases about C{user}, without C{sub}: UserInfo and
    the ID token say the same. chat_user_id is not tied to a scope (docs/design.md).
    """
    claims: dict = {}
    if "profile" in scope:
        if user.name is not None:
            claims["name"] = user.name
        if user.picture is not None:
            claims["picture"] = user.picture
    if "email" in scope and user.email is not None:
        claims["email"] = user.email
        claims["email_verified"] = user.email_verified
    if user.chat_user_id is not None:
        claims["chat_user_id"] = user.chat_user_id
    return claims


def id_token_claims(
    *,
    issuer: str,
    client_id: str,
    user: User,
    scope: frozenset[str],
    auth_time: int,
    sid: str | None,
    nonce: str | None,
    access_token: str,
    now: int,
    ttl: int,
    alg: str = "RS256",
) -> dict:
    """An ID token's claims (OIDC Core 2 and 3.1.3.6); C{nonce} only when sent at authorize."""
    claims = {
        "iss": issuer,
        "sub": user.sub,
        "aud": client_id,
        "exp": now + ttl,
        "iat": now,
        "auth_time": auth_time,
        "at_hash": at_hash(access_token, alg),
    }
    if nonce is not None:
        claims["nonce"] = nonce
    if sid is not None:
        claims["sid"] = sid
    claims.update(user_claims(user, scope))
    return claims

