"""
Lookups by key that arrive while another is at the database, or in the
same turn of the reactor as one sent alone, go on together, as one
statement over all their keys.

Under load a server asks PostgreSQL the same question (this access token?
this user's standing?) for many requests at once. Each statement costs a
round trip, a cursor here and an executor's start there, and, where the
database shares the server's cores, two context switches; one statement
over eight keys costs about a quarter of what eight statements over one
key do. A L{Gather} sends the first lookup of a reactor turn at once, so a
lone request waits for nothing. The lookups that follow in the same turn
(the other requests the reactor read at the same time) wait for the turn's
end, or, while C{width} statements are under way, for the next one to come
back, as they would have waited for a connection; then they go together,
as the SQLite store's worker takes a turn's calls in one hand-over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

One = Callable[[Any, Hashable, Hashable], Awaitable[Any]]
Many = Callable[[Any, list, Hashable], Awaitable[dict]]


class Gather:
    """
    C{gather(key, shared)} fires with what C{one(db, key, shared)} gives,
    or with C{many(db, keys, shared)[key]} (None where C{key} is absent)
    when it went with others: lookups go together only with lookups of the
    same C{shared} parameters (the moment, say), so each answer is the one
    its own statement would have given.
    """

    def __init__(self, reactor, run: Callable[[Callable], Deferred], one: One, many: Many, *, width: int = 2):
        """C{run(work)} fires with C{work(db)} run on a pooled connection (its failures translated)."""
        self._reactor = reactor
        self._run = run
        self._one = one
        self._many = many
        self._width = width
        self._under_way = 0
        self._sent_this_turn = False
        self._waiting: dict[Hashable, list[tuple[Hashable, Deferred]]] = {}

    def __call__(self, key: Hashable, shared: Hashable) -> Deferred:
        if self._under_way < self._width and not self._sent_this_turn:
            self._sent_this_turn = True
            self._reactor.callLater(0, self._turn_over)
            return self._send(lambda db: self._one(db, key, shared))
        waiting: Deferred = Deferred()
        self._waiting.setdefault(shared, []).append((key, waiting))
        return waiting

    def _turn_over(self) -> None:
        """The reactor's turn that sent a lookup alone is over: what it gathered goes."""
        self._sent_this_turn = False
        self._next()

    def _send(self, work) -> Deferred:
        self._under_way += 1
        return self._run(work).addBoth(self._back)

    def _back(self, outcome):
        self._under_way -= 1
        self._next()
        return outcome

    def _next(self) -> None:
        """
        The oldest groups of waiting lookups go while fewer than C{width}
        statements are under way; a group of one key goes as a lone lookup
        would, by C{one}.
        """
        while self._waiting and self._under_way < self._width:
            shared = next(iter(self._waiting))
            group = self._waiting.pop(shared)
            keys = list(dict.fromkeys(key for key, _ in group))
            if len(keys) == 1:
                sent = self._send(lambda db, key=keys[0], shared=shared: self._one(db, key, shared)).addCallback(
                    _by_key, keys[0])
            else:
                sent = self._send(lambda db, keys=keys, shared=shared: self._many(db, keys, shared))
            sent.addCallbacks(_answer, _fail, callbackArgs=(group,), errbackArgs=(group,))


def _by_key(record, key: Hashable) -> dict:
    return {key: record}


def _answer(found: dict, group: list[tuple[Hashable, Deferred]]) -> None:
    """Each lookup hears its own key's record (a cancelled one ignores it, as Deferreds do)."""
    for key, waiting in group:
        waiting.callback(found.get(key))


def _fail(failure: Failure, group: list[tuple[Hashable, Deferred]]) -> None:
    for _, waiting in group:
        waiting.errback(failure)
