"""
A short cache of each user's standing in front of one identity backend
(docs/design.md, Bans): refresh, UserInfo, introspection and user-access
ask the backend about the token's user on every request, and a directory
round trip per request is what this saves. Only C{user_by_id} is cached,
the record that carries "exists" and "disabled" (for LDAP, the required
groups too); bans live in the store and are read on every request, so
they still act at once. A successful password check forgets the user's
entry (L{authsrv.identity.chain}), so a login always sees the backend's
current answer.

Bounded (least recently used entries go first), one lookup at a time per
user (concurrent misses wait for the same answer), an unknown user kept
for a shorter time than a known one (a user just created in the directory
should not wait long), and failures never kept: a backend that is down is
asked again by the next request.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from authsrv.records import User

DEFAULT_SECONDS = 30
"""For backends that authsrv only reads (LDAP, a mapped PostgreSQL table): see the README."""
MAX_SECONDS = 60
"""
The longest a user's standing is kept ("seconds to a minute", docs/design.md,
Bans): a user disabled in a directory loses access within it.
"""
DEFAULT_SIZE = 10_000
NEGATIVE_SECONDS = 5
"""The most an unknown user is kept, when the cache keeps known ones longer."""


class StandingCache:
    """
    Users by sub for C{seconds} (unknown ones for at most
    L{NEGATIVE_SECONDS}), at most C{size} of them, timed by C{clock}.
    """

    def __init__(self, clock, seconds: float, size: int = DEFAULT_SIZE):
        self._clock = clock
        self._seconds = seconds
        self._negative = min(seconds, NEGATIVE_SECONDS)
        self._size = size
        self._entries: OrderedDict[str, tuple[float, User | None]] = OrderedDict()
        self._pending: dict[str, list[Deferred]] = {}

    def user_by_id(self, sub: str, lookup: Callable[[str], Deferred]) -> Deferred:
        """The cached user for C{sub}, else C{lookup(sub)}'s answer, shared with concurrent callers."""
        entry = self._entries.get(sub)
        if entry is not None:
            if entry[0] > self._clock.seconds():
                self._entries.move_to_end(sub)
                return succeed(entry[1])
            del self._entries[sub]
        waiting: Deferred = Deferred()
        if sub in self._pending:
            self._pending[sub].append(waiting)
            return waiting
        waiters = self._pending[sub] = [waiting]
        lookup(sub).addBoth(self._answered, sub, waiters)
        return waiting

    def _answered(self, outcome, sub: str, waiters: list[Deferred]) -> None:
        if self._pending.get(sub) is waiters:
            del self._pending[sub]
            if not isinstance(outcome, Failure):
                self._keep(sub, outcome)
        for waiting in waiters:
            if waiting.called:
                continue
            if isinstance(outcome, Failure):
                waiting.errback(outcome)
            else:
                waiting.callback(outcome)

    def _keep(self, sub: str, user: User | None) -> None:
        self._entries[sub] = (self._clock.seconds() + (self._seconds if user is not None else self._negative), user)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def forget(self, sub: str) -> None:
        """Drop C{sub}'s entry, and let a lookup already under way answer its callers without being kept."""
        self._entries.pop(sub, None)
        self._pending.pop(sub, None)
