"""
Several identity backends as one: the composite checker the server's portal
holds (a L{Portal} keeps one checker per credentials interface), and the
backend every flow asks about users.

Backends are asked in the configured order (for example LDAP for staff,
then the static file for service accounts); the first one that knows the
user decides. The distinct failures of L{IIdentityBackend} drive it, as in
Dex's connectors: an unknown user lets the next backend answer, a wrong
password stops, and a backend that is down is skipped, but when no
backend knew the user the outage is the answer: never "wrong password" and
never "no such user", which would end that user's grants.

Timing must not tell an unknown login from a wrong password. Each backend
gives both the same work (a dummy hash, a decoy bind), so an unknown login
costs the unknown-user work of every backend, in order. The rule that
keeps a wrong password at the same cost: after the backend that refuses the
password, every later backend is still asked, about a random login no one
has and with the typed password, and its answer (whatever it is, an outage
too) is dropped; the real login never reaches them, so a same-named account
elsewhere is neither tried nor locked. Then a refusal at backend i costs
the unknown-user work of the backends before it, its own wrong-password
work, and the unknown-user work of those after it: the same sum. A success
skips the rest, since it tells the person the password was right anyway.
"""

from __future__ import annotations

import secrets
from time import perf_counter
from typing import Callable, Sequence

from twisted.cred.credentials import IUsernamePassword, UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.defer import Deferred, fail, gatherResults, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from authsrv.identity.cache import StandingCache
from authsrv.identity.errors import BackendUnavailable, UnknownUser
from authsrv.interfaces import IIdentityBackend

log = Logger()

CallObserver = Callable[[str, str, float, bool], None]
"""C{(backend name, call, seconds, failed)}: a call failed when the backend could not answer at all."""


@implementer(IIdentityBackend)
class IdentityChain:
    """
    The backends in order, as one L{IIdentityBackend}. C{names} name them
    (for readiness and metrics; by default C{"0"}, C{"1"}, ...), and
    C{observer}, if any, hears of every call made to one of them.
    C{caches}, by position, holds a L{StandingCache} for each backend whose
    C{user_by_id} answers are kept for a while, or None (the default for
    all) where every lookup asks the backend.
    """

    credentialInterfaces = (IUsernamePassword,)

    def __init__(self, backends, names=None, observer: CallObserver | None = None,
                 caches: Sequence[StandingCache | None] = ()):
        self.backends = tuple(backends)
        self.names = tuple(names) if names is not None else tuple(str(i) for i in range(len(self.backends)))
        self._observer = observer
        self._caches = tuple(caches) + (None,) * (len(self.backends) - len(caches))

    def _ask(self, index: int, method: str, argument) -> Deferred:
        """Call one backend's C{method}, timed for the observer."""
        if self._observer is None:
            return maybeDeferred(getattr(self.backends[index], method), argument)
        observer, name, started = self._observer, self.names[index], perf_counter()

        def report(outcome):
            failed = isinstance(outcome, Failure) and not outcome.check(UnauthorizedLogin)
            observer(name, method, perf_counter() - started, failed)
            return outcome

        return maybeDeferred(getattr(self.backends[index], method), argument).addBoth(report)

    def _forget(self, sub: str) -> None:
        """A password check just succeeded: the login and what follows it read the user afresh."""
        for cache in self._caches:
            if cache is not None:
                cache.forget(sub)

    def _unavailable(self, index: int, error: Exception) -> None:
        log.warn(
            "identity backend {index} ({backend}) unavailable: {error}",
            index=index, backend=type(self.backends[index]).__name__, error=str(error) or type(error).__name__,
        )

    def requestAvatarId(self, credentials) -> Deferred:
        return Deferred.fromCoroutine(self._check(credentials))

    async def _check(self, credentials) -> str:
        outage = None
        for index in range(len(self.backends)):
            try:
                sub = await self._ask(index, "requestAvatarId", credentials)
            except UnknownUser:
                continue
            except UnauthorizedLogin:
                await self._decoy(index + 1, credentials.password)
                raise
            except Exception as e:
                self._unavailable(index, e)
                outage = e
            else:
                self._forget(sub)
                return sub
        if outage is not None:
            raise BackendUnavailable(f"no identity backend knew the login, and one was unavailable: {outage}")
        raise UnknownUser("no identity backend knows this login")

    async def _decoy(self, start: int, password) -> None:
        """Ask the backends from C{start} on about a login no one has, as the module docstring says."""
        decoy = UsernamePassword(secrets.token_hex(16).encode("ascii"), password)
        for index in range(start, len(self.backends)):
            try:
                await self._ask(index, "requestAvatarId", decoy)
            except UnauthorizedLogin:
                pass
            except Exception as e:
                self._unavailable(index, e)

    def _first(self, method: str, key, index: int = 0, outage: Exception | None = None) -> Deferred:
        """
        The first user a backend from C{index} on knows, or None; plain
        callbacks rather than a coroutine, since refresh, UserInfo and
        introspection all come through here.
        """
        if index == len(self.backends):
            if outage is not None:
                return fail(BackendUnavailable(f"no identity backend knew the user, and one was unavailable: {outage}"))
            return succeed(None)

        def failed(failure):
            self._unavailable(index, failure.value)
            return self._first(method, key, index + 1, failure.value)

        def answered(user):
            return self._first(method, key, index + 1, outage) if user is None else user

        cache = self._caches[index] if method == "user_by_id" else None
        asked = self._ask(index, method, key) if cache is None else cache.user_by_id(
            key, lambda sub: self._ask(index, method, sub))
        if asked.called and asked.result is not None and not isinstance(asked.result, (Failure, Deferred)):
            # Found at once (a file, a cache): the answer as it is, without a callback round.
            return asked
        return asked.addCallbacks(answered, failed)

    def user_by_id(self, sub: str) -> Deferred:
        return self._first("user_by_id", sub)

    def user_by_login(self, login) -> Deferred:
        return self._first("user_by_login", login)

    def close(self) -> Deferred:
        """Close every backend, even when one fails to."""
        return gatherResults([maybeDeferred(b.close) for b in self.backends], consumeErrors=True)
