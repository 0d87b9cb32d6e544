"""
Anonymous authorization requests waiting for the login form: capped per
client address (the forwarded client behind a trusted proxy, never the
proxy), refused past the cap with a 429 page that says when to retry, and
kept for C{login_request_ttl} while a request waiting for consent keeps
C{pending_request_ttl}.
"""

from __future__ import annotations

import pytest_twisted

from authsrv.records import LOGIN_STAGE
from authsrv.testing.identity import ALICE, PASSWORDS

from flow_client import Browser, hidden_fields, location, login_url, shows_login_form
from harness import Harness, query_of

PROXIED = {"server": {"trusted_proxies": ["127.0.0.1", "10.0.0.0/8"]}}


async def authorize_from(browser: Browser, address: str, **params):
    """An authorization request a trusted proxy forwarded for C{address}."""
    return await browser.request("GET", browser.h.authorize_url(**params),
                                 headers={"X-Forwarded-For": f"{address}, 10.0.0.2"})


@pytest_twisted.ensureDeferred
async def test_past_the_cap_one_address_gets_a_page_while_another_signs_in(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, {**PROXIED, "limits": {"pending_per_address": 3}}).start()
    try:
        waiting = []
        for n in range(3):
            browser = Browser(h)
            response, body = await authorize_from(browser, "203.0.113.9")
            assert shows_login_form(response, body)
            waiting.append((browser, login_url(body)))
            stored = await h.store.get_interaction(hidden_fields(body)["request"], h.now())
            assert (stored.stage, stored.address) == (LOGIN_STAGE, "203.0.113.9")
        h.clock.advance(60)

        response, body = await authorize_from(Browser(h), "203.0.113.9")
        assert response.code == 429
        assert response.headers.getRawHeaders(b"retry-after") == [b"540"]
        assert response.headers.getRawHeaders(b"location") is None
        assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/html")
        assert b"Too many sign-ins are in progress from your network" in body
        assert b"wait 9 minutes" in body

        stranger = Browser(h)
        response, body = await authorize_from(stranger, "198.51.100.20")
        assert shows_login_form(response, body)
        response, _ = await stranger.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "code" in query_of(location(response))

        browser, page = waiting[0]
        response, _ = await browser.submit_login(page, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "code" in query_of(location(response))
        assert shows_login_form(*await authorize_from(Browser(h), "203.0.113.9")), "a finished sign-in frees its place"
        response, _ = await authorize_from(Browser(h), "203.0.113.9")
        assert response.code == 429

        h.clock.advance(h.config.limits.login_request_ttl - 60)
        assert shows_login_form(*await authorize_from(Browser(h), "203.0.113.9")), "the first ones have expired"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_without_trusted_proxies_the_peer_is_counted(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, {"limits": {"pending_per_address": 1}}).start()
    try:
        response, body = await authorize_from(Browser(h), "203.0.113.9")
        assert shows_login_form(response, body)
        stored = await h.store.get_interaction(hidden_fields(body)["request"], h.now())
        assert stored.address == "127.0.0.1"
        response, body = await authorize_from(Browser(h), "198.51.100.20")
        assert response.code == 429 and b"wait 10 minutes" in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_signed_in_browser_is_not_counted(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, {"limits": {"pending_per_address": 1}}).start()
    try:
        browser = Browser(h)
        assert "code" in await browser.sign_in(ALICE)
        for _ in range(3):
            response, _ = await browser.authorize()
            assert response.code == 302 and "code" in query_of(location(response))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_cap_of_zero_is_no_cap(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, {"limits": {"pending_per_address": 0}}).start()
    try:
        for _ in range(3):
            assert shows_login_form(*await Browser(h).authorize())
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_login_request_lives_shorter_than_one_waiting_for_consent(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        limits = h.config.limits
        assert limits.login_request_ttl < limits.pending_request_ttl
        browser = Browser(h)
        response, body = await browser.authorize("partner")
        h.clock.advance(limits.login_request_ttl - 1)
        response, _ = await browser.submit_login(login_url(body), ALICE.login, PASSWORDS[ALICE.sub])
        consent_url = location(response)
        assert response.code == 303 and "/consent?" in consent_url

        late_login = Browser(h)
        response, body = await late_login.authorize("partner")
        abandoned = login_url(body)
        h.clock.advance(limits.login_request_ttl + 1)
        response, body = await late_login.get(abandoned)
        assert response.code == 400 and b"took too long" in body
        response, body = await browser.get(consent_url)
        assert response.code == 200 and b'name="action"' in body
    finally:
        await h.close()
