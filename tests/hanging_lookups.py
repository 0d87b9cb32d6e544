"""
A host name lookup whose name servers hang, for the tests of the lookup
pools (authsrv.hostlookup): it blocks on an event, never on a timer.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from twisted.internet import reactor
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool


class Hanging:
    """A lookup that notes each host, then waits until C{release} is set and answers C{address}."""

    def __init__(self, address: str = "192.0.2.1"):
        self.address = address
        self.looked: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, host: str) -> list[str]:
        self.looked.append(host)
        self.started.set()
        self.release.wait()
        return [self.address]


@contextmanager
def one_thread(hanging: Hanging | None = None):
    """A pool of one thread, stopped at the end, C{hanging} released first so that the stop never waits."""
    pool = ThreadPool(minthreads=0, maxthreads=1, name="test-lookups")
    pool.start()
    try:
        yield pool
    finally:
        if hanging is not None:
            hanging.release.set()
        pool.stop()


async def drained(pool: ThreadPool) -> None:
    """Once every lookup queued before is through (the pool has one thread, first come first served)."""
    await deferToThreadPool(reactor, pool, lambda: None)
