"""
Reading request parameters for the flows: back-channel forms strictly,
browser forms leniently (a broken form is the flow's expired-form page).
"""

from __future__ import annotations

from authsrv.protocol.errors import InvalidBearerRequest, InvalidRequest
from authsrv.protocol.forwarded import client_address, unmapped
from authsrv.protocol.params import one_resource_params, params_with_token, single_params
from authsrv.web.request import parse_query

FORM = b"application/x-www-form-urlencoded"


def is_form(request) -> bool:
    content_type = request.getHeader(b"content-type") or b""
    return content_type.split(b";", 1)[0].strip().lower() == FORM


def form_args(request) -> dict[bytes, list[bytes]]:
    """
    The raw fields of a back-channel POST, from a form body only: a query
    string would leave credentials and tokens in logs (OAuth 2.1 section 3.2).
    """
    if not is_form(request):
        raise InvalidRequest("send the parameters as an application/x-www-form-urlencoded body")
    if b"?" in request.uri:
        raise InvalidRequest("send the parameters in the request body, not in the query string")
    return request.args


TOKEN_RESOURCES = ("a token is issued for one resource: send one per token request, or leave resource out"
                   " (a user's tokens are then for every resource granted)")
DEVICE_RESOURCES = "a device may ask for one resource"


BACK_CHANNEL_PARAMS = frozenset(name.encode() for name in (
    "grant_type", "code", "redirect_uri", "code_verifier", "refresh_token", "device_code", "scope", "resource",
    "client_id", "client_secret", "client_assertion", "client_assertion_type",
))
"""The parameters the token and device authorization endpoints read."""


def one_resource_form(request, several: str) -> dict[str, str]:
    """
    The parameters (L{form_args}) of the token or the device authorization
    endpoint, which take one C{resource}. A parameter neither reads is
    ignored even when repeated, too long or not UTF-8 text, as RFC 6749
    section 3.2 asks; it is set aside only once the form is found wanting,
    so a well-formed request costs no more.
    """
    args = form_args(request)
    try:
        return one_resource_params(args, several)
    except InvalidRequest:
        read = {name: values for name, values in args.items() if name in BACK_CHANNEL_PARAMS}
        if len(read) == len(args):
            raise
        return one_resource_params(read, several)


def token_form_params(request) -> dict[str, str]:
    """
    The parameters (L{form_args}) of introspection and revocation, whose
    C{token} any text may be (L{params_with_token}).
    """
    return params_with_token(form_args(request), b"token")


def page_form(request) -> dict[str, str] | None:
    """A browser form's fields, or None when they cannot be read (repeated, not UTF-8, too long)."""
    try:
        return single_params(request.args)
    except InvalidRequest:
        return None


def credentials_form(request, *names: bytes, errors: str = "surrogateescape") -> dict[str, str] | None:
    """
    L{page_form}, except the credentials C{names}, read as sent
    (L{params_with_token}; bytes that are not UTF-8 as lone surrogates, or
    as C{errors} says): one no user can have is the form's to explain, not
    an expired form.
    """
    try:
        return params_with_token(request.args, *names, errors=errors)
    except InvalidRequest:
        return None


def sign_in_form(request) -> dict[str, str] | None:
    """L{credentials_form} of the sign-in form."""
    return credentials_form(request, b"username", b"password")


def code_form(request) -> dict[str, str] | None:
    """
    L{credentials_form} of a form with a second factor's C{code}: one that
    cannot be a code (bytes that are not UTF-8 read as U+FFFD) is a wrong code.
    """
    return credentials_form(request, b"code", errors="replace")


def passkey_answer_form(request) -> dict[str, str] | None:
    """
    L{credentials_form} of a form with a passkey's C{credential}, which the
    passkeys cap themselves (L{authsrv.flows.passkeys.MAX_CREDENTIAL_JSON},
    over a form field's cap): one they cannot read is not accepted.
    """
    return credentials_form(request, b"credential", errors="replace")


def password_change_form(request) -> dict[str, str] | None:
    """L{credentials_form} of the account page's password change."""
    return credentials_form(request, b"current_password", b"new_password", b"new_password_again")


def userinfo_form_token(request) -> str | None:
    """
    The access token of a UserInfo form body (RFC 6750 section 2.2); one in
    the URL is refused, since URLs end up in logs (section 2.3).
    """
    query = request.uri.partition(b"?")[2]
    if query and b"access_token" in parse_query(query):
        raise InvalidBearerRequest("send the access token in the Authorization header, not in the URL")
    if request.method == b"POST" and is_form(request):
        try:
            return params_with_token(request.args, b"access_token").get("access_token")
        except InvalidRequest as e:
            raise InvalidBearerRequest(e.description) from None
    return None


def client_address_of(request, trusted_proxies) -> str:
    """
    The client's address: the TCP peer, or behind trusted proxies the
    rightmost untrusted hop of Forwarded or X-Forwarded-For (docs/design.md,
    Client addresses). Throttling, events and limits all use this one.
    """
    peer = unmapped(getattr(request.getClientAddress(), "host", None) or "unknown")
    if not trusted_proxies:
        return peer  # no proxy is trusted: the headers say nothing (client_address), and go unread
    headers = request.requestHeaders
    return client_address(
        peer, trusted_proxies,
        [v.decode("latin-1") for v in headers.getRawHeaders(b"forwarded", [])],
        [v.decode("latin-1") for v in headers.getRawHeaders(b"x-forwarded-for", [])],
    )
