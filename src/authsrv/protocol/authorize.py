"""
The authorization request (RFC 6749 section 4.1.1, RFC 7636, RFC 8707, OIDC
Core 3.1.2.1): its parameters validated in the order that decides whether
an error may go back to the client at all, what the user must do before a
code is issued, and where errors and codes are sent.

Pure: request arguments and records in, values or errors out.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from authsrv.protocol import pkce
from authsrv.protocol.clients import CLIENT_ID_MAX, redirect_uri_problem
from authsrv.protocol.discovery import SCOPES
from authsrv.protocol.dpop import is_thumbprint
from authsrv.protocol.errors import (
    ConsentRequired,
    InvalidRequest,
    InvalidScope,
    InvalidTarget,
    LoginRequired,
    OAuthError,
    PageError,
    RequestNotSupported,
    RequestUriNotSupported,
    UnauthorizedClient,
    UnsupportedResponseType,
)
from authsrv.protocol.oidc import requested_acr
from authsrv.protocol.params import page_params, single_param
from authsrv.protocol.scope import parse_scope
from authsrv.protocol.urls import with_query
from authsrv.records import AuthorizationRequest, BrowserSession, Client

_DESCRIPTION_JUNK = re.compile(r'[^\x20-\x21\x23-\x5b\x5d-\x7e]')
"""Characters outside what RFC 6749 section 4.1.2.1 allows in error_description."""
PROMPTS = frozenset({"none", "login", "consent"})
MAX_AGE_DIGITS = 10
UNSAFE_TITLE = "Sign-in cannot continue"
AUTHORIZE_PARAMS = frozenset(name.encode() for name in (
    "response_type", "client_id", "redirect_uri", "scope", "state", "code_challenge", "code_challenge_method",
    "nonce", "prompt", "max_age", "login_hint", "acr_values", "claims", "request", "request_uri",
    "response_mode", "dpop_jkt", "id_token_hint",
))
"""
The parameters an authorization request is read for (C{resource} apart,
as it may be repeated); any other is ignored unread, as RFC 6749 section
3.1 asks, even when repeated or not UTF-8.
"""


class AuthorizeError(Exception):
    """An error the client hears about by a redirect to its redirect URI."""

    def __init__(self, error: OAuthError, redirect_uri: str, state: str | None):
        super().__init__(error.description)
        self.error = error
        self.redirect_uri = redirect_uri
        self.state = state


def unsafe(message: str) -> PageError:
    """
    The client or redirect URI cannot be trusted, so the error is shown to
    the user and never sent anywhere (RFC 6749 section 4.1.2.1).
    """
    return PageError(400, UNSAFE_TITLE, message)


def unknown_client() -> PageError:
    """The client named is not (or no longer) registered: nowhere to send the user back to."""
    return unsafe("The application that sent you here is not known to this service.")


def one_param(args: dict[bytes, list[bytes]], name: bytes) -> str | None:
    """A parameter sent exactly once as sane UTF-8 text (L{single_param}), else None."""
    return single_param(args, name)[0]


def client_id_of(args: dict[bytes, list[bytes]]) -> str | None:
    """The client_id to look up, or L{PageError}; None when it is too long to be any client's."""
    client_id, problem = single_param(args, b"client_id")
    if client_id is None:
        raise unsafe(f"The application did not say who it is (client_id {problem}).")
    return client_id if len(client_id) <= CLIENT_ID_MAX else None


LOOPBACK_IP_HOSTS = {"127.0.0.1": "127.0.0.1", "::1": "[::1]"}
"""The loopback IP literals of RFC 8252 section 7.3 (not "localhost", which section 8.3 advises against)."""


def _without_loopback_port(uri: str) -> str | None:
    """
    C{uri} without its port when it is plain http on a loopback IP literal
    (127.0.0.1 or [::1]) with no user name; None for any other URI.
    """
    try:
        parts = urlsplit(uri)
        parts.port
    except ValueError:
        return None
    host = LOOPBACK_IP_HOSTS.get(parts.hostname or "")
    if parts.scheme != "http" or host is None or "@" in parts.netloc:
        return None
    return urlunsplit(parts._replace(netloc=host))


