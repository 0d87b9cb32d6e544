"""
Store calls sent in one turn of the reactor and awaited as one: on one core
the SQLite store hands a turn's writes to its thread together, so writes
sent this way share one durable commit, and the PostgreSQL store runs them
side by side on its pooled connections instead of one after another
(bench/README.md, "Fewer commits per sign-in"). A sign-in's writes that do
not wait on each other's answer go this way.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, DeferredList


async def together(pending: list[Deferred]) -> list:
    """
    The results of C{pending}, in order, once every one has ended; else the
    first failure in that order, raised as the store raised it, with the
    others' failures handled.
    """
    ended = await DeferredList(pending, consumeErrors=True)
    for succeeded, result in ended:
        if not succeeded:
            result.raiseException()
    return [result for _, result in ended]
