"""
The password check with the store's throttle (PasswordLogin), driven with
client addresses of our choosing: a parallel burst checks no more passwords
than the limit, a distributed attack on one account never keeps out a
browser that signed in to it before, and the queue of checks is bounded.
"""

from __future__ import annotations

import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults

from authsrv.flows.login import LoggedIn, PasswordLogin, Refused, Throttled, Unavailable
from authsrv.records import ThrottlePolicy
from authsrv.testing.identity import ALICE, PASSWORDS

from flow_client import Browser, hidden_fields
from harness import ISSUER, Harness


def counting(h: Harness, monkeypatch) -> list:
    """The password checks the identity backend is asked for."""
    checks: list = []
    real = h.identity.requestAvatarId
    monkeypatch.setattr(h.identity, "requestAvatarId", lambda c: checks.append(c) or real(c))
    return checks


def attempt(login: PasswordLogin, h: Harness, password: str, address: str, device: str | None = None):
    return Deferred.fromCoroutine(login.log_in("alice", password, address, device, h.clock.seconds()))


@pytest_twisted.ensureDeferred
async def test_a_parallel_burst_checks_no_more_passwords_than_the_limit(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        checks = counting(h, monkeypatch)
        login = PasswordLogin(identity=h.identity, store=h.store, policy=ThrottlePolicy(checks_per_address=100))
        outcomes = await gatherResults([attempt(login, h, "guess", "198.51.100.7") for _ in range(12)])
        assert sum(isinstance(o, Refused) for o in outcomes) == 5
        assert sum(isinstance(o, Throttled) for o in outcomes) == 7
        assert len(checks) == 5
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_distributed_attack_never_keeps_out_a_known_browser(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        policy = ThrottlePolicy(failures_per_account=6)
        login = PasswordLogin(identity=h.identity, store=h.store, policy=policy)
        device = "d" * 43
        assert isinstance(await attempt(login, h, PASSWORDS[ALICE.sub], "192.0.2.1", device), LoggedIn)
        for n in range(6):
            assert isinstance(await attempt(login, h, "guess", f"203.0.113.{n}"), Refused)
        checks = counting(h, monkeypatch)
        stranger = await attempt(login, h, PASSWORDS[ALICE.sub], "203.0.113.99", "e" * 43)
        assert isinstance(stranger, Throttled) and stranger.retry_after == 15 * 60
        assert checks == []
        assert isinstance(await attempt(login, h, PASSWORDS[ALICE.sub], "192.0.2.1", device), LoggedIn)
        assert isinstance(await attempt(login, h, PASSWORDS[ALICE.sub], "192.0.2.200", device), LoggedIn)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_queue_of_password_checks_is_bounded(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        login = PasswordLogin(identity=h.identity, store=h.store,
                              policy=ThrottlePolicy(checks_per_address=1, checks_in_flight=2))
        first = attempt(login, h, "guess", "192.0.2.1")
        same_address = await attempt(login, h, "guess", "192.0.2.1")
        assert isinstance(same_address, Throttled)
        second = attempt(login, h, "guess", "192.0.2.2")
        assert isinstance(await attempt(login, h, "guess", "192.0.2.3"), Unavailable)
        assert [type(o) for o in await gatherResults([first, second])] == [Refused, Refused]
        assert isinstance(await attempt(login, h, "guess", "192.0.2.3"), Refused)
    finally:
        await h.close()


async def _login_from(browser: Browser, address: str, login: str, password: str):
    """Submit the login form as a request a trusted proxy forwarded for C{address}."""
    response, body = await browser.authorize("first", prompt="login")
    fields = {**hidden_fields(body), "username": login, "password": password}
    return await browser.request("POST", ISSUER + "/login", data=fields,
                                 headers={"X-Forwarded-For": f"{address}, 10.0.0.2"})


@pytest_twisted.ensureDeferred
async def test_behind_a_trusted_proxy_a_flood_from_one_client_keeps_no_one_else_out(tmp_path, monkeypatch, audit):
    h = await Harness(tmp_path, monkeypatch,
                      {"server": {"trusted_proxies": ["127.0.0.1", "10.0.0.0/8"]},
                       "throttle": {"failures_per_address": 10}}).start()
    try:
        attacker = Browser(h)
        for n in range(12):
            response, _ = await _login_from(attacker, "203.0.113.9", f"user{n % 3}", "guess")
        assert response.code == 429
        response, _ = await _login_from(Browser(h), "198.51.100.20", "alice", PASSWORDS[ALICE.sub])
        assert response.code == 303
        addresses = {e["address"] for e in audit.of("login.failed") + audit.of("login.throttled")}
        assert addresses == {"203.0.113.9"}
        assert audit.of("login.succeeded")[-1]["address"] == "198.51.100.20"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_forwarding_headers_from_an_untrusted_peer_are_ignored(tmp_path, monkeypatch, audit):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        await _login_from(Browser(h), "203.0.113.9", "alice", "guess")
        assert audit.of("login.failed")[-1]["address"] == "127.0.0.1"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_ipv6_host_cannot_escape_its_count_by_changing_addresses(tmp_path, monkeypatch):
    """Addresses of one /64 count as one: a host usually holds the whole block."""
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        login = PasswordLogin(identity=h.identity, store=h.store, policy=ThrottlePolicy())
        for n in range(5):
            assert isinstance(await attempt(login, h, "guess", f"2001:db8:7:1::{n + 1}"), Refused)
        assert isinstance(await attempt(login, h, PASSWORDS[ALICE.sub], "2001:db8:7:1:ffff::9"), Throttled)
        assert isinstance(await attempt(login, h, PASSWORDS[ALICE.sub], "2001:db8:7:2::1"), LoggedIn)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_every_spelling_the_backends_take_as_one_login_shares_one_count(tmp_path, monkeypatch):
    """
    "ﬁ" and a combining accent casefold to "fi" and an accent that NFC then
    composes: the backends compare "fíona" so, and once the throttle counted
    that spelling apart from the plain one, five more guesses went free.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        counted = []
        attempt_of_store = h.store.attempt
        monkeypatch.setattr(h.store, "attempt", lambda account, *rest: counted.append(account) or attempt_of_store(
            account, *rest))
        login = PasswordLogin(identity=h.identity, store=h.store, policy=ThrottlePolicy())
        for spelling in ("f\u00edona", "F\u00cdONA", "fi\u0301ona", "\ufb01\u0301ona"):
            assert isinstance(await login.log_in(spelling, "guess", "198.51.100.7", None, h.clock.seconds()), Refused)
        assert set(counted) == {"f\u00edona"}
    finally:
        await h.close()
