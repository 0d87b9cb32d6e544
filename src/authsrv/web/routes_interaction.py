"""
The user-facing front of the code flow: authorize, login and consent.
Routes read the request and render; L{authsrv.flows} decides.
"""

from __future__ import annotations

from urllib.parse import urlencode

from authsrv import events
from authsrv.config import ISSUER_PATH
from authsrv.flows.authorize import (
    AuthorizeError,
    UnsafeRedirect,
    consent_needed,
    error_location,
    issue_code,
    login_needed,
    read_request,
    refuse_silently,
)
from authsrv.flows.csrf import form_token_valid, valid_device_secret
from authsrv.flows.interaction import (
    LoggedIn,
    Refused,
    Throttled,
    claim,
    hold,
    load_pending,
    log_in,
    remember_consent,
)
from authsrv.flows.sessions import end_browser_session, live_session, start_session
from authsrv.protocol.errors import AccessDenied, InvalidRequest
from authsrv.protocol.params import single_params
from authsrv.tokens import new_token
from authsrv.web import interaction_pages as text
from authsrv.web.cookies import DEVICE_COOKIE, SESSION_COOKIE
from authsrv.web.interaction_pages import consent_page, login_page
from authsrv.web.pages import error_page
from authsrv.web.routing import app

DEVICE_COOKIE_TTL = 400 * 86400
"""The longest cookie life browsers keep; the device cookie only binds forms to this browser."""

def _route(path: str, *methods: str):
    """
    Register on the shared app under an endpoint name of this module: Klein
    keys handlers by endpoint, which defaults to the bare function name that
    another route module could also use.
    """

    def register(handler):
        endpoint = f"{__name__}.{handler.__name__}"
        return app.route(ISSUER_PATH + path, methods=list(methods), endpoint=endpoint)(handler)

    return register


def _redirect(request, status: int, location: str) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"location", location.encode())
    request.setHeader(b"cache-control", b"no-store")
    return b""


def _address(request) -> str:
    return getattr(request.getClientAddress(), "host", None) or "unknown"


def _device_secret(server, request) -> str:
    """This browser's device cookie, set now if it has none (or a forged one)."""
    value = server.cookies.get(request, DEVICE_COOKIE)
    if not valid_device_secret(value):
        value = new_token()
        server.cookies.set(request, DEVICE_COOKIE, value, DEVICE_COOKIE_TTL)
    return value


def _form(request) -> dict[str, str] | None:
    try:
        return single_params(request.args)
    except InvalidRequest:
        return None


async def _continue(server, request, client, authz, session, status: int) -> bytes:
    """After login (or with a live session): the consent page or the code."""
    now = server.now()
    consented = None if client.first_party else await server.store.get_consent(session.sub, client.client_id)
    needed = consent_needed(client, authz, consented)
    refuse_silently(authz, login=False, consent=needed)
    if needed:
        pending = await hold(server.store, server.limits, authz, _device_secret(server, request), now,
                             sid=session.sid)
        return _redirect(request, 303, f"{server.issuer}/consent?{urlencode({'request': pending.request_id})}")
    location = await issue_code(server.store, server.limits, server.issuer, authz, session, now)
    return _redirect(request, status, location)


@_route("/oauth2/authorize", "GET", "POST")
async def authorize(server, request):
    """RFC 6749 section 4.1.1 (GET, and POST as OIDC Core 3.1.2.1 allows)."""
    now = server.now()
    try:
        client, authz = await read_request(server.clients, request.args)
        cookie = server.cookies.get(request, SESSION_COOKIE)
        session = await live_session(server.store, server.identity, cookie, now)
        if login_needed(authz, session, now):
            refuse_silently(authz, login=True, consent=False)
            pending = await hold(server.store, server.limits, authz, _device_secret(server, request), now)
            return _redirect(request, 303, f"{server.issuer}/login?{urlencode({'request': pending.request_id})}")
        return await _continue(server, request, client, authz, session, 302)
    except UnsafeRedirect as e:
        return error_page(request, 400, "Sign-in cannot continue", e.message)
    except AuthorizeError as e:
        return _redirect(request, 302, error_location(server.issuer, e.redirect_uri, e.state, e.error))


async def _pending_and_client(server, request_id, *, consent_stage: bool):
    pending = await load_pending(server.store, request_id, server.now())
    if pending is None or (pending.sid is not None) != consent_stage:
        return None, None
    client = await server.clients.get_client(pending.request.client_id)
    return (pending, client) if client is not None else (None, None)


def _login_form(server, request, status, pending, client, *, username="", message=None) -> bytes:
    return login_page(
        request, status, action=f"{server.issuer}/login", client_name=client.name or client.client_id,
        request_id=pending.request_id, csrf=pending.csrf_token, username=username, message=message,
    )


