"""
The login and consent pages in memory: one answer for every failed login,
throttling, bans, sessions and their cookies, consent remembered per scope
set, forms bound to the browser that was shown them, and expiry.
"""

from __future__ import annotations

from urllib.parse import quote_from_bytes

import attrs
import pytest
import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.defer import fail
from twisted.logger import formatEvent

from flow_client import Browser, fuzz, hidden_fields, location, login_url, on_reactor, shows_login_form
from harness import CHEAP, CLIENTS, ISSUER, Harness, pkce_pair, query_of
from token_helpers import exchange

from authsrv.flows.answered import KEPT_FOR
from authsrv.flows.clients import TTL as CLIENT_CACHE_TTL
from authsrv.identity.credentials import MAX_LOGIN_BYTES, MAX_PASSWORD_BYTES
from authsrv.identity.passwords import hash_password
from authsrv.identity.static import add_user
from authsrv.identity.errors import BackendUnavailable
from authsrv.records import Ban
from authsrv.store.codes import CodeFound
from authsrv.testing.identity import ALICE, BOB, MALLORY, PASSWORDS, ZOE
from authsrv.tokens import token_hash

PARTNER_REDIRECT = "http://127.0.0.1:9001/callback"
INCORRECT = b"The username or password is incorrect."
FORM_EXPIRED = b"This form expired or was not sent by this site; start again from the application."
TOO_LONG = b"took too long"


async def started(tmp_path, monkeypatch, config=None) -> Harness:
    return await Harness(tmp_path, monkeypatch, config).start()


async def login_page(browser, client_id="first", **params) -> str:
    """Authorize; the URL that shows the login form it answered with again."""
    response, body = await browser.authorize(client_id, **params)
    assert_page(response, body, 200)
    assert b'name="password"' in body, body
    return login_url(body)


async def consent_page(browser, user, client_id="partner", **params) -> str:
    """Log in for a client that asks for consent; the consent page's URL."""
    response, _ = await browser.submit_login(await login_page(browser, client_id, **params),
                                             user.login, PASSWORDS[user.sub])
    assert response.code == 303 and "/consent?request=" in location(response)
    return location(response)


async def consent_page_of_live_session(h, browser, user, client_id="partner", **params) -> str:
    """Signed in a second before, for another client; the consent page's URL, with no login form on the way."""
    await browser.sign_in(user)
    h.clock.advance(1)
    response, _ = await browser.authorize(client_id, **params)
    assert response.code == 303 and "/consent?request=" in location(response), location(response)
    return location(response)


def assert_page(response, body, status: int):
    assert response.code == status, body
    assert response.headers.getRawHeaders(b"x-frame-options") == [b"DENY"]
    assert b"frame-ancestors 'none'" in response.headers.getRawHeaders(b"content-security-policy")[0]
    assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
    assert not response.headers.hasHeader(b"location")


