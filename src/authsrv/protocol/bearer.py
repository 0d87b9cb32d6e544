"""Access tokens in requests: Bearer (RFC 6750 section 2) and DPoP (RFC 9449 section 7.1)."""

from __future__ import annotations

import re

from authsrv.protocol.errors import InvalidBearerRequest, InvalidToken

_CREDENTIAL = re.compile(rb"([Bb][Ee][Aa][Rr][Ee][Rr]|[Dd][Pp][Oo][Pp]) +([A-Za-z0-9\-._~+/]+=*) *")
BEARER = "Bearer"
DPOP = "DPoP"
FORM = "form"


def access_credential(authorization: bytes | None, form_token: str | None) -> tuple[str, str]:
    """
    How a request presents its access token (L{BEARER}, L{DPOP} or L{FORM})
    and the token: from C{Authorization: Bearer} (RFC 6750 2.1) or C{DPoP},
    or the form body's C{access_token} (2.2), never both; L{InvalidToken}
    when there is none or the header is neither credential.
    """
    if authorization is not None and form_token is not None:
        raise InvalidBearerRequest("send the access token once: in the Authorization header or in the body")
    if form_token is not None:
        return FORM, form_token
    if authorization is None:
        raise InvalidToken("an access token is required: send Authorization: Bearer <token>")
    match = _CREDENTIAL.fullmatch(authorization)
    if match is None:
        raise InvalidToken("the Authorization header must carry a Bearer or DPoP access token")
    scheme = DPOP if match.group(1).lower() == b"dpop" else BEARER
    return scheme, match.group(2).decode("ascii")
