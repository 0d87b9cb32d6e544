"""
Rate limits of client assertions (docs/design.md, Rate limits): a signature
costs far more to check than a secret, so an assertion's attempt is counted
against its address before the check, and a client over its own rate is
refused before it too. A burst of forged assertions checks no more
signatures than the address's rate; junk naming a real client spends none
of its bucket; a client under its rate has its signature checked once a
request, its jti used up once; an address over its rate gets the 429 shape
at every client-authenticated endpoint.
"""

from __future__ import annotations

import json
import uuid

import pytest
import pytest_twisted
from jwcrypto import jwk, jwt
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import Clock

import authsrv.protocol.client_assertion as client_assertion
from authsrv.flows.clients import AssertionChecker, ClientCache
from authsrv.flows.ratelimit import ClientRateLimits, RateLimited, RateSettings
from authsrv.protocol.errors import InvalidClient
from authsrv.protocol.rates import Rate
from authsrv.records import Client
from authsrv.testing.memory import MemoryStore

from harness import CLIENTS, ISSUER, Harness
from token_helpers import INTROSPECT, REVOKE, TOKEN

KEY = jwk.JWK.generate(kty="EC", crv="P-256", kid="k1")
FORGER = jwk.JWK.generate(kty="EC", crv="P-256", kid="k1")
PUBLIC = json.dumps({"keys": [json.loads(KEY.export_public())]})
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
ADDRESS = "192.0.2.1"


def assertion(now: int, *, key=KEY, iss="signer") -> dict[str, str]:
    token = jwt.JWT(header={"alg": "ES256", "kid": key.kid}, claims={
        "iss": iss, "sub": iss, "aud": ISSUER, "iat": now, "exp": now + 60, "jti": uuid.uuid4().hex})
    token.make_signed_token(key)
    return {"client_assertion_type": ASSERTION_TYPE, "client_assertion": token.serialize()}


@pytest.fixture
def checks(monkeypatch) -> list[str]:
    """The client of every assertion whose signature is checked."""
    checked: list[str] = []
    real = client_assertion.verified_claims

    def counting(assertion, client_id, *args, **kwargs):
        checked.append(client_id)
        return real(assertion, client_id, *args, **kwargs)

    monkeypatch.setattr("authsrv.flows.clients.verified_claims", counting)
    return checked


async def limits(**settings) -> tuple[Clock, ClientRateLimits]:
    clock = Clock()
    clock.advance(1_000_000)
    store = MemoryStore()
    await store.put_client(Client("signer", None, [], token_endpoint_auth_method="private_key_jwt", jwks=PUBLIC,
                                  grant_types=["client_credentials"]))
    await store.put_client(Client("other", None, [], token_endpoint_auth_method="private_key_jwt", jwks=PUBLIC,
                                  grant_types=["client_credentials"]))
    await store.put_client(Client("fast", None, [], token_endpoint_auth_method="private_key_jwt", jwks=PUBLIC,
                                  grant_types=["client_credentials"], rate_limit="10/m"))
    checker = AssertionChecker(store=store, documents=None, audiences=(ISSUER,))
    rates = ClientRateLimits(clock=clock, clients=ClientCache(store, clock, assertions=checker),
                             settings=RateSettings(**settings))
    return clock, rates


async def outcome(rates: ClientRateLimits, params: dict[str, str], address: str = ADDRESS) -> str:
    """What the limiter made of one introspection request: the client, "429", "401" or "endpoint"."""
    try:
        client = await rates.client_request(rates.introspection, None, params, lambda: address)
    except RateLimited:
        return "429"
    except InvalidClient:
        return "401"
    return "endpoint" if client is None else client.client_id


@pytest_twisted.ensureDeferred
async def test_forged_assertions_check_no_more_signatures_than_the_address_rate(checks):
    clock, rates = await limits(default=Rate(5, 60))
    now = int(clock.seconds())
    answers = [await outcome(rates, assertion(now, key=FORGER)) for _ in range(50)]
    assert answers == ["401"] * 5 + ["429"] * 45
    assert len(checks) == 5
    # Naming another client, or none this server knows, changes nothing: the address is spent.
    assert await outcome(rates, assertion(now, key=FORGER, iss="other")) == "429"
    assert await outcome(rates, assertion(now, iss="nobody")) == "429"
    assert len(checks) == 5
    # The real client, from its own address, still has all of its bucket.
    answers = [await outcome(rates, assertion(now), address="192.0.2.7") for _ in range(5)]
    assert answers == ["signer"] * 5
    assert len(checks) == 10
    # The address's rate comes back with time.
    clock.advance(12)
    assert await outcome(rates, assertion(now + 12, key=FORGER)) == "401"