def _checked_form(server, request, form, pending) -> bool:
    return form_token_valid(
        pending.csrf_token, form.get("csrf"), server.cookies.get(request, DEVICE_COOKIE), pending.request_id
    )


@_route("/login", "GET")
async def login(server, request):
    form = _form(request) or {}
    pending, client = await _pending_and_client(server, form.get("request"), consent_stage=False)
    if pending is None:
        return error_page(request, 400, "Sign-in expired", text.TOO_LONG)
    return _login_form(server, request, 200, pending, client, username=pending.request.login_hint or "")


@_route("/login", "POST")
async def login_submitted(server, request):
    form = _form(request)
    if form is None:
        return error_page(request, 400, "Sign-in cannot continue", text.FORM_EXPIRED)
    pending, client = await _pending_and_client(server, form.get("request"), consent_stage=False)
    if pending is None:
        return error_page(request, 400, "Sign-in expired", text.TOO_LONG)
    if not _checked_form(server, request, form, pending):
        return error_page(request, 400, "Sign-in cannot continue", text.FORM_EXPIRED)
    username, password = form.get("username", ""), form.get("password", "")
    if not username or not password:
        return _login_form(server, request, 200, pending, client, username=username, message=text.MISSING)
    address = _address(request)
    outcome = await log_in(server.portal, server.identity, server.store, server.throttle,
                           login=username, password=password, address=address,
                           now=server.reactor.seconds())
    if isinstance(outcome, Throttled):
        request.setHeader(b"retry-after", str(outcome.retry_after).encode())
        return _login_form(server, request, 429, pending, client, username=username,
                           message=text.too_many_attempts(outcome.retry_after))
    if isinstance(outcome, Refused):
        return _login_form(server, request, 200, pending, client, username=username, message=text.INCORRECT)
    if not isinstance(outcome, LoggedIn):
        return _login_form(server, request, 503, pending, client, username=username, message=text.UNAVAILABLE)
    if not await claim(server.store, pending):
        return error_page(request, 400, "Sign-in expired", text.TOO_LONG)
    now = server.now()
    await end_browser_session(server.store, server.cookies.get(request, SESSION_COOKIE), "logged in again")
    value, session = await start_session(server.store, server.limits, outcome.user.sub, now)
    server.cookies.set(request, SESSION_COOKIE, value, server.limits.session_ttl)
    events.login_succeeded(sub=outcome.user.sub, client_id=client.client_id, address=address)
    return await _continue(server, request, client, pending.request, session, 303)


async def _consent_context(server, request, form):
    """The consent-stage request, its client and the session it waits on, or an error page."""
    pending, client = await _pending_and_client(server, form.get("request"), consent_stage=True)
    if pending is None:
        return None, error_page(request, 400, "Sign-in expired", text.TOO_LONG)
    session = await live_session(server.store, server.identity,
                                 server.cookies.get(request, SESSION_COOKIE), server.now())
    if session is None or session.sid != pending.sid:
        return None, error_page(request, 400, "Signed out", text.SIGNED_OUT)
    return (pending, client, session), None


@_route("/consent", "GET")
async def consent(server, request):
    context, problem = await _consent_context(server, request, _form(request) or {})
    if problem is not None:
        return problem
    pending, client, session = context
    user = await server.identity.user_by_id(session.sub)
    return consent_page(
        request, 200, action=f"{server.issuer}/consent", client_name=client.name or client.client_id,
        user_label=(user.login if user else session.sub), scope=pending.request.scope,
        request_id=pending.request_id, csrf=pending.csrf_token,
    )


@_route("/consent", "POST")
async def consent_submitted(server, request):
    form = _form(request)
    if form is None:
        return error_page(request, 400, "Sign-in cannot continue", text.FORM_EXPIRED)
    context, problem = await _consent_context(server, request, form)
    if problem is not None:
        return problem
    pending, client, session = context
    action = form.get("action")
    if not _checked_form(server, request, form, pending) or action not in ("approve", "deny"):
        return error_page(request, 400, "Sign-in cannot continue", text.FORM_EXPIRED)
    if not await claim(server.store, pending):
        return error_page(request, 400, "Sign-in expired", text.TOO_LONG)
    authz, now = pending.request, server.now()
    if action == "deny":
        events.consent_denied(sub=session.sub, client_id=client.client_id)
        denied = AccessDenied("the user denied the request")
        return _redirect(request, 303, error_location(server.issuer, authz.redirect_uri, authz.state, denied))
    await remember_consent(server.store, session.sub, client.client_id, authz.scope, now)
    location = await issue_code(server.store, server.limits, server.issuer, authz, session, now)
    return _redirect(request, 303, location)
