"""
Rate limits (docs/design.md, Rate limits): token buckets refill and burst on a
L{Clock}; which bucket a request counts against (its authenticated client
at its own rate, "off", first-party exemption, unknown ids and wrong
secrets by address, public clients per address); bounded tables; the
[rate_limits] config; and the 429 each endpoint answers, in its own error
shape, with Retry-After and one audit event per bucket a minute.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.task import Clock

from authsrv.config import parse_config
from authsrv.configsection import ConfigError
from authsrv.flows.clients import ClientCache
from authsrv.protocol.forwarded import address_key
from authsrv.flows.ratelimit import (
    REPORT_WINDOW, Buckets, ClientRateLimits, EndpointLimit, RateLimited, RateSettings,
)
from authsrv.protocol.rates import Rate
from authsrv.records import Client
from authsrv.testing.memory import MemoryStore
from authsrv.tokens import token_hash
from authsrv.web.internal import InternalAPI
from harness import CLIENTS, INTERNAL_SECRET, Harness, settle
from token_helpers import INTROSPECT, REVOKE, TOKEN, USERINFO, basic, header, post_form

SECRET = "s3cret"


def client(client_id: str, *, secret: str | None = SECRET, **fields) -> Client:
    return Client(client_id=client_id, secret_hash=token_hash(secret) if secret else None,
                  redirect_uris=["https://app.example/cb"], **fields)


def form(client_id: str, secret: str | None = SECRET) -> dict[str, str]:
    return {"client_id": client_id, **({"client_secret": secret} if secret else {})}


async def limits(*clients: Client, **settings) -> tuple[Clock, ClientRateLimits]:
    clock = Clock()
    clock.advance(1_000_000)
    store = MemoryStore()
    for c in clients:
        await store.put_client(c)
    rates = ClientRateLimits(clock=clock, clients=ClientCache(store, clock),
                             settings=RateSettings(**settings), max_keys=50)
    return clock, rates


async def allowed(rates: ClientRateLimits, params: dict, address: str = "192.0.2.1", times: int = 1) -> int:
    """How many of C{times} introspection requests pass."""
    passed = 0
    for _ in range(times):
        try:
            await rates.client_request(rates.introspection, None, params, lambda: address)
            passed += 1
        except RateLimited:
            pass
    return passed


# --- buckets -------------------------------------------------------------------------


def test_burst_then_refill_at_the_rate():
    buckets = Buckets()
    rate = Rate(3, 1)
    assert [buckets.take("k", rate, 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("k", rate, 100.0) == pytest.approx(1 / 3)
    assert buckets.take("k", rate, 100.34) == 0.0
    # A long pause refills to the burst, no more.
    assert [buckets.take("k", rate, 200.0) for _ in range(4)][-1] > 0
    assert buckets.take("k", Rate(600, 60), 200.0 + 0.05) == pytest.approx(0.05)


def test_clock_going_back_gives_nothing():
    buckets = Buckets()
    rate = Rate(1, 10)
    assert buckets.take("k", rate, 100.0) == 0.0
    assert buckets.take("k", rate, 50.0) == pytest.approx(10.0)


def test_idle_buckets_are_dropped_and_the_table_has_a_cap():
    buckets = Buckets(max_keys=10)
    rate = Rate(1, 1)
    for n in range(10):
        buckets.take(f"old{n}", rate, 100.0)
    # Full again a second later: new keys sweep them out a few at a time.
    for n in range(10):
        buckets.take(f"new{n}", rate, 102.0)
    assert len(buckets) <= 10
    assert buckets.take("old0", rate, 102.0) == 0.0
    # All busy: still never more than the cap.
    for n in range(100):
        buckets.take(f"busy{n}", rate, 102.5)
        assert len(buckets) <= 10


def test_ipv6_addresses_share_their_64():
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::2") == "2001:db8:1:2::"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("192.0.2.1") == "192.0.2.1"
    assert address_key("unknown") == "unknown"


def test_endpoint_limit_says_when_to_retry_in_whole_seconds(audit):
    clock = Clock()
    limit = EndpointLimit("internal", clock)
    limit.address("192.0.2.1", Rate(1, 60))
    with pytest.raises(RateLimited) as refused:
        limit.address("192.0.2.1", Rate(1, 60))
    assert refused.value.retry_after == 60
    clock.advance(59.5)
    with pytest.raises(RateLimited) as refused:
        limit.address("192.0.2.1", Rate(1, 60))
    assert refused.value.retry_after == 1
    limit.address("192.0.2.1", None)  # off


# --- which bucket --------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_each_client_has_its_own_bucket_at_its_own_rate():
    clock, rates = await limits(client("a"), client("b"), client("fast", rate_limit="10/s"),
                                default=Rate(2, 1))
    assert await allowed(rates, form("a"), times=5) == 2
    assert await allowed(rates, form("b"), times=5) == 2
    assert await allowed(rates, form("fast"), times=15) == 10
    clock.advance(0.5)
    assert await allowed(rates, form("a"), times=5) == 1
    assert await allowed(rates, form("fast"), times=15) == 5


@pytest_twisted.ensureDeferred
async def test_off_and_first_party_exemption():
    _, rates = await limits(client("free", rate_limit="off"), client("own", first_party=True),
                            default=Rate(1, 60), exempt_first_party=True)
    assert await allowed(rates, form("free"), times=50) == 50
    assert await allowed(rates, form("own"), times=50) == 50
    _, rates = await limits(client("own", first_party=True), default=Rate(1, 60))
    assert await allowed(rates, form("own"), times=3) == 1
    _, rates = await limits(client("a"), default=None)
    assert await allowed(rates, form("a"), times=50) == 50
    assert await allowed(rates, form("nobody"), times=50) == 50


@pytest_twisted.ensureDeferred
async def test_unknown_ids_and_wrong_secrets_count_by_address():
    _, rates = await limits(client("a"), default=Rate(3, 60))
    for n in range(3):
        assert await allowed(rates, form(f"junk-{n}")) == 1
    assert await allowed(rates, form("junk-more")) == 0
    assert await allowed(rates, form("a", "wrong")) == 0
    # Junk ids grow nothing: one bucket for the address.
    assert len(rates.introspection.by_address) == 1
    assert len(rates.introspection.by_client) == 0
    # Neither spent the real client's bucket, nor another address's.
    assert await allowed(rates, form("a"), times=5) == 3
    assert await allowed(rates, form("junk-0"), address="192.0.2.2") == 1


@pytest_twisted.ensureDeferred
async def test_basic_authentication_names_the_client():
    _, rates = await limits(client("a"), default=Rate(1, 60))
    authorization = basic("a", SECRET)["Authorization"].encode()
    await rates.client_request(rates.token, authorization, {}, lambda: "192.0.2.1")
    with pytest.raises(RateLimited):
        await rates.client_request(rates.token, authorization, {}, lambda: "192.0.2.9")
    # Each endpoint has its own buckets.
    await rates.client_request(rates.revocation, authorization, {}, lambda: "192.0.2.1")


@pytest_twisted.ensureDeferred
async def test_the_client_checked_in_full_is_handed_on_and_no_other():
    _, rates = await limits(client("a"), client("spa", secret=None), client("free", rate_limit="off"),
                            client("own", first_party=True), default=Rate(100, 60), exempt_first_party=True)
    authorization = basic("a", SECRET)["Authorization"].encode()

    async def checked(authorization, params):
        found = await rates.client_request(rates.token, authorization, params, lambda: "192.0.2.1")
        return None if found is None else found.client_id

    assert await checked(authorization, {}) == "a"
    assert await checked(None, form("a")) == "a"
    assert await checked(None, form("spa", None)) == "spa"
    assert await checked(None, form("free")) == "free"
    assert await checked(None, form("own")) == "own"
    assert await checked(None, form("a", "wrong")) is None
    assert await checked(None, form("nobody")) is None
    assert await checked(basic("a", "wrong")["Authorization"].encode(), {}) is None


@pytest_twisted.ensureDeferred
async def test_an_endpoint_checks_a_client_secret_once_per_request(tmp_path, monkeypatch):
    """The rate limiter's check is the endpoint's: the secret's hashes are computed once a request."""
    import authsrv.protocol.clientauth as clientauth

    compared = []
    real = clientauth.secret_matches
    monkeypatch.setattr(clientauth, "secret_matches", lambda *args: (compared.append(len(args[1])), real(*args))[1])
    h = await harness(tmp_path, monkeypatch, default="100/m")
    try:
        for path, fields, code in ((TOKEN, {"grant_type": "refresh_token", "refresh_token": "x"}, 400),
                                   (INTROSPECT, {"token": "x"}, 200), (REVOKE, {"token": "x"}, 200)):
            for method in ("post", "basic"):
                compared.clear()
                response, body = await post_form(h, path, fields, client_id="partner", method=method)
                assert response.code == code and (body or {}).get("error") in (None, "invalid_grant"), path
                # One check, of the current secret and the previous one (or the current again).
                assert compared == [2], path
        response, body = await post_form(h, INTROSPECT, {"token": "x"}, client_id=None,
                                         headers=basic("partner", "wrong"))
        assert response.code == 401 and body["error"] == "invalid_client"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_public_clients_count_per_address():
    _, rates = await limits(client("spa", secret=None), default=Rate(2, 60))
    assert await allowed(rates, form("spa", None), address="192.0.2.1", times=5) == 2
    assert await allowed(rates, form("spa", None), address="192.0.2.2", times=5) == 2
    # ... and apart from the same address's unknown ids.
    assert await allowed(rates, form("junk"), address="192.0.2.1", times=5) == 2