def registered_redirect(client: Client, redirect_uri: str) -> bool:
    """
    Whether C{redirect_uri} is one C{client} registered, compared exactly
    (RFC 9700 section 4.1.3), but for the port of a loopback IP redirect
    URI, which a native app takes from the system at the time of the
    request (RFC 8252 section 7.3: any port must be allowed there). A URI
    the registration rules refuse (L{redirect_uri_problem}) never is, even
    if a client holds it from before those rules or from an import.
    """
    if redirect_uri_problem(redirect_uri) is not None:
        return False
    if redirect_uri in client.redirect_uris:
        return True
    plain = _without_loopback_port(redirect_uri)
    return plain is not None and any(_without_loopback_port(uri) == plain for uri in client.redirect_uris)


def unregistered_redirect() -> PageError:
    """The redirect URI is not (or no longer) one the client registered: nowhere safe to send the user."""
    return unsafe("The application asked to return to an address it has not registered.")


def trusted_redirect(client: Client, args: dict[bytes, list[bytes]]) -> str:
    """The redirect URI, or L{PageError}: the URI must be one the client registered (L{registered_redirect})."""
    redirect_uri, problem = single_param(args, b"redirect_uri")
    if redirect_uri is None:
        raise unsafe(f"The application did not say where to return to (redirect_uri {problem}).")
    if not registered_redirect(client, redirect_uri):
        raise unregistered_redirect()
    return redirect_uri


def _resources(client: Client, args: dict[bytes, list[bytes]]) -> tuple[str, ...]:
    """RFC 8707: absolute URIs without fragment, each one the client may ask for."""
    resources: list[str] = []
    for raw in args.get(b"resource", ()):
        if not raw:
            continue
        try:
            resource = raw.decode("utf-8")
            parts = urlsplit(resource)
        except (UnicodeDecodeError, ValueError):
            raise InvalidTarget("resource must be an absolute URI") from None
        if not parts.scheme or "#" in resource:
            raise InvalidTarget("resource must be an absolute URI without a fragment")
        if resource not in client.resources:
            raise InvalidTarget("this client may not request that resource")
        if resource not in resources:
            resources.append(resource)
    return tuple(resources)


def _scope(params: dict[str, str]) -> tuple[str, ...]:
    """
    The known scope values requested; others are ignored, as OIDC Core
    3.1.2.1 asks (and node-oidc-provider does), so a client that also asks
    for a value this server does not offer (address, phone) still signs its
    user in. A request left with none of ours is invalid_scope.
    """
    scope = params.get("scope")
    if scope is None:
        raise InvalidRequest("parameter scope is required")
    requested = parse_scope(scope)
    known = tuple(s for s in SCOPES if s in requested)
    if not known:
        raise InvalidScope("scope has no value this server offers; use space-separated values of "
                           + ", ".join(SCOPES))
    return known


def _prompt(params: dict[str, str]) -> frozenset[str]:
    values = params.get("prompt", "").split()
    unknown = [v for v in values if v not in PROMPTS]
    if unknown:
        raise InvalidRequest("unsupported prompt value; use none, login or consent")
    prompt = frozenset(values)
    if "none" in prompt and len(prompt) > 1:
        raise InvalidRequest("prompt=none cannot be combined with another prompt value")
    return prompt


def _max_age(params: dict[str, str]) -> int | None:
    value = params.get("max_age")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > MAX_AGE_DIGITS:
        raise InvalidRequest("max_age must be a non-negative integer number of seconds")
    return int(value)


def _dpop_jkt(params: dict[str, str]) -> str | None:
    """RFC 9449 section 10: the thumbprint of the DPoP key the code is to be bound to."""
    value = params.get("dpop_jkt")
    if value is not None and not is_thumbprint(value):
        raise InvalidRequest("dpop_jkt must be the base64url SHA-256 JWK thumbprint of the DPoP key (43 characters)")
    return value


def _validate(client: Client, redirect_uri: str, params: dict[str, str], args) -> AuthorizationRequest:
    if "request" in params:
        raise RequestNotSupported("request objects are not supported; send the parameters in the query")
    if "request_uri" in params:
        raise RequestUriNotSupported("request_uri is not supported; send the parameters in the query")
    response_type = params.get("response_type")
    if response_type is None:
        raise InvalidRequest("parameter response_type is required")
    if response_type != "code":
        raise UnsupportedResponseType("only response_type=code is supported")
    if "authorization_code" not in client.grant_types:
        # RFC 6749 section 4.1.2.1: its code could never be redeemed (the token endpoint refuses the grant).
        raise UnauthorizedClient("this client is not registered for the authorization code grant (grant_types)")
    if params.get("response_mode", "query") != "query":
        raise InvalidRequest("only response_mode=query is supported")
    state = params.get("state")
    if state is None:
        raise InvalidRequest("parameter state is required")
    if params.get("code_challenge_method") != "S256":
        raise InvalidRequest("PKCE is required with code_challenge_method=S256 (plain is not supported)")
    challenge = params.get("code_challenge")
    if challenge is None or not pkce.valid_challenge(challenge):
        raise InvalidRequest("code_challenge must be the base64url SHA-256 of the verifier (43 characters)")
    return AuthorizationRequest(
        client_id=client.client_id,
        redirect_uri=redirect_uri,
        scope=_scope(params),
        state=state,
        code_challenge=challenge,
        nonce=params.get("nonce"),
        resources=_resources(client, args),
        prompt=_prompt(params),
        max_age=_max_age(params),
        login_hint=params.get("login_hint"),
        acr_values=requested_acr(params),
        dpop_jkt=_dpop_jkt(params),
    )


