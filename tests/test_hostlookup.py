"""
Host name lookups on a pool of their own (L{HostLookups}), with a lookup
that blocks on an event as one whose name servers hang: a lookup whose
caller gave up never runs, and callers beyond the cap of waiting lookups
are refused at once rather than queued without end.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError
from twisted.internet.threads import deferToThreadPool
from twisted.python.threadpool import ThreadPool

from authsrv.hostlookup import HostLookups, LookupsBusy


class Hanging:
    """A lookup that notes each host, then waits until C{release} is set."""

    def __init__(self):
        self.looked: list[str] = []
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, host: str) -> list[str]:
        self.looked.append(host)
        self.started.set()
        self.release.wait()
        return ["192.0.2.1"]


@contextmanager
def one_thread():
    pool = ThreadPool(minthreads=0, maxthreads=1, name="test-lookups")
    pool.start()
    try:
        yield pool
    finally:
        pool.stop()


async def drained(pool: ThreadPool) -> None:
    """Once every lookup queued before is through (the pool has one thread, first come first served)."""
    await deferToThreadPool(reactor, pool, lambda: None)


@pytest_twisted.ensureDeferred
async def test_a_lookup_whose_caller_gave_up_never_runs():
    hanging = Hanging()
    with one_thread() as pool:
        lookups = HostLookups(reactor, pool, 10, hanging)
        first = lookups("first.test")
        assert hanging.started.wait(10)
        stale = [lookups(f"stale{n}.test") for n in range(5)]
        for d in [first, *stale]:
            d.cancel()
        hanging.release.set()
        await drained(pool)
        assert await lookups("fresh.test") == ["192.0.2.1"]
        assert hanging.looked == ["first.test", "fresh.test"]
        for d in [first, *stale]:
            with pytest.raises(CancelledError):
                await d


@pytest_twisted.ensureDeferred
async def test_callers_beyond_the_waiting_cap_are_refused_at_once():
    hanging = Hanging()
    with one_thread() as pool:
        lookups = HostLookups(reactor, pool, 2, hanging)
        running = lookups("running.test")
        assert hanging.started.wait(10)
        waiting = [lookups("one.test"), lookups("two.test")]
        refused = lookups("three.test")
        assert refused.called
        with pytest.raises(LookupsBusy, match="2 host name lookups are waiting"):
            await refused
        hanging.release.set()
        assert [await d for d in [running, *waiting]] == [["192.0.2.1"]] * 3
        assert hanging.looked == ["running.test", "one.test", "two.test"]


@pytest_twisted.ensureDeferred
async def test_a_given_up_lookup_holds_its_place_until_its_turn():
    """The queue is bounded by what it holds: a cancelled lookup counts until the pool skips it."""
    hanging = Hanging()
    with one_thread() as pool:
        lookups = HostLookups(reactor, pool, 1, hanging)
        running = lookups("running.test")
        assert hanging.started.wait(10)
        stale = lookups("stale.test")
        for d in (running, stale):
            d.cancel()
            with pytest.raises(CancelledError):
                await d
        with pytest.raises(LookupsBusy):
            await lookups("refused.test")
        hanging.release.set()
        await drained(pool)
        assert await lookups("fresh.test") == ["192.0.2.1"]
        assert hanging.looked == ["running.test", "fresh.test"]


@pytest_twisted.ensureDeferred
async def test_a_failed_lookup_fails_its_caller():
    def broken(host: str) -> list[str]:
        raise OSError("no such name")

    with one_thread() as pool:
        with pytest.raises(OSError, match="no such name"):
            await HostLookups(reactor, pool, 1, broken)("nowhere.test")
