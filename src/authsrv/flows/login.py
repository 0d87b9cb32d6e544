"""
Checking a password (docs/design.md, Brute force): the attempt is counted in
the store before any password is checked, so every instance sees the same
numbers and parallel requests cannot check more passwords than the limit
allows; then the identity backends through the twisted.cred portal, then
the user's standing. The person sees one answer for an unknown user and a
wrong password; the real reason goes only to the audit log.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable, cast

from attrs import frozen
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import Portal
from twisted.internet.defer import Deferred
from twisted.logger import Logger

from authsrv import events
from authsrv.flows.standing import standing
from authsrv.flows.together import together
from authsrv.identity.credentials import width_mapped
from authsrv.identity.errors import UnknownUser
from authsrv.identity.realm import UserRealm
from authsrv.identity.static import login_key
from authsrv.interfaces import IUser
from authsrv.protocol.forwarded import address_key
from authsrv.records import ThrottlePolicy, User
from authsrv.tokens import token_hash

log = Logger()

LOGGED_LOGIN_MAX = 64
"""Logins are cut to this length in events: a mistyped password may sit in the username field."""
KNOWN_DEVICE_TTL = 180 * 86400
"""How long a browser that signed in to an account passes that account's limit."""
BUSY_RETRY = 5
OTHER_COUNTS = ("mfa:", "device:")
"""
How the throttle's other counts name their accounts: a user's second-factor
codes (L{authsrv.flows.mfa.THROTTLE_PREFIX} and the sub) and device user
codes (L{authsrv.flows.device.THROTTLE_ACCOUNT}). A login is anything a
caller types, so one that reads as such a key is counted apart
(L{throttle_account}): typing C{mfa:<sub>} as a user name must not hold
back that user's second factor.
"""
LOGIN_COUNT = "login:"


def throttle_account(login: str) -> str:
    """
    The throttle's account for failed passwords given for C{login}: as the
    backends compare logins, width forms mapped (L{width_mapped}), so that
    typing C{ａlice}, C{aｌice} and so on counts as C{alice}.
    """
    key = login_key(width_mapped(login))
    return LOGIN_COUNT + key if key.startswith(OTHER_COUNTS) else key


@frozen
class LoggedIn:
    user: User
    along: object = None
    """What the caller's C{along} write fired with (L{PasswordLogin.log_in})."""
    read: object = None
    """What the caller's C{reading} fired with (L{PasswordLogin.log_in})."""


@frozen
class Refused:
    """Wrong password or unknown user: one answer for both."""


@frozen
class Throttled:
    retry_after: int


@frozen
class Suspended:
    """The right password for a banned or disabled account: not a failure."""

    reason: str | None


@frozen
class Unavailable:
    """The identity backend could not answer, or too many checks are queued: never a wrong password."""


class PasswordLogin:
    """
    C{identity} is the identity chain, C{store} provides
    L{authsrv.interfaces.ILoginThrottle} and
    L{authsrv.interfaces.IKnownDeviceStore}.
    """

    def __init__(self, *, identity, store, policy: ThrottlePolicy):
        self._portal = Portal(UserRealm(identity), [identity])
        self._identity = identity
        self._store = store
        self._policy = policy
        self._checks = Counter[str]()

    async def log_in(self, login: str, password: str, address: str, device: str | None, now: float,
                     along: Callable[[], Deferred] | None = None,
                     reading: Callable[[str], Deferred] | None = None):
        """
        Fires with L{LoggedIn}, L{Refused}, L{Throttled}, L{Suspended} or
        L{Unavailable}. C{device} is the browser's device secret: a browser
        that signed in to this account before passes the account's limit.
        C{along} is the caller's own work for a sign-in that succeeds (the
        interaction used up, say, or a changed password's new hash): called
        with the throttle's and the device's writes, so that all reach the
        store together (one commit), and still counted as this check
        (C{checks_in_flight}), so that work too is refused at once in a
        flood; its result is L{LoggedIn.along}. C{reading} is the caller's own
        read of the user (by C{sub}) whose password was right, sent with
        the read of the user's ban (one round trip); its result is
        L{LoggedIn.read}.
        """
        logged = login[:LOGGED_LOGIN_MAX]
        if self._checks.total() >= self._policy.checks_in_flight:
            events.throttle_engaged(login=logged, address=address, reason="too many password checks in flight")
            return Unavailable()
        if self._checks[address_key(address)] >= self._policy.checks_per_address:
            events.login_throttled(login=logged, address=address, retry_after=BUSY_RETRY)
            return Throttled(BUSY_RETRY)
        key = address_key(address)
        self._checks[key] += 1
        try:
            return await self._log_in(login, password, address, device, now, along, reading)
        finally:
            self._checks[key] -= 1
            if not self._checks[key]:
                del self._checks[key]

    async def _compared_login(self, login: str) -> str:
        """
        The login the backends check: as typed, or, when it holds full-width
        or half-width forms (an input method left in full-width mode), its
        RFC 8265 width-mapped form (L{width_mapped}), which new logins are
        given in; as typed while a user stored before that has it. Only such
        a login costs a lookup more.
        """
        mapped = width_mapped(login)
        if mapped == login or await self._identity.user_by_login(login) is not None:
            return login
        return mapped

    async def _log_in(self, login: str, password: str, address: str, device: str | None, now: float,
                      along: Callable[[], Deferred] | None, reading: Callable[[str], Deferred] | None):
        logged = login[:LOGGED_LOGIN_MAX]
        account, seconds = throttle_account(login), int(now)
        device_hash = token_hash(device) if device else None
        decision = await self._store.attempt(account, address_key(address), device_hash, self._policy, seconds)
        if decision.wait is not None:
            events.login_throttled(login=logged, address=address, retry_after=decision.wait)
            return Throttled(decision.wait)
        try:
            compared = await self._compared_login(login)
            _, avatar, _ = await self._portal.login(UsernamePassword(compared.encode(), password.encode()), None, IUser)
            user = cast(User, avatar)
            reads = [Deferred.fromCoroutine(standing(self._identity, self._store, user.sub, seconds))]
            if reading is not None:
                reads.append(reading(user.sub))
            user_standing, *read = await together(reads)
        except UnauthorizedLogin as e:
            reason = "unknown user" if isinstance(e, UnknownUser) else "wrong password"
            events.login_failed(login=logged, reason=reason, address=address)
            return Refused()
        except Exception as e:
            await self._store.forgive(decision.ticket)
            log.warn("login impossible, identity backend failed: {error}", error=str(e) or type(e).__name__)
            events.login_failed(login=logged, reason="identity backend unavailable", address=address)
            return Unavailable()
        if not user_standing.allowed:
            await self._store.forgive(decision.ticket)
            reason = "disabled" if user.disabled else "banned"
            events.login_suspended(sub=user.sub, address=address, reason=reason)
            return Suspended(user_standing.ban_reason)
        writes = [self._store.succeeded(account, address_key(address), seconds)]
        if device_hash is not None:
            writes.append(self._store.remember_device(account, device_hash, seconds + KNOWN_DEVICE_TTL))
        if along is not None:
            writes.append(along())
        done = await together(writes)
        return LoggedIn(user, done[-1] if along is not None else None, read[0] if read else None)