@pytest_twisted.ensureDeferred
async def test_cycling_public_client_ids_multiplies_nothing():
    """Code and refresh token guesses from one address: one bucket whichever public clients they name."""
    spas = [client(f"spa{n}", secret=None) for n in range(5)]
    clock, rates = await limits(*spas, client("roomy", secret=None, rate_limit="4/m"), default=Rate(2, 60))
    passed = [await allowed(rates, form(f"spa{n}", None), times=2) for n in range(5)]
    assert passed == [2, 0, 0, 0, 0]
    # One with a higher rate refills the same bucket at its own rate: the most an address gets is the highest.
    assert await allowed(rates, form("roomy", None), times=5) == 0
    clock.advance(30)
    assert await allowed(rates, form("roomy", None), times=5) == 2
    assert await allowed(rates, form("spa1", None), times=5) == 0
    assert len(rates.introspection.by_address) == 1
    assert await allowed(rates, form("spa0", None), address="192.0.2.2") == 1


def test_userinfo_counts_by_address():
    clock = Clock()
    rates = ClientRateLimits(clock=clock, clients=None, settings=RateSettings(default=Rate(1, 1)))
    rates.userinfo_request("192.0.2.1")
    rates.userinfo_request("192.0.2.2")
    with pytest.raises(RateLimited):
        rates.userinfo_request("192.0.2.1")
    clock.advance(1)
    rates.userinfo_request("192.0.2.1")


