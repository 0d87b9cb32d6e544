"""
Store calls awaited together (authsrv.flows.together): every result in
order, and a failure raised as the store raised it, so the pages' and
endpoints' handling of store errors (an outage is a 503) holds for calls
sent together as for one call.
"""

from __future__ import annotations

import pytest
from twisted.internet.defer import Deferred, succeed

from authsrv.flows.together import together
from authsrv.store.errors import StoreUnavailable


def outcome(d: Deferred):
    found: list = []
    d.addBoth(found.append)
    return found[0]


def test_the_results_come_in_the_order_sent():
    first, second = Deferred(), Deferred()
    gathered = Deferred.fromCoroutine(together([first, second, succeed("third")]))
    second.callback("second")
    first.callback("first")
    assert outcome(gathered) == ["first", "second", "third"]


def test_the_first_failure_in_order_is_raised_as_itself_once_all_have_ended():
    first, second = Deferred(), Deferred()
    gathered = Deferred.fromCoroutine(together([first, second]))
    second.errback(StoreUnavailable("the store is down"))
    assert not gathered.called
    first.errback(ValueError("later"))
    failure = outcome(gathered)
    assert failure.check(ValueError)
    assert outcome(first) is None and outcome(second) is None


def test_a_failure_among_successes():
    gathered = Deferred.fromCoroutine(together([succeed(1), Deferred.fromCoroutine(_fails())]))
    with pytest.raises(KeyError):
        outcome(gathered).raiseException()


async def _fails():
    raise KeyError("gone")
