"""
RFC 9068 JWT access tokens, issued when the grant names a resource (RFC
8707): the resource server verifies them locally with the JWKS. Pure: the
claims only; the keystore signs them with typ C{at+jwt}.
"""

from __future__ import annotations

from authsrv.protocol.scope import scope_text

ACCESS_TOKEN_TYPE = "at+jwt"


def audience_claim(audience: tuple[str, ...]) -> str | list[str]:
    """C{aud} as RFC 7519 4.1.3 allows: a string for one audience, else a list."""
    return audience[0] if len(audience) == 1 else list(audience)


def access_token_claims(
    *,
    issuer: str,
    sub: str,
    client_id: str,
    audience: tuple[str, ...],
    scope: frozenset[str],
    auth_time: int | None,
    jti: str,
    now: int,
    ttl: int,
    jkt: str | None = None,
) -> dict:
    """
    The claims of RFC 9068 section 2.2, with RFC 9449's C{cnf} for a
    DPoP-bound token. C{auth_time} is when the user signed in (section
    2.2.1); None, and no such claim, for a client's token for itself;
    C{scope} only when there is one (section 2.2.3).
    """
    claims: dict = {
        "iss": issuer,
        "sub": sub,
        "aud": audience_claim(audience),
        "client_id": client_id,
        "iat": now,
        "exp": now + ttl,
        "jti": jti,
    }
    if scope:
        claims["scope"] = scope_text(scope)
    if auth_time is not None:
        claims["auth_time"] = auth_time
    if jkt is not None:
        claims["cnf"] = {"jkt": jkt}
    return claims