# --- config ------------------------------------------------------------------------


def test_config_defaults_and_values(tmp_path):
    assert parse_config({}, None).rate_limits == RateSettings(Rate(100, 1), Rate(100, 1), False)
    config = parse_config({"rate_limits": {"default": "600/m", "internal": "off", "exempt_first_party": True},
                           "clients": [{"client_id": "a", "redirect_uris": ["https://a.example/cb"],
                                        "rate_limit": "5/s"}]}, None)
    assert config.rate_limits == RateSettings(Rate(600, 60), None, True)
    assert config.clients[0].rate_limit == "5/s"


@pytest.mark.parametrize("section, key", [
    ({"default": "fast"}, "rate_limits.default"),
    ({"internal": "10/d"}, "rate_limits.internal"),
    ({"default": 100}, "rate_limits.default"),
    ({"exempt_first_party": "yes"}, "rate_limits.exempt_first_party"),
    ({"burst": 5}, "rate_limits.burst"),
])
def test_config_mistakes_name_the_key(section, key):
    with pytest.raises(ConfigError) as e:
        parse_config({"rate_limits": section}, None)
    assert e.value.key == key


# --- each endpoint over its rate, in memory -------------------------------------------------

PROXIED = {"server": {"trusted_proxies": ["127.0.0.1/32"]}}


def from_address(address: str) -> dict:
    return {"X-Forwarded-For": address}


async def harness(tmp_path, monkeypatch, **rate_limits) -> Harness:
    clients = [{**c, "rate_limit": "off"} if c["client_id"] == "gateway" else c for c in CLIENTS]
    return await Harness(tmp_path, monkeypatch,
                         {**PROXIED, "clients": clients, "rate_limits": rate_limits}).start()


def assert_oauth_429(response, body, retry_after: str):
    assert response.code == 429
    assert header(response, "retry-after") == [retry_after]
    assert header(response, "cache-control") == ["no-store"]
    unit = "second" if retry_after == "1" else "seconds"
    assert body == {"error": "too_many_requests",
                    "error_description": f"too many requests; try again in {retry_after} {unit}"}


