"""
OpenID Connect Core claims: what the ID token and UserInfo say about a user
for a set of scopes (docs/design.md, UserInfo fields), at_hash (OIDC Core
3.1.3.6), and the authentication context a client asks for (acr_values
and the claims request's acr, OIDC Core 3.1.2.1 and 5.5.1.1) and the ID
token reports (amr, RFC 8176; acr). Pure: values in, values out.
"""

from __future__ import annotations

import base64

from authsrv.protocol import jsontext
from authsrv.protocol.errors import InvalidRequest
from authsrv.protocol.signing import HASHES
from authsrv.records import ACR_MFA, ACR_PWD, User

ACR_VALUES = (ACR_PWD, ACR_MFA)
"""The authentication context classes this server signs users in at, weakest first."""
ID_TOKEN_TYPE = "JWT"



def with_second_factor(first: tuple[str, ...], method: str) -> tuple[str, ...]:
    """RFC 8176 methods of a sign-in whose first factor gave C{first} and whose second was C{method}."""
    return tuple(dict.fromkeys((*first, method, "mfa")))


def at_hash(access_token: str, alg: str = "RS256") -> str:
    """The left half of the access token's hash under C{alg}'s hash, base64url."""
    digest = HASHES[alg](access_token.encode("ascii")).digest()
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


def requested_acr(params: dict[str, str]) -> tuple[str, ...]:
    """
    The context classes a request asks for, from C{acr_values} and the
    C{claims} request's C{id_token.acr} (its C{value} or C{values}), in
    order, each once; unknown ones are kept for the caller to ignore. A
    C{claims} parameter that is no JSON object is invalid_request.
    """
    values = params.get("acr_values", "").split()
    claims_text = params.get("claims")
    if claims_text is not None:
        acr = _claims_request(claims_text).get("id_token", {}).get("acr")
        if acr is not None:
            asked = acr.get("values", [acr.get("value")])
            values += [v for v in asked if isinstance(v, str)] if isinstance(asked, list) else []
    return tuple(dict.fromkeys(values))


def _claims_request(text: str) -> dict:
    """
    A C{claims} parameter checked against OIDC Core 5.5: a JSON object whose
    C{userinfo} and C{id_token} members are objects, each claim in them null
    or an object (5.5.1); anything else is invalid_request, so a client's
    mistake is told rather than its request silently ignored.
    """
    try:
        claims = jsontext.loads(text)
    except jsontext.NotJSONText as e:
        raise InvalidRequest(f"claims must be a JSON object: {e}") from None
    if not isinstance(claims, dict):
        raise InvalidRequest("claims must be a JSON object")
    for member in ("userinfo", "id_token"):
        requested = claims.get(member, {})
        if not isinstance(requested, dict):
            raise InvalidRequest(f"claims.{member} must be a JSON object of the claims requested")
        for request in requested.values():
            if request is not None and not isinstance(request, dict):
                # Not named: the description goes back to the client's redirect URI, with no text of the request's.
                raise InvalidRequest(f"each claim in claims.{member} must be null or a JSON object (OIDC Core 5.5.1)")
    return claims


def mfa_requested(acr_values: tuple[str, ...]) -> bool:
    """Whether a request asks for a second factor (the MFA class among those it accepts, as the only known one)."""
    known = [value for value in acr_values if value in ACR_VALUES]
    return bool(known) and all(value == ACR_MFA for value in known)


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
    amr: tuple[str, ...] = (),
    acr: str | None = None,
) -> dict:
    """
    An ID token's claims (OIDC Core 2 and 3.1.3.6); C{nonce} only when sent
    at authorize; C{amr} and C{acr} say how the user signed in.
    """
    claims = {
        "iss": issuer,
        "sub": user.sub,
        "aud": client_id,
        "exp": now + ttl,
        "iat": now,
        "auth_time": auth_time,
        "at_hash": at_hash(access_token, alg),
    }
    if amr:
        claims["amr"] = list(amr)
    if acr is not None:
        claims["acr"] = acr
    if nonce is not None:
        claims["nonce"] = nonce
    if sid is not None:
        claims["sid"] = sid
    claims.update(user_claims(user, scope))
    return claims

