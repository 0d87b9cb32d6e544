"""
The standing cache in front of an identity backend (authsrv.identity.cache),
on a fake lookup and twisted.internet.task.Clock.
"""

from __future__ import annotations

import pytest
from twisted.internet.defer import CancelledError, Deferred, succeed
from twisted.internet.task import Clock

from authsrv.identity.cache import NEGATIVE_SECONDS, StandingCache
from authsrv.identity.errors import BackendUnavailable
from authsrv.records import User

ALICE = User(sub="sub-alice", login="alice")


class Lookups:
    """A backend's user_by_id whose answers the test gives, one Deferred per call."""

    def __init__(self):
        self.asked: list[str] = []
        self.pending: list[Deferred] = []

    def __call__(self, sub: str) -> Deferred:
        self.asked.append(sub)
        d: Deferred = Deferred()
        self.pending.append(d)
        return d


def answered(d: Deferred):
    results: list = []
    d.addBoth(results.append)
    assert results, "not answered yet"
    return results[0]


def test_kept_for_the_configured_time_then_asked_again():
    clock, lookups = Clock(), Lookups()
    cache = StandingCache(clock, 30)
    first = cache.user_by_id(ALICE.sub, lookups)
    lookups.pending[0].callback(ALICE)
    assert answered(first) == ALICE
    clock.advance(29.9)
    assert answered(cache.user_by_id(ALICE.sub, lookups)) == ALICE
    assert lookups.asked == [ALICE.sub]
    clock.advance(0.1)
    again = cache.user_by_id(ALICE.sub, lookups)
    assert lookups.asked == [ALICE.sub, ALICE.sub]
    disabled = User(sub=ALICE.sub, login="alice", disabled=True)
    lookups.pending[1].callback(disabled)
    assert answered(again) == disabled


def test_unknown_users_are_kept_shorter():
    clock, lookups = Clock(), Lookups()
    cache = StandingCache(clock, 60)
    d = cache.user_by_id("gone", lookups)
    lookups.pending[0].callback(None)
    assert answered(d) is None
    clock.advance(NEGATIVE_SECONDS - 0.5)
    assert answered(cache.user_by_id("gone", lookups)) is None
    assert len(lookups.asked) == 1
    clock.advance(0.5)
    cache.user_by_id("gone", lookups)
    assert len(lookups.asked) == 2


def test_a_short_cache_keeps_unknown_users_no_longer_than_known_ones():
    clock, lookups = Clock(), Lookups()
    cache = StandingCache(clock, 2)
    cache.user_by_id("gone", lookups)
    lookups.pending[0].callback(None)
    clock.advance(2)
    cache.user_by_id("gone", lookups)
    assert len(lookups.asked) == 2


def test_concurrent_misses_share_one_lookup():
    clock, lookups = Clock(), Lookups()
    cache = StandingCache(clock, 30)
    waiting = [cache.user_by_id(ALICE.sub, lookups) for _ in range(50)]
    assert lookups.asked == [ALICE.sub]
    lookups.pending[0].callback(ALICE)
    assert [answered(d) for d in waiting] == [ALICE] * 50


def test_a_failure_reaches_every_waiter_and_is_not_kept():
    clock, lookups = Clock(), Lookups()
    cache = StandingCache(clock, 30)
    waiting = [cache.user_by_id(ALICE.sub, lookups) for _ in range(3)]
    lookups.pending[0].errback(BackendUnavailable("directory down"))
    for d in waiting:
        with pytest.raises(BackendUnavailable):
            answered(d).raiseException()
    after = cache.user_by_id(ALICE.sub, lookups)
    assert len(lookups.asked) == 2
    lookups.pending[1].callback(ALICE)
    assert answered(after) == ALICE


def test_a_cancelled_waiter_leaves_the_others_their_answer():
    clock, lookups = Clock(), Lookups()
    cache = StandingCache(clock, 30)
    impatient, patient = cache.user_by_id(ALICE.sub, lookups), cache.user_by_id(ALICE.sub, lookups)
    impatient.cancel()
    assert answered(impatient).check(CancelledError)
    lookups.pending[0].callback(ALICE)
    assert answered(patient) == ALICE


def test_bounded_least_recently_used_go_first():
    clock = Clock()
    cache = StandingCache(clock, 30, size=2)
    asked: list[str] = []

    def lookup(sub):
        asked.append(sub)
        return succeed(User(sub=sub, login=sub))

    for sub in ("a", "b", "a", "c"):
        cache.user_by_id(sub, lookup)
    assert asked == ["a", "b", "c"]
    cache.user_by_id("a", lookup)
    assert asked == ["a", "b", "c"], "a was used after b, so b went"
    cache.user_by_id("b", lookup)
    assert asked == ["a", "b", "c", "b"]
    assert len(cache._entries) == 2


def test_forget_drops_the_entry_and_a_lookup_under_way():
    clock, lookups = Clock(), Lookups()
    cache = StandingCache(clock, 30)
    cache.user_by_id(ALICE.sub, lookups)
    lookups.pending[0].callback(ALICE)
    cache.forget(ALICE.sub)
    stale = cache.user_by_id(ALICE.sub, lookups)
    cache.forget(ALICE.sub)
    fresh = cache.user_by_id(ALICE.sub, lookups)
    assert len(lookups.asked) == 3
    disabled = User(sub=ALICE.sub, login="alice", disabled=True)
    lookups.pending[2].callback(disabled)
    lookups.pending[1].callback(ALICE)
    assert (answered(stale), answered(fresh)) == (ALICE, disabled)
    assert answered(cache.user_by_id(ALICE.sub, lookups)) == disabled, "the older answer was not kept"
    assert len(lookups.asked) == 3
