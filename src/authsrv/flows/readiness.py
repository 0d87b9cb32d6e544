"""
Readiness (C{GET /readyz}): whether a load balancer should send this
instance traffic. Start-up must have finished and the store and keystore
must answer. Identity backends that do not answer make the instance
"degraded", never unready: a directory is shared by every instance, so
taking them all out of rotation would only turn the directory's outage into
a site-wide one, while tokens, introspection and user-access of sessions
already made keep answering (or say 503 themselves). Every part is asked
at once, each within the same timeout.
"""

from __future__ import annotations

from typing import Callable

from twisted.internet.defer import (
    CancelledError,
    Deferred,
    FirstError,
    TimeoutError as DeferredTimeout,
    gatherResults,
    maybeDeferred,
)
from twisted.logger import Logger

TIMEOUT = 2.0
PROBE_SUB = "authsrv-readiness-probe"
"""A user id no backend has: looking it up proves the backend answers."""

log = Logger()


class Readiness:
    """
    C{startup()} returns a start-up problem ("starting", "draining") or
    None; C{identity} is the identity chain (its C{backends} and C{names}).
    """

    def __init__(self, *, clock, startup: Callable[[], str | None], store, keystore, identity,
                 timeout: float = TIMEOUT):
        self._clock = clock
        self._startup = startup
        self._store = store
        self._keystore = keystore
        self._identity = identity
        self._timeout = timeout

    def _reachable(self, part: str, call: Callable[[], Deferred]) -> Deferred:
        def unreachable(failure):
            if failure.check(CancelledError):
                return failure  # the caller went away: nothing was found unreachable
            error = (f"no answer within {self._timeout:g} s" if failure.check(DeferredTimeout)
                     else failure.getErrorMessage() or failure.type.__name__)
            log.warn("readiness: {part} unreachable: {error}", part=part, error=error)
            return False

        d = maybeDeferred(call).addTimeout(self._timeout, self._clock)
        return d.addCallbacks(lambda _: True, unreachable)

    async def check(self) -> tuple[int, dict]:
        """The HTTP status and JSON body of C{/readyz}."""
        problem = self._startup()
        if problem is not None:
            return 503, {"status": "unavailable", "reason": problem}
        backends = [f"identity:{name}" for name in self._identity.names]
        probes = [
            ("store", lambda: self._store.ping()),
            ("keystore", lambda: self._keystore.reload()),
            *((part, lambda b=backend: b.user_by_id(PROBE_SUB)) for part, backend in zip(backends, self._identity.backends)),
        ]
        try:
            answers = await gatherResults([self._reachable(part, call) for part, call in probes], consumeErrors=True)
        except FirstError as e:  # only a cancellation gets past _reachable: the caller went away
            raise e.subFailure.value from None
        down = [part for (part, _), up in zip(probes, answers) if not up]
        identity_down = [part for part in down if part in backends]
        if "store" in down or "keystore" in down:
            return 503, {"status": "unavailable", "reason": f"{down[0]} unreachable", "unreachable": down}
        if identity_down:
            return 200, {"status": "degraded", "unreachable": identity_down}
        return 200, {"status": "ready"}