@pytest_twisted.ensureDeferred
async def test_a_client_under_its_rate_is_checked_once_and_spends_only_its_own_bucket(checks):
    clock, rates = await limits(default=Rate(3, 60))
    now = int(clock.seconds())
    # Over the address's rate at its own: each attempt the address paid for is handed back once verified.
    answers = [await outcome(rates, assertion(now, iss="fast")) for _ in range(10)]
    assert answers == ["fast"] * 10 and checks == ["fast"] * 10
    # Over its own rate: refused before its signature is checked, its address untouched.
    assert await outcome(rates, assertion(now, iss="fast")) == "429"
    assert len(checks) == 10
    answers = [await outcome(rates, assertion(now)) for _ in range(3)]
    assert answers == ["signer"] * 3
    clock.advance(6)
    assert await outcome(rates, assertion(now + 6, iss="fast")) == "fast"


@pytest_twisted.ensureDeferred
async def test_an_assertion_checked_by_the_limiter_is_used_up_there():
    clock, rates = await limits(default=Rate(10, 60))
    params = assertion(int(clock.seconds()))
    assert await outcome(rates, params) == "signer"
    assert await outcome(rates, params) == "401"


@pytest_twisted.ensureDeferred
async def test_unlimited_still_checks_once(checks):
    clock, rates = await limits(default=None)
    now = int(clock.seconds())
    assert [await outcome(rates, assertion(now)) for _ in range(20)] == ["signer"] * 20
    assert [await outcome(rates, assertion(now, key=FORGER)) for _ in range(20)] == ["401"] * 20
    assert len(checks) == 40


SIGNER = {"client_id": "signer", "token_endpoint_auth_method": "private_key_jwt", "jwks": PUBLIC,
          "grant_types": ["client_credentials"]}


@pytest.fixture
def h(tmp_path, monkeypatch):
    harness = Harness(tmp_path, monkeypatch, {"clients": [*CLIENTS, SIGNER], "rate_limits": {"default": "2/m"}})
    yield harness
    pytest_twisted.blockon(Deferred.fromCoroutine(harness.close()))


@pytest_twisted.ensureDeferred
async def test_every_endpoint_checks_a_signature_once_and_refuses_a_spent_address_unchecked(h, checks):
    await h.start()
    for path, fields in ((TOKEN, {"grant_type": "client_credentials"}), (INTROSPECT, {"token": "x"}),
                         (REVOKE, {"token": "x"})):
        checks.clear()
        response, _ = await h.post(path, data={**assertion(h.now()), **fields})
        assert response.code == 200, path
        assert checks == ["signer"], path
        for _ in range(2):
            response, body = await h.json("POST", path, data={**assertion(h.now(), key=FORGER), **fields})
            assert response.code == 401 and body["error"] == "invalid_client", path
        response, body = await h.json("POST", path, data={**assertion(h.now(), key=FORGER), **fields})
        assert response.code == 429 and body["error"] == "too_many_requests", path
        assert response.headers.getRawHeaders(b"retry-after") == [b"30"]
        for _ in range(5):
            response, _ = await h.post(path, data={**assertion(h.now(), key=FORGER), **fields})
            assert response.code == 429, path
        assert len(checks) == 3, path


@pytest_twisted.ensureDeferred
async def test_a_burst_of_200_at_once_passes_no_limit(checks):
    """Counting takes no turn of the reactor: 200 requests at once get exactly the rate, whatever they send."""
    clock, rates = await limits(default=Rate(2, 60))
    now = int(clock.seconds())

    async def burst(key) -> list[str]:
        return sorted(await gatherResults([Deferred.fromCoroutine(outcome(rates, assertion(now, key=key)))
                                           for _ in range(200)]))

    assert await burst(FORGER) == ["401"] * 2 + ["429"] * 198
    assert len(checks) == 2
    clock.advance(60)
    assert await burst(KEY) == ["429"] * 198 + ["signer"] * 2
    assert len(checks) == 4


@pytest_twisted.ensureDeferred
async def test_a_key_set_being_fetched_holds_no_count_of_the_address(checks):
    """
    A jwks_uri client's requests at once, while its key set is fetched:
    the count is taken and handed back around the check alone, so none of
    them is refused for the address's rate; forged ones still check no
    more signatures than that rate.
    """
    waiting: list[Deferred] = []

    class Documents:
        def fetch(self, url, refetch=False):
            waiting.append(Deferred())
            return waiting[-1]

    clock = Clock()
    clock.advance(1_000_000)
    store = MemoryStore()
    await store.put_client(Client("remote", None, [], token_endpoint_auth_method="private_key_jwt",
                                  jwks_uri="https://keys.example/j", grant_types=["client_credentials"],
                                  rate_limit="20/m"))
    checker = AssertionChecker(store=store, documents=Documents(), audiences=(ISSUER,))
    rates = ClientRateLimits(clock=clock, clients=ClientCache(store, clock, assertions=checker),
                             settings=RateSettings(default=Rate(3, 60)))
    now = int(clock.seconds())
    for key, expected in ((KEY, ["remote"] * 10), (FORGER, ["401"] * 3 + ["429"] * 7)):
        answers = [Deferred.fromCoroutine(outcome(rates, assertion(now, key=key, iss="remote"))) for _ in range(10)]
        for fetch in waiting:
            fetch.callback(json.loads(PUBLIC))
        waiting.clear()
        assert sorted(await gatherResults(answers)) == expected
    assert len(checks) == 13