@pytest_twisted.ensureDeferred
async def test_oauth_endpoints_answer_429(tmp_path, monkeypatch, audit):
    h = await harness(tmp_path, monkeypatch, default="2/m")
    try:
        for path, fields in ((TOKEN, {"grant_type": "client_credentials"}), (INTROSPECT, {"token": "x"}),
                             (REVOKE, {"token": "x"})):
            for _ in range(2):
                response, _ = await post_form(h, path, fields, client_id="partner")
                assert response.code != 429
            response, body = await post_form(h, path, fields, client_id="partner")
            assert_oauth_429(response, body, "30")
            response, body = await post_form(h, path, fields, client_id="partner")
            assert response.code == 429
        # The gateway is "off"; another client has its own bucket.
        for _ in range(5):
            response, _ = await post_form(h, INTROSPECT, {"token": "x"}, client_id="gateway")
            assert response.code == 200
        response, _ = await post_form(h, INTROSPECT, {"token": "x"}, client_id="first")
        assert response.code == 200
        # One event per bucket, not per refusal.
        events = audit.of("rate.limited")
        assert [(e["endpoint"], e["client_id"]) for e in events] == [
            ("token", "partner"), ("introspection", "partner"), ("revocation", "partner")]
        assert events[0]["retry_after"] == 30
        h.clock.advance(30)
        response, _ = await post_form(h, INTROSPECT, {"token": "x"}, client_id="partner")
        assert response.code == 200
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_forwarding_headers_of_an_untrusted_peer_choose_no_bucket(tmp_path, monkeypatch):
    """
    Guesses of refresh tokens for a public client, or under unknown ids,
    each naming another X-Forwarded-For: from a peer that is no trusted
    proxy, every one counts against the peer's own address.
    """
    h = await Harness(tmp_path, monkeypatch, {"clients": CLIENTS, "rate_limits": {"default": "3/m"}}).start()
    try:
        guess = {"grant_type": "refresh_token", "refresh_token": "guess"}
        for client_id in ("spa", None):
            codes = []
            for n in range(6):
                fields = {**guess, "client_id": client_id or f"junk-{n}"}
                response, _ = await post_form(h, TOKEN, fields, client_id=None,
                                              headers=from_address(f"198.51.100.{n}"))
                codes.append(response.code)
            assert codes == [400, 400, 400, 429, 429, 429] if client_id else [401, 401, 401, 429, 429, 429], codes
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_userinfo_answers_429_by_address(tmp_path, monkeypatch, audit):
    h = await harness(tmp_path, monkeypatch, default="1/s")
    try:
        bearer = {"Authorization": "Bearer not-a-token"}
        response, _ = await h.json("GET", USERINFO, headers={**bearer, **from_address("192.0.2.1")})
        assert response.code == 401
        response, body = await h.json("GET", USERINFO, headers={**bearer, **from_address("192.0.2.1")})
        assert_oauth_429(response, body, "1")
        assert header(response, "access-control-allow-origin") == ["*"]
        response, _ = await h.json("GET", USERINFO, headers={**bearer, **from_address("192.0.2.2")})
        assert response.code == 401
        [event] = audit.of("rate.limited")
        assert (event["endpoint"], event["address"], event["client_id"]) == ("userinfo", "192.0.2.1", None)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_internal_api_callers_without_the_secret_do_not_spend_the_rate_of_those_with_it(tmp_path, monkeypatch):
    """
    Another service on the first-party app's host (or behind its NAT) that
    sends a stale secret, or anyone else at that address, is limited on its
    own: its 401s do not leave the app with 429s on every session check.
    """
    h = await harness(tmp_path, monkeypatch)
    try:
        internal = InternalAPI(reactor=h.clock, secret=INTERNAL_SECRET, store=h.store, identity=h.identity,
                               chat_tokens=h.chat_tokens, rate=Rate(2, 10), trusted_proxies=h.config.trusted_proxies)
        http = StubTreq(internal.resource())

        async def call(secret: str) -> int:
            headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json",
                       **from_address("192.0.2.1")}
            response = await settle(http, http.post("http://127.0.0.1/api/internal/user-access",
                                                 data=json.dumps({"userId": "nobody"}).encode(), headers=headers))
            await settle(http, response.content())
            return response.code

        assert [await call("a-stale-secret") for _ in range(3)] == [401, 401, 429]
        assert [await call(INTERNAL_SECRET) for _ in range(3)] == [404, 404, 429]
        assert await call("a-stale-secret") == 429
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_internal_api_answers_429_by_address(tmp_path, monkeypatch, audit):
    h = await harness(tmp_path, monkeypatch)
    try:
        internal = InternalAPI(reactor=h.clock, secret=INTERNAL_SECRET, store=h.store, identity=h.identity,
                               chat_tokens=h.chat_tokens, rate=Rate(2, 10), trusted_proxies=h.config.trusted_proxies)
        http = StubTreq(internal.resource())

        async def call(address: str):
            headers = {"Authorization": f"Bearer {INTERNAL_SECRET}", "Content-Type": "application/json",
                       **from_address(address)}
            response = await settle(http, http.post("http://127.0.0.1/api/internal/user-access",
                                                 data=json.dumps({"userId": "nobody"}).encode(), headers=headers))
            return response, json.loads(await settle(http, response.content()))

        for _ in range(2):
            response, body = await call("192.0.2.1")
            assert response.code == 404
        response, body = await call("192.0.2.1")
        assert response.code == 429
        assert header(response, "retry-after") == ["5"]
        assert body == {"error": "too_many_requests", "message": "too many requests; try again in 5 seconds"}
        response, _ = await call("192.0.2.2")
        assert response.code == 404
        assert [e["endpoint"] for e in audit.of("rate.limited")] == ["internal"]
        h.clock.advance(REPORT_WINDOW)
        statuses = [(await call("192.0.2.1"))[0].code for _ in range(3)]
        assert statuses == [404, 404, 429]
        assert len(audit.of("rate.limited")) == 2
    finally:
        await h.close()
