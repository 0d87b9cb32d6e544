"""
How many store calls each hot request makes, once the client cache is warm:
a code exchange finds the code (bringing its grant and the user's ban)
and redeems it, writing the tokens; a refresh looks the token up (with its grant and the
ban) and rotates it; introspection and UserInfo make one lookup each. A
change that adds a round trip to these paths fails here before it shows in
the benchmark.
"""

from __future__ import annotations

from collections import Counter

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from harness import Harness
from token_helpers import USERINFO, exchange, introspect, refresh, save_code, tokens


@pytest.fixture
def h(tmp_path, monkeypatch):
    harness = Harness(tmp_path, monkeypatch)
    yield harness
    pytest_twisted.blockon(Deferred.fromCoroutine(harness.close()))


def counted(monkeypatch, store) -> Counter:
    """Every public call on C{store}, by name, from now on."""
    calls: Counter = Counter()
    for name in dir(store):
        method = getattr(store, name)
        if name.startswith("_") or not callable(method):
            continue

        def counting(*args, _name=name, _method=method, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(store, name, counting)
    return calls


@pytest_twisted.ensureDeferred
async def test_the_hot_paths_make_one_round_trip_per_step(h, monkeypatch):
    await h.start()
    warm = await tokens(h)
    assert (await refresh(h, warm["refresh_token"]))[0].code == 200
    await introspect(h, warm["access_token"])  # the introspecting client, cached too
    code, verifier = await save_code(h)

    calls = counted(monkeypatch, h.store)
    response, body = await exchange(h, code, verifier)
    assert response.code == 200, body
    assert calls == Counter(find_code=1, redeem_code=1), calls

    calls.clear()
    response, rotated = await refresh(h, body["refresh_token"])
    assert response.code == 200, rotated
    assert calls == Counter(get_refresh_token=1, rotate_refresh=1), calls

    calls.clear()
    assert (await introspect(h, rotated["access_token"]))["active"] is True
    assert calls == Counter(find_access_token=1), calls

    calls.clear()
    response, _ = await h.json("GET", USERINFO, headers={"Authorization": f"Bearer {rotated['access_token']}"})
    assert response.code == 200
    assert calls == Counter(find_access_token=1), calls
