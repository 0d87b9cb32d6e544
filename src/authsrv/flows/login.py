"""
Checking a password: the throttle first, then the identity backends through
the twisted.cred portal, then the user's standing. The real reason of a
refusal goes only to the audit log; the person sees one answer for all.
"""

from __future__ import annotations

from attrs import frozen
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import Portal
from twisted.logger import Logger

from authsrv import events
from authsrv.flows.standing import standing
from authsrv.identity.errors import UnknownUser
from authsrv.identity.realm import UserRealm
from authsrv.interfaces import IUser
from authsrv.records import User

log = Logger()

LOGGED_LOGIN_MAX = 64
"""Logins are cut to this length in events: a mistyped password may sit in the username field."""


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


class PasswordLogin:
    """
    C{identity} is the identity chain, C{throttle} an
    L{authsrv.interfaces.ILoginThrottle}.
    """

    def __init__(self, *, identity, store, throttle):
        self._portal = Portal(UserRealm(identity), [identity])
        self._identity = identity
        self._store = store
        self._throttle = throttle

    async def log_in(self, login: str, password: str, address: str, now: float):
        """Fires with L{LoggedIn}, L{Refused}, L{Throttled} or L{Unavailable}."""
        logged = login[:LOGGED_LOGIN_MAX]
        wait = await self._throttle.retry_after(login, address, now)
        if wait is not None:
            events.login_failed(login=logged, reason="throttled", address=address)
            return Throttled(wait)
        try:
            _, user, _ = await self._portal.login(UsernamePassword(login.encode(), password.encode()), None, IUser)
            user_standing = await standing(self._identity, self._store, user.sub, int(now))
        except UnauthorizedLogin as e:
            await self._throttle.failed(login, address, now)
            reason = "unknown user" if isinstance(e, UnknownUser) else "wrong password"
            events.login_failed(login=logged, reason=reason, address=address)
            return Refused()
        except Exception as e:
            log.warn("login impossible, identity backend failed: {error}", error=str(e) or type(e).__name__)
            events.login_failed(login=logged, reason="identity backend unavailable", address=address)
            return Unavailable()
        if not user_standing.allowed:
            await self._throttle.failed(login, address, now)
            reason = "disabled" if user.disabled else "banned"
            events.login_failed(login=logged, reason=reason, address=address)
            return Refused()
        await self._throttle.succeeded(login, address, now)
        return LoggedIn(user)
