"""
UserInfo (OIDC Core 5.3) with RFC 6750 bearer tokens: the claims the access
token's scopes release about a user who may still use the service. One
indexed lookup of the token, which brings its user's ban along, and the
identity backend's record (DESIGN.md, Speed targets).
"""

from __future__ import annotations

import re

from authsrv.flows.standing import standing
from authsrv.protocol.errors import InsufficientScope, InvalidRequest, InvalidToken
from authsrv.protocol.oidc import user_claims
from authsrv.tokens import token_hash

_BEARER = re.compile(rb"[Bb][Ee][Aa][Rr][Ee][Rr] +([A-Za-z0-9\-._~+/]+=*) *")


def bearer_token(authorization: bytes | None, form_token: str | None) -> str:
    """
    The access token of a request: from C{Authorization: Bearer} (RFC 6750
    2.1) or the form body's C{access_token} (2.2), never both; L{InvalidToken}
    when there is none or the header is not a bearer credential.
    """
    if authorization is not None and form_token is not None:
        raise InvalidRequest("send the access token once: in the Authorization header or in the body")
    if form_token is not None:
        return form_token
    if authorization is None:
        raise InvalidToken("an access token is required: send Authorization: Bearer <token>")
    match = _BEARER.fullmatch(authorization)
    if match is None:
        raise InvalidToken("the Authorization header must carry a Bearer token")
    return match.group(1).decode("ascii")


async def userinfo(server, access_token: str, now: int) -> dict:
    """The UserInfo response for C{access_token}, or an RFC 6750 error."""
    access = await server.store.find_access_token(token_hash(access_token), now)
    if access is None:
        raise InvalidToken("the access token is unknown, expired or revoked")
    if "openid" not in access.scope:
        raise InsufficientScope("UserInfo needs an access token with the scope openid")
    state = await standing(server.identity, server.store, access.sub, now, access.user_ban)
    if not state.allowed:
        raise InvalidToken("the access token is unknown, expired or revoked")
    return {"sub": access.sub, **user_claims(await server.claims_user(state.user), access.scope)}
