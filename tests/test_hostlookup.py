"""
Host name lookups on a pool of their own (L{HostLookups}), with a lookup
that blocks on an event as one whose name servers hang: a lookup whose
caller gave up never runs, and callers beyond the cap of waiting lookups
are refused at once rather than queued without end.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import CancelledError
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.python.threadpool import ThreadPool

from hanging_lookups import Hanging, drained, one_thread

from authsrv.hostlookup import HostLookups, LookupsBusy


@contextmanager
def one_under_way(waiting: int):
    """
    The lookups of a pool of one thread, at most C{waiting} of them waiting,
    as the name servers hang: (the hanging lookup, the pool, the lookups, the
    Deferred of the one under way).
    """
    hanging = Hanging()
    with one_thread(hanging) as pool:
        lookups = HostLookups(reactor, pool, waiting, hanging)
        running = lookups("running.test")
        assert hanging.started.wait(10)
        yield hanging, pool, lookups, running


@pytest_twisted.ensureDeferred
async def test_a_lookup_whose_caller_gave_up_never_runs():
    with one_under_way(10) as (hanging, pool, lookups, running):
        stale = [lookups(f"stale{n}.test") for n in range(5)]
        for d in [running, *stale]:
            d.cancel()
        hanging.release.set()
        await drained(pool)
        assert await lookups("fresh.test") == ["192.0.2.1"]
        assert hanging.looked == ["running.test", "fresh.test"]
        for d in [running, *stale]:
            with pytest.raises(CancelledError):
                await d


@pytest_twisted.ensureDeferred
async def test_callers_beyond_the_waiting_cap_are_refused_at_once():
    with one_under_way(2) as (hanging, _, lookups, running):
        waiting = [lookups("one.test"), lookups("two.test")]
        refused = lookups("three.test")
        assert refused.called
        with pytest.raises(LookupsBusy, match="host name lookups waiting for a thread: 2, the most allowed"):
            await refused
        hanging.release.set()
        assert [await d for d in [running, *waiting]] == [["192.0.2.1"]] * 3
        assert hanging.looked == ["running.test", "one.test", "two.test"]


@pytest_twisted.ensureDeferred
async def test_a_given_up_lookup_holds_its_place_until_its_turn():
    """The queue is bounded by what it holds: a cancelled lookup counts until the pool skips it."""
    with one_under_way(1) as (hanging, pool, lookups, running):
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


@pytest_twisted.ensureDeferred
async def test_lookups_still_waiting_when_the_pool_stops_are_refused_not_run():
    """
    Stopping the pool (the server's shutdown) waits for the lookups under
    way, but the ones waiting behind them are refused, not each made and
    waited for as the name servers hang.
    """
    hanging = Hanging()
    pool = ThreadPool(minthreads=0, maxthreads=1, name="test-lookups")
    pool.start()
    lookups = HostLookups(reactor, pool, 5, hanging)
    running = lookups("running.test")
    assert hanging.started.wait(10)
    waiting = [lookups(f"waiting{n}.test") for n in range(3)]
    stopping = deferToThread(pool.stop)
    while not pool.joined:
        await deferLater(reactor, 0.01, lambda: None)
    hanging.release.set()
    await stopping
    assert await running == ["192.0.2.1"]
    for d in waiting:
        with pytest.raises(LookupsBusy, match="stopping"):
            await d
    assert hanging.looked == ["running.test"]


def test_a_lookup_asked_for_after_the_pool_stopped_is_refused_at_once():
    """
    A stopped pool drops new work without a word: the lookup's Deferred
    never fired, and its place among those waiting was never given back.
    """
    pool = ThreadPool(minthreads=0, maxthreads=1, name="test-lookups")
    pool.start()
    pool.stop()
    lookups = HostLookups(reactor, pool, 1, Hanging())
    failures: list = []
    for _ in range(2):
        lookups("late.test").addErrback(failures.append)
    assert [f.check(LookupsBusy) and "stopping" in str(f.value) for f in failures] == [True, True]
