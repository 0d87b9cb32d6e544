"""Small response helpers shared by every resource."""

from __future__ import annotations

from authsrv.compactjson import compact
from authsrv.protocol.dpop import ALGORITHMS
from authsrv.protocol.errors import DpopChallenge, InvalidBearerRequest

RETRY_AFTER = b"5"
"""Seconds a caller waits before it tries again when the store or an identity backend is unavailable."""


def allow_any_origin(request) -> None:
    request.setHeader(b"access-control-allow-origin", b"*")


def allow_browser_clients(request) -> None:
    """Any origin may read the answer, and the headers a browser-based client acts on."""
    allow_any_origin(request)
    request.setHeader(b"access-control-expose-headers", b"WWW-Authenticate, DPoP-Nonce, Retry-After")


def json_body(request, status: int, payload: dict, *, no_store: bool = False) -> bytes:
    """Set status and JSON headers; return the encoded body."""
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    if no_store:
        request.setHeader(b"cache-control", b"no-store")
        request.setHeader(b"pragma", b"no-cache")
    return compact(payload)


def bodiless_head(request, body: bytes) -> bytes:
    """
    C{body}, or for a HEAD request only its length: a leaf resource that
    returns a body to HEAD gets a warning logged by twisted.web with the
    whole request target, so any caller could write a query's code or
    token, and as many lines as it likes, into the log.
    """
    if request.method != b"HEAD":
        return body
    request.setHeader(b"content-length", str(len(body)).encode())
    return b""


def jwt_body(request, token: str) -> bytes:
    """A signed answer (OIDC Core 5.3.2): C{application/jwt}, never cached."""
    request.setResponseCode(200)
    request.setHeader(b"content-type", b"application/jwt")
    request.setHeader(b"cache-control", b"no-store")
    request.setHeader(b"pragma", b"no-cache")
    return token.encode("ascii")


def method_not_allowed(request, allow: bytes) -> bytes:
    request.setHeader(b"allow", allow)
    return json_body(
        request,
        405,
        {"error": "method_not_allowed", "error_description": f"use {allow.decode()}"},
    )


CHALLENGE_DESCRIPTION_LENGTH = 200
"""Characters of a description a challenge carries; the JSON body carries all of it."""


def challenge_description(text: str) -> str:
    """
    C{text} as a challenge's error_description, which RFC 6750 section 3
    (and RFC 9449 section 7.1) limits to printable ASCII without the quote
    and backslash that would end or escape it: a double quote becomes a
    single one, anything else outside it (a parameter name a client sent,
    say) a question mark, and a long text is cut short.
    """
    cut = text[:CHALLENGE_DESCRIPTION_LENGTH]
    kept = "".join(c if " " <= c <= "~" and c != "\\" else "?" for c in cut.replace('"', "'"))
    return kept if len(text) == len(cut) else kept + "..."


def _scope(error) -> str:
    """The challenge's scope parameter: the scope an insufficient_scope refusal names, else nothing."""
    scope = getattr(error, "scope", None)
    return "" if scope is None else f', scope="{scope}"'


def oauth_error(request, error) -> bytes:
    """
    An L{authsrv.protocol.errors.OAuthError} as RFC 6749 section 5.2 JSON,
    with the challenge RFC 6749 (invalid_client), RFC 6750 (bearer token
    errors; insufficient_scope names the scope needed) or RFC 9449 (a DPoP-bound request's errors, bearer
    ones included, and the server nonce a proof must carry) asks for, and no-store like every token
    endpoint answer.
    """
    description = challenge_description(error.description)
    if error.error == "invalid_client":
        request.setHeader(b"www-authenticate", b'Basic realm="authsrv"')
    elif isinstance(error, DpopChallenge):
        request.setHeader(
            b"www-authenticate",
            f'DPoP realm="authsrv", error="{error.error}", error_description="{description}"{_scope(error)},'
            f' algs="{" ".join(ALGORITHMS)}"'.encode(),
        )
    elif error.error in ("invalid_token", "insufficient_scope") or isinstance(error, InvalidBearerRequest):
        scope = _scope(error)
        request.setHeader(
            b"www-authenticate",
            f'Bearer realm="authsrv", error="{error.error}", error_description="{description}"{scope}'.encode(),
        )
    nonce = getattr(error, "nonce", None)
    if nonce is not None:
        request.setHeader(b"dpop-nonce", nonce.encode("ascii"))
    return json_body(request, error.status, error.body(), no_store=True)