@pytest_twisted.ensureDeferred
async def test_the_login_page_is_a_plain_form_naming_the_client(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await login_page(browser, "partner", login_hint="bob@example")
        response, body = await browser.get(url)
        assert_page(response, body, 200)
        page = body.decode()
        assert "to continue to <strong>Partner App</strong>" in page
        for field in ('name="username"', 'name="password"', 'type="password"', 'type="submit"'):
            assert field in page
        assert 'value="bob@example"' in page
        assert set(hidden_fields(body)) == {"request", "csrf", "credential"}
        assert hidden_fields(body)["request"] == query_of(url)["request"]
        assert 'name="viewport"' in page
        assert page.count("<script") == 2 and "src=" not in page and "<link" not in page
        assert '/api/auth/login/passkey"' in page and 'data-passkey="get"' in page
        device = [c for c in browser.set_cookie_headers if c.startswith("authsrv_device=")]
        assert len(device) == 1 and "HttpOnly" in device[0] and "SameSite=lax" in device[0]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_another_account_shows_the_form_without_the_login_hint(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await login_page(browser, "partner", login_hint="bob@example")
        response, body = await browser.get(url + "&account=other")
        assert_page(response, body, 200)
        assert b"bob@example" not in body and b'value=""' in body and b"Use another account" not in body
        response, _ = await browser.submit_login(url, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "/consent?request=" in location(response)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_client_names_are_escaped(tmp_path, monkeypatch):
    clients = [*CLIENTS, {"client_id": "odd", "name": "<script>alert(1)</script>",
                          "redirect_uris": ["http://127.0.0.1:9005/cb"]}]
    h = await started(tmp_path, monkeypatch, {"clients": clients})
    try:
        browser = Browser(h)
        response, body = await browser.get(await login_page(browser, "odd", redirect_uri="http://127.0.0.1:9005/cb",
                                                              login_hint='"><script>'))
        assert body.count(b"<script>") == 2 and b"&lt;script&gt;alert(1)&lt;/script&gt;" in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_wrong_password_and_unknown_user_get_one_answer(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        answers = []
        for login, password in [("alice", "wrong"), ("nobody", "wrong"), ("mallory", "wrong")]:
            browser = Browser(h)
            response, body = await browser.submit_login(await login_page(browser), login, password)
            assert_page(response, body, 200)
            assert INCORRECT in body
            assert "authsrv_session" not in browser.cookies
            fields = hidden_fields(body)
            answers.append(body.replace(fields["request"].encode(), b"").replace(fields["csrf"].encode(), b"")
                           .replace(f'value="{login}"'.encode(), b""))
        assert answers[0] == answers[1] == answers[2]
        reasons = [(e["login"], e["reason"]) for e in audit.of("login.failed")]
        assert reasons == [("alice", "wrong password"), ("nobody", "unknown user"), ("mallory", "wrong password")]
        assert not audit.of("login.succeeded")
    finally:
        await h.close()


@pytest.mark.parametrize("show_reason", [False, True])
@pytest_twisted.ensureDeferred
async def test_the_right_password_of_a_suspended_account_says_so_and_is_no_failure(
    tmp_path, monkeypatch, audit, show_reason
):
    h = await started(tmp_path, monkeypatch, {"ui": {"show_ban_reason": show_reason}})
    try:
        await h.store.ban_user(Ban(sub=BOB.sub, reason="spam <b>links</b>", created_at=h.now()))
        for user, reason in ((MALLORY, MALLORY.disabled_reason), (BOB, "spam <b>links</b>")):
            for _ in range(6):
                browser = Browser(h)
                response, body = await browser.submit_login(await login_page(browser), user.login,
                                                            PASSWORDS[user.sub])
                assert_page(response, body, 403)
                assert b"Account suspended" in body and INCORRECT not in body
                assert "authsrv_session" not in browser.cookies
                assert (reason.replace("<", "&lt;").replace(">", "&gt;").encode() in body) == show_reason
        assert not audit.of("login.failed") and not audit.of("login.throttled")
        assert [e["sub"] for e in audit.of("login.suspended")] == [MALLORY.sub] * 6 + [BOB.sub] * 6
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_login_success_sets_the_session_cookie_and_goes_on(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, _ = await browser.submit_login(await login_page(browser, scope="openid"), "ZOË.ŁÓDŹ",
                                                 PASSWORDS[ZOE.sub])
        assert response.code == 303 and response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
        query = query_of(location(response))
        assert location(response).startswith("http://127.0.0.1:9000/callback?")
        assert query["state"] == "st4te" and query["iss"] == ISSUER and query["code"]
        (cookie,) = [c for c in browser.set_cookie_headers if c.startswith("authsrv_session=")]
        flags = [part.strip() for part in cookie.split(";")]
        assert "HttpOnly" in flags and "SameSite=lax" in flags and "Path=/api/auth" in flags
        assert f"Max-Age={h.config.limits.session_ttl}" in flags and "Secure" not in flags
        session = await h.store.get_session(browser.session_hash, h.now())
        assert (session.sub, session.auth_time, session.expires_at) == (
            ZOE.sub, h.now(), h.now() + h.config.limits.session_ttl)
        assert [e["sub"] for e in audit.of("login.succeeded")] == [ZOE.sub]
        assert len(audit.of("code.issued")) == 1
    finally:
        await h.close()


async def test_a_client_removed_while_its_user_signs_in_gets_no_code(tmp_path, monkeypatch, audit):
    """This instance still holds the client in its cache, for two seconds: the store starts no grant for it."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        page = await login_page(browser, scope="openid")
        assert await h.store.remove_client("first") is True
        response, body = await browser.submit_login(page, "ZOË.ŁÓDŹ", PASSWORDS[ZOE.sub])
        assert_page(response, body, 400)
        assert b"The application that sent you here is not known to this service." in body
        assert audit.of("code.issued") == []
        assert await h.store.list_user_grants(ZOE.sub, h.now()) == []
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_removed_while_its_user_consents_gets_neither_code_nor_consent(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page(browser, ALICE)
        assert await h.store.remove_client("partner") is True
        response, body = await browser.answer_consent(url, "approve")
        assert_page(response, body, 400)
        assert b"The application that sent you here is not known to this service." in body
        assert await h.store.get_consent(ALICE.sub, "partner") is None
        assert (audit.of("consent.given"), audit.of("code.issued")) == ([], [])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_removed_after_its_code_is_stored_keeps_no_consent(tmp_path, monkeypatch, audit):
    """The removal lands between the code and the consent: it removed the code's grant, and no consent is kept."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page(browser, ALICE)
        save_code = h.store.save_code

        async def then_removed(code, grant, stored_client=True):
            stored = await save_code(code, grant, stored_client)
            assert await h.store.remove_client(grant.client_id) is True
            return stored

        h.store.save_code = then_removed
        response, body = await browser.answer_consent(url, "approve")
        assert_page(response, body, 400)
        assert b"The application that sent you here is not known to this service." in body
        assert await h.store.get_consent(ALICE.sub, "partner") is None
        assert await h.store.list_user_grants(ALICE.sub, h.now()) == []
        assert audit.of("consent.given") == []
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_removed_while_its_user_consents_past_max_age_gets_no_consent(tmp_path, monkeypatch, audit):
    """
    The approval that leads to a sign-in again (max_age passed) is
    remembered only for a client the store still holds, though this
    instance's cache still has the removed one.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page_of_live_session(h, browser, ALICE, max_age="1")
        assert await h.store.remove_client("partner") is True
        h.clock.advance(1)
        response, body = await browser.answer_consent(url, "approve")
        assert_page(response, body, 400)
        assert b"The application that sent you here is not known to this service." in body
        assert await h.store.get_consent(ALICE.sub, "partner") is None
        assert audit.of("consent.given") == [] and [e["client_id"] for e in audit.of("code.issued")] == ["first"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_no_longer_first_party_asks_for_consent_and_keeps_its_grants(tmp_path, monkeypatch):
    """
    Skipping the consent page stored no consent, so the flag taken off
    shows the page at the next authorization request; the grant it made
    before stays (docs/design.md, Changed clients).
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        assert "code" in await browser.sign_in(ALICE, "first", consent=None)
        assert await h.store.get_consent(ALICE.sub, "first") is None
        before = await h.store.get_client("first")
        assert await h.store.change_client(before, attrs.evolve(before, first_party=False)) is True
        h.clock.advance(CLIENT_CACHE_TTL + 1)
        response, _ = await browser.authorize("first")
        assert response.code == 303 and "/consent?request=" in location(response), location(response)
        assert len(await h.store.list_user_grants(ALICE.sub, h.now())) == 1
    finally:
        await h.close()


async def redirect_taken_off(h, client_id: str) -> None:
    """The client's only redirect URI replaced by another, and its cached copy outlived."""
    before = await h.store.get_client(client_id)
    after = attrs.evolve(before, redirect_uris=("http://127.0.0.1:9999/elsewhere",))
    assert await h.store.change_client(before, after) is True
    h.clock.advance(CLIENT_CACHE_TTL + 1)


@pytest_twisted.ensureDeferred
async def test_a_redirect_uri_taken_off_while_its_user_signs_in_gets_no_code(tmp_path, monkeypatch, audit):
    """RFC 6749 section 4.1.2.1: the sign-in never ends in a redirect to an address the client no longer has."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, page = await browser.authorize("first", scope="openid")
        assert_page(response, page, 200)
        await redirect_taken_off(h, "first")
        response, body = await browser.get(login_url(page))
        assert_page(response, body, 400)
        response, body = await browser.post(ISSUER + "/login", {
            **hidden_fields(page), "username": "alice", "password": PASSWORDS[ALICE.sub]})
        assert_page(response, body, 400)
        assert b"The application asked to return to an address it has not registered." in body
        assert audit.of("code.issued") == []
        assert await h.store.list_user_grants(ALICE.sub, h.now()) == []
    finally:
        await h.close()


@pytest.mark.parametrize("action", ["approve", "deny"])
@pytest_twisted.ensureDeferred
async def test_a_redirect_uri_taken_off_while_its_user_consents_is_not_redirected_to(
        tmp_path, monkeypatch, audit, action):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, page = await browser.get(await consent_page(browser, ALICE))
        assert_page(response, page, 200)
        await redirect_taken_off(h, "partner")
        response, body = await browser.post(ISSUER + "/consent", {**hidden_fields(page), "action": action})
        assert_page(response, body, 400)
        assert b"The application asked to return to an address it has not registered." in body
        assert await h.store.get_consent(ALICE.sub, "partner") is None
        assert (audit.of("consent.given"), audit.of("code.issued")) == ([], [])
    finally:
        await h.close()


async def test_cookies_are_secure_under_an_https_issuer(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch, {"server": {"public_url": "https://auth.example.test"}})
    try:
        browser = Browser(h)
        response, body = await browser.authorize("first")
        assert shows_login_form(response, body) and b'action="https://auth.example.test/api/auth/login"' in body
        response, _ = await browser.submit_login(response, "alice", PASSWORDS[ALICE.sub])
        assert query_of(location(response))["iss"] == "https://auth.example.test/api/auth"
        names = {c.split("=")[0]: c for c in browser.set_cookie_headers}
        tabs = {name for name in names if name.startswith("__Host-authsrv_tab_")}
        assert len(tabs) == 1 and set(names) - tabs == {"__Host-authsrv_device", "__Host-authsrv_session"}
        for cookie in names.values():
            flags = [part.strip() for part in cookie.split(";")]
            assert {"Secure", "HttpOnly", "SameSite=lax", "Path=/"} <= set(flags)
            assert not any(flag.lower().startswith("domain") for flag in flags)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_empty_fields_ask_again_and_an_unavailable_backend_is_not_a_wrong_password(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await login_page(browser)
        response, body = await browser.submit_login(url, "alice", None)
        assert response.code == 200 and b"Enter your username and password." in body
        monkeypatch.setattr(h.identity, "requestAvatarId", lambda credentials: fail(BackendUnavailable("down")))
        response, body = await browser.submit_login(url, "alice", PASSWORDS[ALICE.sub])
        assert_page(response, body, 503)
        assert b"try again later" in body and INCORRECT not in body
        monkeypatch.setattr(h.identity, "requestAvatarId", lambda credentials: fail(RuntimeError("bug")))
        response, body = await browser.submit_login(url, "alice", PASSWORDS[ALICE.sub])
        assert response.code == 503 and INCORRECT not in body
        monkeypatch.undo()
        response, _ = await browser.submit_login(url, "alice", PASSWORDS[ALICE.sub])
        assert response.code == 303 and "code" in query_of(location(response))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_login_typed_in_full_width_forms_finds_its_user(tmp_path, monkeypatch, audit):
    """
    RFC 8265 width mapping: 'ａlｉce', typed with an input method left in
    full-width mode, is alice, and counts toward alice's throttle. Users
    stored before new logins were refused such forms sign in as they did,
    by their login as stored: a full-width 'ａｌｉｃｅ' beside alice stays
    apart from her.
    """
    for login, sub in (("ｔａｒｏ", "sub-taro"), ("ａｌｉｃｅ", "sub-wide-alice")):
        add_user(tmp_path / "users.toml", login=login, sub=sub, password_hash=hash_password(f"{sub}-pw", CHEAP))
    h = await started(tmp_path, monkeypatch)
    try:
        for typed, password, sub in (("ａlｉce", PASSWORDS[ALICE.sub], ALICE.sub),
                                     ("ＡＬＩＣＥ", "sub-wide-alice-pw", "sub-wide-alice"),
                                     ("ｔａｒｏ", "sub-taro-pw", "sub-taro")):
            browser = Browser(h)
            response, _ = await browser.submit_login(await login_page(browser), typed, password)
            assert response.code == 303 and "code" in query_of(location(response)), typed
            assert audit.of("login.succeeded")[-1]["sub"] == sub
        browser = Browser(h)
        url = await login_page(browser)
        for typed in ("ａlice", "aｌice", "alｉce", "aliｃe", "alicｅ"):
            response, body = await browser.submit_login(url, typed, "guess")
            assert response.code == 200 and INCORRECT in body
        response, _ = await browser.submit_login(url, "alice", PASSWORDS[ALICE.sub])
        assert response.code == 429, "five width variants are five failures of alice"
    finally:
        await h.close()


@pytest.mark.parametrize("username, password, says", [
    ("alice", "pass\x00word", b"The password holds a NUL character, which no password can"),
    ("alice", "p" * (MAX_PASSWORD_BYTES + 1), b"The password is longer than any password can be (64 KiB)"),
    ("alice", b"\xffpassword", b"The password was not sent as UTF-8 text"),
    ("al\x00ice", "guess", b"The username holds a NUL character, which no username can"),
    ("a" * (MAX_LOGIN_BYTES + 1), "guess", b"The username is longer than any username can be (8 KiB)"),
    (b"\xffalice", None, b"The username was not sent as UTF-8 text"),
])
@pytest_twisted.ensureDeferred
async def test_a_login_no_one_can_have_is_explained_unchecked_and_uncounted(tmp_path, monkeypatch, audit,
                                                                            username, password, says):
    """
    A NUL, text that is not UTF-8 or a field over the cap, in the username or
    the password, made the form unreadable: the generic expired-form page.
    The login page (a 400) says what is wrong, checks nothing and counts no
    failure.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await login_page(browser)
        checks = []
        real = h.identity.requestAvatarId
        monkeypatch.setattr(h.identity, "requestAvatarId", lambda c: checks.append(c) or real(c))
        for _ in range(6):
            response, body = await browser.submit_login(url, username, password)
            assert_page(response, body, 400)
            assert says in body and INCORRECT not in body
            assert (b'value="alice"' in body) == (username == "alice")
        assert checks == [] and not audit.of("login.failed") and not audit.of("login.throttled")
        response, _ = await browser.submit_login(url, "alice", PASSWORDS[ALICE.sub])
        assert response.code == 303 and "code" in query_of(location(response))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_long_password_under_the_cap_is_checked_as_any_other(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, body = await browser.submit_login(await login_page(browser), "alice", "p" * 9000)
        assert_page(response, body, 200)
        assert INCORRECT in body
        assert [e["reason"] for e in audit.of("login.failed")] == ["wrong password"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_failures_per_pair_wait_a_growing_delay_without_checking_the_password(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await login_page(browser)
        for _ in range(5):
            response, body = await browser.submit_login(url, "alice", "guess")
            assert response.code == 200 and INCORRECT in body
        checks = []
        real = h.identity.requestAvatarId
        monkeypatch.setattr(h.identity, "requestAvatarId", lambda c: checks.append(c) or real(c))
        response, body = await browser.submit_login(url, "ALICE", PASSWORDS[ALICE.sub])
        assert_page(response, body, 429)
        assert b"Too many attempts; try again in 1 second." in body
        assert response.headers.getRawHeaders(b"retry-after") == [b"1"]
        assert checks == []
        response, _ = await browser.submit_login(url, "Bob", PASSWORDS[BOB.sub])
        assert response.code == 303, "another account from the same address is not held back"
        h.clock.advance(1)
        response, body = await browser.submit_login(await login_page(browser, prompt="login"), "alice", "guess")
        assert response.code == 200 and INCORRECT in body
        response, body = await browser.submit_login(await login_page(browser, prompt="login"), "alice",
                                                     PASSWORDS[ALICE.sub])
        assert response.code == 429 and response.headers.getRawHeaders(b"retry-after") == [b"2"]
        h.clock.advance(2)
        response, _ = await browser.submit_login(await login_page(browser, prompt="login"), "alice",
                                                 PASSWORDS[ALICE.sub])
        assert response.code == 303 and len(checks) == 3
        for _ in range(5):
            response, _ = await browser.submit_login(await login_page(browser, prompt="login"), "alice", "guess")
            assert response.code == 200, "a success clears the pair's count"
        assert [e["retry_after"] for e in audit.of("login.throttled")] == [1, 2]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_failures_per_address_are_throttled_across_accounts(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch, {"throttle": {"failures_per_address": 8}})
    try:
        browser = Browser(h)
        url = await login_page(browser)
        for index in range(8):
            response, _ = await browser.submit_login(url, f"user{index}", "guess")
            assert response.code == 200
        response, body = await browser.submit_login(url, "alice", PASSWORDS[ALICE.sub])
        assert response.code == 429 and b"Too many attempts" in body
        assert response.headers.getRawHeaders(b"retry-after") == [b"900"]
        h.clock.advance(15 * 60)
        response, _ = await browser.submit_login(await login_page(browser), "alice", PASSWORDS[ALICE.sub])
        assert response.code == 303
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_ban_refuses_the_login_and_ends_the_session(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        session_hash = browser.session_hash
        await h.store.ban_user(Ban(sub=ALICE.sub, reason="abuse", created_at=h.now()))
        response, _ = await browser.authorize("first", prompt="none")
        assert query_of(location(response))["error"] == "login_required"
        assert await h.store.get_session(session_hash, h.now()) is None
        assert [e["sub"] for e in audit.of("session.ended")] == [ALICE.sub]
        response, body = await browser.submit_login(await login_page(browser), "alice", PASSWORDS[ALICE.sub])
        assert response.code == 403 and b"Account suspended" in body
        assert audit.of("login.suspended")[-1]["reason"] == "banned"
        await h.store.unban_user(ALICE.sub)
        query = await browser.sign_in(ALICE)
        assert "code" in query
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_ban_while_on_the_consent_page_stops_the_consent(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page(browser, BOB)
        await h.store.ban_user(Ban(sub=BOB.sub, reason=None, created_at=h.now()))
        response, body = await browser.get(url)
        assert_page(response, body, 400)
        assert await h.store.get_consent(BOB.sub, "partner") is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_consent_names_the_client_and_scopes_and_is_remembered_per_scope_set(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page(browser, ALICE, scope="openid profile email offline_access")
        response, body = await browser.get(url)
        assert_page(response, body, 200)
        [csp] = response.headers.getRawHeaders(b"content-security-policy")
        assert csp.endswith(b"; form-action 'self' http://127.0.0.1:9001"), csp
        page = body.decode()
        for words in ("Partner App", "Confirm who you are (your user id)", "Your name and picture",
                      "Your email address and whether it is verified",
                      "Stay signed in to Partner App when you are away (keeps access until you revoke it)",
                      'name="action" value="approve"', 'name="action" value="deny"', "alice"):
            assert words in page
        response, _ = await browser.answer_consent(url, "approve")
        assert response.code == 303 and location(response).startswith(PARTNER_REDIRECT + "?")
        query = query_of(location(response))
        assert query["state"] == "st4te" and query["iss"] == ISSUER
        result = await h.store.find_code(token_hash(query["code"]), h.now())
        assert isinstance(result, CodeFound) and result.code.client_id == "partner"
        assert await h.store.get_consent(ALICE.sub, "partner") == {"openid", "profile", "email", "offline_access"}
        assert len(audit.of("consent.given")) == 1
        response, _ = await browser.authorize("partner", scope="openid email")
        assert response.code == 302 and "code" in query_of(location(response))
        response, _ = await browser.authorize("partner", scope="openid", prompt="consent")
        assert response.code == 303 and "/consent?" in location(response)
        other = Browser(h)
        response, _ = await other.submit_login(await login_page(other, "partner", scope="openid"), "Bob",
                                               PASSWORDS[BOB.sub])
        assert "/consent?" in location(response), "a consent belongs to one user"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_wider_scope_asks_again_and_consents_add_up(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE, "partner", scope="openid email")
        response, _ = await browser.authorize("partner", scope="openid profile")
        assert response.code == 303 and "/consent?" in location(response)
        await browser.answer_consent(location(response), "approve")
        assert await h.store.get_consent(ALICE.sub, "partner") == {"openid", "email", "profile"}
        response, _ = await browser.authorize("partner", scope="email profile")
        assert response.code == 302
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_revoke_while_a_consent_is_saved_keeps_the_revoked_scopes_gone(tmp_path, monkeypatch):
    """
    The user revokes the client just as a wider consent is being saved:
    only the scopes just approved are remembered, never the revoked ones.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE, "partner", scope="openid email")
        response, _ = await browser.authorize("partner", scope="openid profile")
        save = h.store.save_consent

        async def revoked_first(sub, client_id, scope, now, stored_client=True):
            await h.store.revoke_consent(sub, client_id)
            return await save(sub, client_id, scope, now, stored_client)

        monkeypatch.setattr(h.store, "save_consent", revoked_first)
        response, _ = await browser.answer_consent(location(response), "approve")
        assert response.code == 303 and "code" in query_of(location(response))
        assert await h.store.get_consent(ALICE.sub, "partner") == {"openid", "profile"}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_approval_after_max_age_signs_in_again_before_any_code(tmp_path, monkeypatch, audit):
    """
    OIDC Core 3.1.2.1: a consent page left open past max_age gives no code
    with the session's old auth_time; the approval is kept, so after signing
    in again (prompt=consent included) the code follows without the page
    again. A sign-in made for the request itself meets max_age however long
    its consent page stayed open (node-oidc-provider's rule): no second
    password.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page_of_live_session(h, browser, ALICE, max_age="60", prompt="consent")
        h.clock.advance(61)
        response, _ = await browser.answer_consent(url, "approve")
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request="), location(response)
        assert [e["client_id"] for e in audit.of("code.issued")] == ["first"]
        assert await h.store.get_consent(ALICE.sub, "partner") == {"openid", "profile", "email", "offline_access"}
        response, _ = await browser.submit_login(location(response), ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and location(response).startswith(PARTNER_REDIRECT + "?"), location(response)
        result = await h.store.find_code(token_hash(query_of(location(response))["code"]), h.now())
        assert isinstance(result, CodeFound) and result.code.auth_time == h.now()

        url = await consent_page(browser, BOB, max_age="60", prompt="login")
        h.clock.advance(61)
        response, _ = await browser.answer_consent(url, "approve")
        assert response.code == 303 and "code" in query_of(location(response)), "signed in for this very request"
        result = await h.store.find_code(token_hash(query_of(location(response))["code"]), h.now())
        assert isinstance(result, CodeFound) and result.code.auth_time == h.now() - 61
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_sign_in_in_another_tab_after_the_consent_page_was_made_meets_max_age(tmp_path, monkeypatch):
    """
    OIDC Core 3.1.2.1 asks that the code's auth_time be within max_age of
    the request, or that the user be actively signed in again: a sign-in of
    the same user after the consent page was made, in another tab, is after
    the request, so the approval issues the code with that auth_time.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page_of_live_session(h, browser, ALICE, max_age="60", prompt="consent")
        h.clock.advance(50)
        await browser.sign_in(ALICE, "first", prompt="login")
        signed_in_again = h.now()
        h.clock.advance(20)
        response, _ = await browser.answer_consent(url, "approve")
        assert response.code == 303 and "code" in query_of(location(response)), location(response)
        result = await h.store.find_code(token_hash(query_of(location(response))["code"]), h.now())
        assert isinstance(result, CodeFound) and result.code.auth_time == signed_in_again
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_deny_goes_back_with_access_denied_and_remembers_nothing(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page(browser, ALICE, state="keep-me")
        response, _ = await browser.answer_consent(url, "deny")
        assert response.code == 303 and response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
        query = query_of(location(response))
        assert location(response).startswith(PARTNER_REDIRECT + "?")
        assert (query["error"], query["state"], query["iss"]) == ("access_denied", "keep-me", ISSUER)
        assert "code" not in query
        assert await h.store.get_consent(ALICE.sub, "partner") is None
        assert len(audit.of("consent.denied")) == 1 and not audit.of("code.issued")
        response, body = await browser.get(url)
        assert response.code == 400 and TOO_LONG in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_sign_ins_pages_open_only_in_the_browser_it_began_in(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        victim, other, fresh = Browser(h), Browser(h), Browser(h)
        await login_page(other)
        other.cookies.pop("authsrv_session", None)
        login = await login_page(victim, "partner", login_hint="alice")
        consent = await consent_page(victim, ALICE)
        for url in (login, consent):
            for who in (other, fresh):
                response, body = await who.get(url)
                assert_page(response, body, 400)
                assert b"<title>Sign-in ended</title>" in body and b'name="csrf"' not in body
        response, body = await victim.get(login)
        assert_page(response, body, 200)
        assert b'value="alice"' in body, "a reload in the browser it began in shows it again"
        response, body = await victim.get(consent)
        assert_page(response, body, 200)
        response, _ = await victim.answer_consent(consent, "approve")
        assert response.code == 303 and "code" in query_of(location(response))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_going_back_to_a_finished_sign_in_says_it_finished(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page(browser, ALICE)
        response, _ = await browser.answer_consent(url, "approve")
        assert response.code == 303 and "code" in query_of(location(response))
        response, body = await browser.get(url)
        assert_page(response, body, 400)
        assert b"<title>Sign-in ended</title>" in body and b"This sign-in has already finished" in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_consent_sent_twice_gets_the_first_answer_while_its_code_is_unused(tmp_path, monkeypatch, audit):
    """
    A double click on Allow without JavaScript, the client slow to answer:
    the browser shows only the second answer, which was the ended page, the
    first one's code lost. The same browser's form sent again within
    L{KEPT_FOR} seconds gets the same redirect and code, while that code
    is unused; another browser, a used code or a later post get the page.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        verifier, challenge = pkce_pair()
        url = await consent_page(browser, ALICE, challenge=challenge)
        response, body = await browser.get(url)
        form = {**hidden_fields(body), "action": "approve"}
        first, _ = await browser.post(ISSUER + "/consent", form)
        assert first.code == 303 and "code" in query_of(location(first))
        h.clock.advance(KEPT_FOR - 1)
        for action in ("approve", "deny"):
            response, _ = await browser.post(ISSUER + "/consent", {**form, "action": action})
            assert response.code == 303 and location(response) == location(first)
        other = Browser(h)
        response, body = await other.post(ISSUER + "/consent", form)
        assert_page(response, body, 400)
        assert len(audit.of("code.issued")) == 1 and len(audit.of("consent.given")) == 1
        response, _ = await exchange(h, query_of(location(first))["code"], verifier, "partner")
        assert response.code == 200
        response, body = await browser.post(ISSUER + "/consent", form)
        assert_page(response, body, 400)
        assert b"This sign-in has already finished" in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_consent_sent_again_after_a_sign_out_gets_no_code(tmp_path, monkeypatch):
    """
    A shared computer: Alice allows, the first answer's code not yet used
    (a double click), and signs out; Bob signs in and the back button sends
    Alice's form again. It got Alice's code, which signed Bob in to the
    client as Alice. The answer kept is for the session it was given to.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page(browser, ALICE)
        response, body = await browser.get(url)
        form = {**hidden_fields(body), "action": "approve"}
        first, _ = await browser.post(ISSUER + "/consent", form)
        assert first.code == 303 and "code" in query_of(location(first))
        await h.store.end_session(token_hash(browser.cookies.pop("authsrv_session")))  # signed out
        response, body = await browser.post(ISSUER + "/consent", form)
        assert_page(response, body, 400)
        await browser.sign_in(BOB)
        response, body = await browser.post(ISSUER + "/consent", form)
        assert_page(response, body, 400)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_consent_sent_again_later_says_the_sign_in_finished(tmp_path, monkeypatch):
    """Past L{KEPT_FOR} seconds, or for a refusal sent again, the same answers as before any was kept."""
    h = await started(tmp_path, monkeypatch)
    try:
        for action, late in (("deny", 0), ("approve", KEPT_FOR)):
            browser = Browser(h)
            url = await consent_page(browser, ALICE)
            response, body = await browser.get(url)
            form = {**hidden_fields(body), "action": action}
            first, _ = await browser.post(ISSUER + "/consent", form)
            assert first.code == 303
            h.clock.advance(late)
            response, body = await browser.post(ISSUER + "/consent", form)
            if late:
                assert_page(response, body, 400)
                assert b"This sign-in has already finished" in body
            else:
                assert response.code == 303 and location(response) == location(first)
                assert query_of(location(first))["error"] == "access_denied"
    finally:
        await h.close()


async def signed_in_once(h, client_id: str, **authorize):
    """
    A new browser's sign-in form for C{client_id}, sent once as Alice: the
    browser, the form, the browser's cookies before it was sent, the answer.
    """
    browser = Browser(h)
    response, body = await browser.authorize(client_id, **authorize)
    form = {**hidden_fields(body), "username": ALICE.login, "password": PASSWORDS[ALICE.sub]}
    before = dict(browser.cookies)
    first, _ = await browser.post(ISSUER + "/login", form)
    return browser, form, before, first


@pytest_twisted.ensureDeferred
async def test_a_sign_in_sent_twice_gets_the_first_answer_and_session_while_it_lasts(tmp_path, monkeypatch):
    """
    The sign-in form sent twice without JavaScript: the second post, which
    does not carry the session cookie the first answer set, gets the same
    redirect and that cookie again, while the session is live and the code
    unused; never in another browser, after a sign-out, or later.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        for client_id in ("partner", "first"):
            browser, form, before, first = await signed_in_once(h, client_id)
            session = browser.cookies["authsrv_session"]
            browser.cookies = dict(before)
            again, _ = await browser.post(ISSUER + "/login", form)
            assert again.code == 303 and location(again) == location(first)
            assert browser.cookies["authsrv_session"] == session
            response, body = await Browser(h).post(ISSUER + "/login", form)
            assert_page(response, body, 400)
        response, _ = await browser.post(ISSUER + "/login", form)
        assert location(response) == location(first), "sent again with the session it set"
        await h.store.end_session(token_hash(browser.cookies.pop("authsrv_session")))  # signed out
        response, body = await browser.post(ISSUER + "/login", form)
        assert_page(response, body, 400)
        assert b"This sign-in has already finished" in body and "authsrv_session" not in browser.cookies
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_sign_in_sent_again_later_or_after_its_code_is_used_says_it_finished(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        for used in (False, True):
            verifier, challenge = pkce_pair()
            browser, form, before, first = await signed_in_once(h, "first", challenge=challenge)
            if used:
                response, _ = await exchange(h, query_of(location(first))["code"], verifier, "first")
                assert response.code == 200
            else:
                h.clock.advance(KEPT_FOR)
            browser.cookies = dict(before)
            response, body = await browser.post(ISSUER + "/login", form)
            assert_page(response, body, 400)
            assert b"This sign-in has already finished" in body and "authsrv_session" not in browser.cookies
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_first_party_clients_never_show_the_consent_page(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        query = await browser.sign_in(ALICE, "first", prompt="consent")
        assert "code" in query
        assert await h.store.get_consent(ALICE.sub, "first") is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_login_forms_are_bound_to_the_browser_they_were_shown_to(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        victim, attacker = Browser(h), Browser(h)
        url = await login_page(attacker)
        _, body = await attacker.get(url)
        fields = {**hidden_fields(body), "username": "mallory-attacker", "password": "x"}
        for who, form in [
            (attacker, {**fields, "csrf": None}),
            (attacker, {**fields, "csrf": "0" * 64}),
            (attacker, {**fields, "csrf": fields["csrf"][:-1]}),
            (victim, fields),
        ]:
            response, body = await who.post(ISSUER + "/login", {k: v for k, v in form.items() if v is not None})
            assert_page(response, body, 400)
            assert FORM_EXPIRED in body
        await login_page(victim)
        response, body = await victim.post(ISSUER + "/login", {**fields, "username": "alice",
                                                               "password": PASSWORDS[ALICE.sub]})
        assert response.code == 400 and FORM_EXPIRED in body, "another device cookie derives another token"
        assert "authsrv_session" not in victim.cookies
        attacker.cookies.clear()
        response, body = await attacker.post(ISSUER + "/login", {**fields, "username": "alice",
                                                                 "password": PASSWORDS[ALICE.sub]})
        assert response.code == 400 and FORM_EXPIRED in body
        response, body = await attacker.post(ISSUER + "/login", {**fields, "request": "unknown"})
        assert response.code == 400 and TOO_LONG in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_two_tabs_first_requests_both_sign_in_though_one_device_cookie_stays(tmp_path, monkeypatch, audit):
    """
    A browser with no cookie of this service opens two authorization
    requests at once: each answer sets a new device cookie and the last one
    stays, so the first tab's form was "not sent by this site". Each request
    keeps its own copy of the secret its form is bound to, in a cookie of its
    own name, so both sign in (the second one's consent remembered from the
    first); another browser still gets neither.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        first, first_body = await browser.authorize("partner")
        first_cookies, browser.cookies = browser.cookies, {}
        second, second_body = await browser.authorize("partner")
        browser.cookies = {**first_cookies, **browser.cookies}
        assert browser.cookies["authsrv_device"] != first_cookies["authsrv_device"]
        stranger = Browser(h)
        for body in (first_body, second_body):
            form = {**hidden_fields(body), "username": ALICE.login, "password": PASSWORDS[ALICE.sub]}
            response, page = await stranger.post(ISSUER + "/login", form)
            assert response.code == 400 and FORM_EXPIRED in page
            response, page = await browser.get(login_url(body))
            assert response.code == 200 and b'name="password"' in page
            response, _ = await browser.post(ISSUER + "/login", form)
            if "/consent?request=" in location(response):
                response, _ = await browser.answer_consent(location(response), "approve")
            assert response.code == 303 and "code" in query_of(location(response))
        assert len(audit.of("code.issued")) == 2 and len(audit.of("consent.given")) == 1
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_consent_forms_need_the_csrf_token_and_the_session_that_saw_them(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await consent_page(browser, ALICE)
        _, body = await browser.get(url)
        fields = {**hidden_fields(body), "action": "approve"}
        for form in ({**fields, "csrf": None}, {**fields, "csrf": "f" * 64}, {**fields, "action": "maybe"},
                     {**fields, "action": None}):
            response, body = await browser.post(ISSUER + "/consent", {k: v for k, v in form.items() if v})
            assert response.code == 400 and FORM_EXPIRED in body
        stranger = Browser(h)
        stranger.cookies = {"authsrv_device": browser.cookies["authsrv_device"]}
        response, body = await stranger.post(ISSUER + "/consent", fields)
        assert response.code == 400 and b"no longer signed in" in body
        await browser.submit_login(await login_page(browser, "first", prompt="login"), "Bob", PASSWORDS[BOB.sub])
        response, body = await browser.post(ISSUER + "/consent", fields)
        assert response.code == 400 and b"no longer signed in" in body, "another user's session cannot approve"
        assert await h.store.get_consent(ALICE.sub, "partner") is None
        assert await h.store.get_consent(BOB.sub, "partner") is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_pending_requests_expire_and_are_used_once(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        url = await login_page(browser)
        _, body = await browser.get(url)
        fields = {**hidden_fields(body), "username": "alice", "password": PASSWORDS[ALICE.sub]}
        h.clock.advance(h.config.limits.pending_request_ttl + 1)
        for response, body in [await browser.get(url), await browser.post(ISSUER + "/login", fields)]:
            assert_page(response, body, 400)
            assert b"it took too long and expired; if the application did not sign you in, start again" in body
        url = await login_page(browser)
        _, body = await browser.get(url)
        fields = {**hidden_fields(body), "username": "alice", "password": PASSWORDS[ALICE.sub]}
        response, _ = await browser.post(ISSUER + "/login", fields)
        assert response.code == 303 and "code" in query_of(location(response))
        h.clock.advance(KEPT_FOR)  # past the first answer kept for the form sent twice
        response, body = await browser.post(ISSUER + "/login", fields)
        assert response.code == 400 and TOO_LONG in body
        for path in ("/login", "/login?request=", "/consent?request=nope", "/consent"):
            response, body = await browser.get(ISSUER + path)
            assert response.code == 400 and TOO_LONG in body
        consent_url = await consent_page(Browser(h), ALICE)
        response, body = await browser.get(ISSUER + "/login?" + consent_url.split("?")[1])
        assert response.code == 400, "a request waiting for consent is not a login form"
        h.clock.advance(h.config.limits.pending_request_ttl + 1)
        response, body = await browser.get(consent_url)
        assert response.code == 400 and TOO_LONG in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_expired_session_means_logging_in_again(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        h.clock.advance(h.config.limits.session_ttl + 1)
        assert shows_login_form(*await browser.authorize("first"))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_no_password_code_or_cookie_value_is_logged(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, _ = await browser.submit_login(await login_page(browser), "alice", "wrong-Password-1")
        query = await browser.sign_in(ALICE, "partner")
        secrets = ["wrong-Password-1", PASSWORDS[ALICE.sub], query["code"], *browser.cookies.values()]
        logged = "\n".join(formatEvent(e) + repr(e) for e in audit)
        assert audit.of("login.failed") and audit.of("code.issued")
        for secret in secrets:
            assert secret not in logged
    finally:
        await h.close()


_field_values = st.one_of(st.text(max_size=30), st.sampled_from(["approve", "deny", "alice", ""]))
_field_names = st.one_of(st.sampled_from(["request", "csrf", "username", "password", "action"]),
                         st.text(max_size=6))


@pytest_twisted.ensureDeferred
async def test_no_login_or_consent_form_gets_a_server_error(tmp_path, monkeypatch):
    """Hypothesis: fields dropped, repeated, replaced by arbitrary text or bytes, on GET and POST."""
    h = await started(tmp_path, monkeypatch)
    browser = Browser(h)
    login_fields = hidden_fields((await browser.get(await login_page(browser)))[1])
    consent_fields = hidden_fields((await browser.get(await consent_page(browser, ZOE)))[1])

    @settings(max_examples=200, deadline=None)
    @given(
        path=st.sampled_from(["/login", "/consent"]),
        keep=st.sets(st.sampled_from(["request", "csrf"])),
        extra=st.lists(st.tuples(_field_names.map(str.encode), _field_values.map(str.encode) | st.binary(max_size=12)),
                       max_size=6),
        method=st.sampled_from(["GET", "POST"]),
        with_cookies=st.booleans(),
    )
    def check(path, keep, extra, method, with_cookies):
        fields = login_fields if path == "/login" else consent_fields
        items = [(k.encode(), v.encode()) for k, v in fields.items() if k in keep] + extra
        encoded = "&".join(quote_from_bytes(k) + "=" + quote_from_bytes(v) for k, v in items)
        sender = Browser(h)
        sender.cookies = dict(browser.cookies) if with_cookies else {}
        if method == "GET":
            response, body = on_reactor(lambda: sender.get(ISSUER + path + "?" + encoded))
        else:
            response, body = on_reactor(lambda: sender.request(
                "POST", ISSUER + path, data=encoded.encode(),
                headers={"content-type": ["application/x-www-form-urlencoded"]}))
        assert response.code in (200, 303, 400, 429), body

    try:
        await fuzz(check)
    finally:
        await h.close()