def parse_request(client: Client | None, args: dict[bytes, list[bytes]], *,
                  push_required: bool = False) -> AuthorizationRequest:
    """
    Validate raw request arguments for the client their client_id named;
    raises L{PageError} or L{AuthorizeError}. C{resource} may repeat (RFC
    8707); any other repeated parameter is invalid_request. Unknown
    parameters are ignored. C{push_required}: the client may only use
    pushed requests, so these plain parameters are refused once the
    redirect URI is known to be safe (RFC 9126 section 5).
    """
    if client is None:
        raise unknown_client()
    redirect_uri = trusted_redirect(client, args)
    try:
        params = page_params({k: v for k, v in args.items() if k in AUTHORIZE_PARAMS})
    except InvalidRequest as malformed:
        raise AuthorizeError(malformed, redirect_uri, one_param(args, b"state")) from None
    if push_required:
        pushed_only = InvalidRequest("this client must push its authorization requests first (RFC 9126) and send"
                                     " only client_id and request_uri here")
        raise AuthorizeError(pushed_only, redirect_uri, params.get("state"))
    try:
        return _validate(client, redirect_uri, params, args)
    except OAuthError as e:
        raise AuthorizeError(e, redirect_uri, params.get("state")) from None


def login_needed(request: AuthorizationRequest, session: BrowserSession | None, now: int) -> bool:
    """
    No live session, prompt=login, or an authentication older than max_age
    (OIDC Core 3.1.2.1: max_age=0 is equivalent to prompt=login).
    """
    if session is None or "login" in request.prompt:
        return True
    return request.max_age == 0 or max_age_passed(request, session, now)


def max_age_passed(request: AuthorizationRequest, session: BrowserSession, now: int) -> bool:
    """
    The session's authentication is older than the request's max_age: no
    code may carry its auth_time (OIDC Core 3.1.2.1), however long ago the
    request started, so a page left open past it leads to a sign-in again;
    only a sign-in after the request (after its consent page was made) meets
    max_age however long that page stayed open (L{authsrv.flows.interaction.InteractionFlow.submit_consent}).
    """
    return request.max_age is not None and now - session.auth_time > request.max_age


def consent_needed(client: Client, request: AuthorizationRequest, consented: frozenset | None) -> bool:
    """First-party clients never ask; others when prompted or the consent does not cover the scopes."""
    if client.first_party:
        return False
    return "consent" in request.prompt or consented is None or not set(request.scope) <= consented


def refuse_silently(request: AuthorizationRequest, *, login: bool, consent: bool) -> None:
    """prompt=none: the user must not be shown anything (OIDC Core 3.1.2.6)."""
    if "none" not in request.prompt:
        return
    if login:
        raise AuthorizeError(LoginRequired("the user must log in"), request.redirect_uri, request.state)
    if consent:
        raise AuthorizeError(ConsentRequired("the user must consent"), request.redirect_uri, request.state)


def error_location(issuer: str, redirect_uri: str, state: str | None, error: OAuthError) -> str:
    """
    Where an error is sent: RFC 6749 section 4.1.2.1 plus iss (RFC 9207).
    Descriptions are the server's own fixed text, never the request's; the
    few characters RFC 6749 forbids in them are dropped all the same.
    """
    params = {"error": error.error, "error_description": _DESCRIPTION_JUNK.sub("", error.description)}
    if state is not None:
        params["state"] = state
    params["iss"] = issuer
    return with_query(redirect_uri, params)


def code_location(issuer: str, request: AuthorizationRequest, code: str) -> str:
    """Where a code is sent: with state and iss (RFC 9207)."""
    return with_query(request.redirect_uri, {"code": code, "state": request.state, "iss": issuer})
