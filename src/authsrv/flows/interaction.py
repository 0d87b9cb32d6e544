"""
What the user does between the authorization request and the code: the
pending request kept server-side while they log in or consent, the password
check with its throttle and standing check, and remembering a consent.

Nothing here knows HTTP: routes pass values and render the outcomes.
"""

from __future__ import annotations

from attrs import frozen
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.logger import Logger

from authsrv import events
from authsrv.flows.authorize import AuthorizationRequest
from authsrv.flows.csrf import form_token
from authsrv.flows.standing import standing
from authsrv.identity.errors import UnknownUser
from authsrv.interfaces import IUser
from authsrv.records import PendingAuthorization, User
from authsrv.tokens import new_token

log = Logger()

SID_PARAM = "_sid"
"""Pending-request key naming the session a consent-stage request waits on."""

LOGGED_LOGIN_MAX = 64
"""Logins are cut to this length in events: a mistyped password may sit in the username field."""


@frozen
class Pending:
    """
    A pending request: at the login stage (C{sid} None) or waiting for the
    consent of the session C{sid}, so a consent is never given by a user
    other than the one who was shown the page.
    """

    request_id: str
    csrf_token: str
    request: AuthorizationRequest
    sid: str | None


async def hold(store, limits, request: AuthorizationRequest, device_secret: str, now: int,
               sid: str | None = None) -> Pending:
    """Keep the request for L{limits.pending_request_ttl}; the browser gets only its id."""
    request_id = new_token()
    params = request.to_params()
    if sid is not None:
        params[SID_PARAM] = sid
    pending = PendingAuthorization(
        request_id=request_id,
        client_id=request.client_id,
        params=params,
        csrf_token=form_token(device_secret, request_id),
        created_at=now,
        expires_at=now + limits.pending_request_ttl,
    )
    await store.save_pending(pending)
    return Pending(request_id, pending.csrf_token, request, sid)


async def load_pending(store, request_id: str | None, now: int) -> Pending | None:
    """The unexpired pending request of that id, or None."""
    if not request_id:
        return None
    pending = await store.get_pending(request_id, now)
    if pending is None:
        return None
    return Pending(
        pending.request_id,
        pending.csrf_token,
        AuthorizationRequest.from_params(pending.params),
        pending.params.get(SID_PARAM),
    )


async def claim(store, pending: Pending) -> bool:
    """Use a pending request up: True for exactly one of two racing submissions."""
    return await store.delete_pending(pending.request_id)


@frozen
class LoggedIn:
    user: User


@frozen
class Refused:
    """Wrong password, unknown user or a user who may not log in: one answer for all."""


@frozen
class Throttled:
    retry_after: int


@frozen
class Unavailable:
    """The identity backend could not answer: never reported as a wrong password."""


async def log_in(portal, identity, store, throttle, *, login: str, password: str, address: str,
                 now: float):
    """
    Check a password unless the account or address is throttled, then the
    user's standing; fires with L{LoggedIn}, L{Refused}, L{Throttled} or
    L{Unavailable}. The real reason of a refusal goes only to the audit log.
    """
    logged = login[:LOGGED_LOGIN_MAX]
    wait = throttle.retry_after(login, address, now)
    if wait is not None:
        events.login_failed(login=logged, reason="throttled", address=address)
        return Throttled(wait)
    try:
        _, user, _ = await portal.login(UsernamePassword(login.encode(), password.encode()), None, IUser)
        user_standing = await standing(identity, store, user.sub, int(now))
    except UnauthorizedLogin as e:
        throttle.failed(login, address, now)
        reason = "unknown user" if isinstance(e, UnknownUser) else "wrong password"
        events.login_failed(login=logged, reason=reason, address=address)
        return Refused()
    except Exception as e:
        log.warn("login impossible, identity backend failed: {error}", error=str(e) or type(e).__name__)
        events.login_failed(login=logged, reason="identity backend unavailable", address=address)
        return Unavailable()
    if not user_standing.allowed:
        throttle.failed(login, address, now)
        reason = "disabled" if user.disabled else "banned"
        events.login_failed(login=logged, reason=reason, address=address)
        return Refused()
    throttle.succeeded(login)
    return LoggedIn(user)


async def remember_consent(store, sub: str, client_id: str, scope, now: int) -> None:
    """Add C{scope} to what the user consented to for the client, until revoked."""
    earlier = await store.get_consent(sub, client_id) or frozenset()
    granted = earlier | frozenset(scope)
    await store.save_consent(sub, client_id, granted, now)
    events.consent_given(sub=sub, client_id=client_id, scope=" ".join(sorted(granted)))
