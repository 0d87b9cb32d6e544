"""Bearer access tokens in requests (RFC 6750 section 2)."""

from __future__ import annotations

import re

from authsrv.protocol.errors import InvalidRequest, InvalidToken

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
