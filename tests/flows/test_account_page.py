"""
The account page through the in-memory server: it lists the user's
browsers and applications; revoking an application kills its refresh token
and brings its consent page back; signing out another browser ends that
session (and tells its clients); a password change needs the current
password and ends the other sessions; every form needs its CSRF token;
changing factors needs a recent sign-in, which the page sends for; a
browser without a session is sent to sign in and comes back to the page it
opened. A form answers by sending the browser to the page (Post/Redirect/Get)
with a fixed message key, so a reload sends the form again nowhere.
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
from html import unescape

import pytest
import pytest_twisted
from argon2 import PasswordHasher
from argon2.exceptions import HashingError
from twisted.internet.defer import Deferred
from twisted.internet.threads import deferToThread

from flow_client import Browser, hidden_fields, location, shows_login_form
from harness import ISSUER, Harness, pkce_pair
from test_mfa import TOTP_PAGE, code_at, enrolled, enrolment_of, give_code, password
from token_helpers import exchange, refresh

from authsrv.flows.account import device_of
from authsrv.identity.static import StaticIdentityBackend
from authsrv.records import Passkey
from authsrv.testing.identity import ALICE, BOB, PASSWORDS

ACCOUNT = ISSUER + "/account"
FIREFOX = "Mozilla/5.0 (X11; Linux x86_64; rv:130.0) Gecko/20100101 Firefox/130.0"
_FORM = re.compile(r'<form method="post" action="([^"]*)"[^>]*>(.*?)</form>', re.S)
_HIDDEN = re.compile(r'<input type="hidden" name="([^"]*)" value="([^"]*)" />')


async def answered(browser: Browser, response, done: str):
    """The page a form's 303 sends the browser to, saying what the form did."""
    assert response.code == 303 and location(response) == f"{ACCOUNT}?done={done}", response.code
    response, body = await browser.get(location(response))
    assert response.code == 200, body
    return body


def forms(body: bytes, action: str) -> list[dict[str, str]]:
    """The hidden fields of each form of the page that posts to C{action}."""
    return [{name: unescape(value) for name, value in _HIDDEN.findall(inner)}
            for target, inner in _FORM.findall(body.decode()) if target == action]


async def started(tmp_path, monkeypatch) -> Harness:
    return await Harness(tmp_path, monkeypatch).start()


async def signed_in(h: Harness, user=ALICE, client_id="first", user_agent: str | None = None):
    """A new browser signed in to C{client_id}: (browser, its tokens)."""
    browser = Browser(h)
    verifier, challenge = pkce_pair()
    headers = {"User-Agent": user_agent} if user_agent else {}
    response, body = await browser.request("GET", h.authorize_url(client_id, challenge=challenge), headers=headers)
    fields = {**forms(body, ISSUER + "/login")[0], "username": user.login, "password": PASSWORDS[user.sub]}
    response, body = await browser.request("POST", ISSUER + "/login", data=fields, headers=headers)
    if "/consent?" in location(response):
        response, body = await browser.answer_consent(location(response), "approve")
    code = dict(p.split("=", 1) for p in location(response).split("?", 1)[1].split("&"))["code"]
    response, tokens = await exchange(h, code, verifier, client_id)
    assert response.code == 200, tokens
    return browser, tokens


@pytest_twisted.ensureDeferred
async def test_revoking_an_app_kills_its_refresh_token_and_asks_for_consent_again(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser, tokens = await signed_in(h, client_id="partner")
        response, body = await browser.get(ACCOUNT)
        assert response.code == 200, body
        page = body.decode()
        assert "Partner App" in page and "Your name and picture" in page
        [revoke] = forms(body, ACCOUNT + "/apps/revoke")
        assert revoke["client_id"] == "partner"

        response, body = await browser.post(ACCOUNT + "/apps/revoke", {**revoke, "csrf": "forged"})
        assert response.code == 403
        response, body = await browser.post(ACCOUNT + "/apps/revoke", revoke)
        body = await answered(browser, response, "app-revoked")
        assert b"access is revoked" in body
        assert b"No application has access to your account." in body
        response, answer = await refresh(h, tokens["refresh_token"], client_id="partner")
        assert response.code == 400 and answer["error"] == "invalid_grant"
        assert await h.store.get_consent(ALICE.sub, "partner") is None

        response, _ = await browser.authorize("partner")
        assert response.code == 303 and "/consent?" in location(response), "the consent page comes back"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_signing_out_another_browser_ends_its_session(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        phone, _ = await signed_in(h, user_agent=FIREFOX)
        laptop, _ = await signed_in(h)
        h.clock.advance(120)
        response, body = await laptop.get(ACCOUNT)
        page = body.decode()
        assert "Firefox on Linux" in page and "This browser" in page
        [other] = forms(body, ACCOUNT + "/sessions/end")
        phone_session = await h.store.get_session(phone.session_hash, h.now())
        assert other["sid"] == phone_session.sid and phone_session.user_agent == FIREFOX

        response, body = await laptop.post(ACCOUNT + "/sessions/end", other)
        assert b"That session is signed out." in await answered(laptop, response, "session-ended")
        assert await h.store.get_session(phone.session_hash, h.now()) is None
        assert (await h.store.get_session(laptop.session_hash, h.now())).last_seen == h.now()
        response, _ = await phone.get(ACCOUNT)
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request=")
        response, body = await laptop.post(ACCOUNT + "/sessions/end", other)
        assert b"That session had ended already." in await answered(laptop, response, "session-gone")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_password_change_needs_the_current_one_and_ends_other_sessions(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        other, kept = await signed_in(h)
        browser, _ = await signed_in(h)
        await signed_in(h, user=BOB)
        response, body = await browser.get(ACCOUNT)
        [change] = forms(body, ACCOUNT + "/password")
        new = "a brand new and long passphrase"

        response, body = await browser.post(ACCOUNT + "/password", {
            **change, "current_password": "not it", "new_password": new, "new_password_again": new})
        assert b"Your current password is not right." in await answered(browser, response, "current-password-wrong")
        response, body = await browser.post(ACCOUNT + "/password", {
            **change, "current_password": PASSWORDS[ALICE.sub], "new_password": new, "new_password_again": "typo"})
        assert response.code == 400 and b"The two new passwords are not the same." in body
        for weak in ("password1", "alice-in-wonderland"):
            response, body = await browser.post(ACCOUNT + "/password", {
                **change, "current_password": PASSWORDS[ALICE.sub], "new_password": weak, "new_password_again": weak})
            assert b"Your password is changed" not in body and (b"common" in body or b"login" in body), body
        assert await h.store.get_session(other.session_hash, h.now()) is not None

        response, body = await browser.post(ACCOUNT + "/password", {
            **change, "current_password": PASSWORDS[ALICE.sub], "new_password": new, "new_password_again": new})
        assert b"Your password is changed" in await answered(browser, response, "password-changed")
        assert await h.store.get_session(other.session_hash, h.now()) is None
        assert await h.store.get_session(browser.session_hash, h.now()) is not None
        assert len(await h.store.list_user_sessions(BOB.sub, h.now())) == 1
        response, answer = await refresh(h, kept["refresh_token"])
        assert response.code == 200, "grants stay (docs/design.md, Password changes)"

        fresh = Browser(h)
        response, _ = await fresh.authorize()
        response, body = await fresh.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 200 and b"The username or password is incorrect." in body, "the old one is gone"
        response, _ = await fresh.authorize()
        response, _ = await fresh.submit_login(response, ALICE.login, new)
        assert response.code == 303 and "code=" in location(response)
    finally:
        await h.close()


class HeldHashes:
    """
    Records which thread hashes (C{work}: C{"hash"}) or checks (C{"verify"})
    the password C{held}, and holds it there until L{release}: the request
    stays mid-hash meanwhile.
    """

    def __init__(self, monkeypatch, held: str, work: str = "hash"):
        self.threads: list[str] = []
        self._started, self._released = threading.Event(), threading.Event()
        original = getattr(PasswordHasher, work)

        def holding(hasher, *args, **kwargs):
            if held in args or held.encode() in args:
                self.threads.append(threading.current_thread().name)
                self._started.set()
                self._released.wait(30)
            return original(hasher, *args, **kwargs)

        monkeypatch.setattr(PasswordHasher, work, holding)

    async def started(self) -> None:
        assert await deferToThread(self._started.wait, 30), "the password never reached argon2"

    def release(self) -> None:
        self._released.set()


@pytest.mark.parametrize("cap, done, message, status", [
    ("checks_in_flight", "password-not-checked", b"could not be checked just now", 503),
    ("checks_per_address", "password-throttled", b"Too many password attempts just now", 429),
])
@pytest_twisted.ensureDeferred
async def test_a_new_password_is_hashed_on_the_password_pool_as_one_of_the_checks_in_flight(
        tmp_path, monkeypatch, cap, done, message, status):
    """
    The new hash is made on the bounded password pool, not the reactor's
    default one, and counts toward the caps of password checks as the check
    before it: with room for one, while Alice's is being made Bob's password
    change (from the same address) is refused with the page's own message
    (after the 303, as every answer of the form), and a sign-in as at once.
    """
    new = "a brand new and long passphrase"
    h = await Harness(tmp_path, monkeypatch, {"throttle": {cap: 1}}).start()
    hashes = HeldHashes(monkeypatch, new)
    try:
        alice, _ = await signed_in(h)
        bob, _ = await signed_in(h, user=BOB)
        changes = {}
        for browser, user in ((alice, ALICE), (bob, BOB)):
            response, body = await browser.get(ACCOUNT)
            [change] = forms(body, ACCOUNT + "/password")
            chosen = new if user is ALICE else new + " of Bob's"
            changes[user.sub] = {**change, "current_password": PASSWORDS[user.sub], "new_password": chosen,
                                 "new_password_again": chosen}
        first = Deferred.fromCoroutine(alice.post(ACCOUNT + "/password", changes[ALICE.sub]))
        await hashes.started()

        response, _ = await bob.post(ACCOUNT + "/password", changes[BOB.sub])
        body = await answered(bob, response, done)
        assert b'role="alert"' in body and message in body
        stranger = Browser(h)
        response, _ = await stranger.authorize()
        response, body = await stranger.submit_login(response, BOB.login, PASSWORDS[BOB.sub])
        assert response.code == status, body

        hashes.release()
        response, _ = await first
        assert b"Your password is changed" in await answered(alice, response, "password-changed")
        assert [name.rsplit("-", 1)[0] for name in hashes.threads] == ["PoolThread-authsrv-passwords"]
    finally:
        hashes.release()
        await h.close()


@pytest_twisted.ensureDeferred
async def test_with_the_password_checks_all_busy_a_password_change_says_so(tmp_path, monkeypatch, audit):
    """Not that the current password is wrong: it was never checked, and nothing is counted against it."""
    h = await Harness(tmp_path, monkeypatch, {"throttle": {"checks_in_flight": 1}}).start()
    checks = HeldHashes(monkeypatch, "a guess held mid-check", "verify")
    try:
        browser, _ = await signed_in(h)
        response, body = await browser.get(ACCOUNT)
        [change] = forms(body, ACCOUNT + "/password")
        stranger = Browser(h)
        response, _ = await stranger.authorize()
        guess = Deferred.fromCoroutine(stranger.submit_login(response, BOB.login, "a guess held mid-check"))
        await checks.started()

        new = "a brand new and long passphrase"
        response, _ = await browser.post(ACCOUNT + "/password", {
            **change, "current_password": PASSWORDS[ALICE.sub], "new_password": new, "new_password_again": new})
        body = await answered(browser, response, "password-not-checked")
        assert b"Your current password is not right." not in body and b"could not be checked just now" in body
        assert [e["reason"] for e in audit.of("account.password_change_refused")] == ["current password not checkable"]
        checks.release()
        response, _ = await guess
        assert response.code == 200
    finally:
        checks.release()
        await h.close()


async def alice_changes_her_password(h: Harness, new: str | bytes, current: str | bytes = PASSWORDS[ALICE.sub]):
    """Alice, signed in, sends the account page's password form: (her browser, the answer, its body)."""
    browser, _ = await signed_in(h)
    response, body = await browser.get(ACCOUNT)
    [change] = forms(body, ACCOUNT + "/password")
    response, body = await browser.post(ACCOUNT + "/password", {
        **change, "current_password": current, "new_password": new, "new_password_again": new})
    return browser, response, body


NEW = "a brand new and long passphrase"


@pytest.mark.parametrize("current, new, says", [
    ("pass\x00word", NEW, b"The current password holds a NUL character"),
    (b"\xffpassword", NEW, b"The current password was not sent as UTF-8 text"),
    (PASSWORDS[ALICE.sub], "new\x00" + NEW, b"The new password holds a NUL character, which no password can"),
    (PASSWORDS[ALICE.sub], "n" * 9000, b"must be at most 1,024 characters long"),
    (PASSWORDS[ALICE.sub], b"\xff" + NEW.encode(), b"The new password was not sent as UTF-8 text"),
])
@pytest_twisted.ensureDeferred
async def test_a_password_no_one_can_have_is_refused_on_the_form_unchecked(tmp_path, monkeypatch, audit,
                                                                          current, new, says):
    """
    A NUL, text that is not UTF-8 or a field over the form's cap made the
    password form unreadable: the expired-form page. The page shows the form
    again, saying what is wrong, with a 400; nothing is hashed or counted.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        hashed = []
        original = PasswordHasher.hash
        monkeypatch.setattr(PasswordHasher, "hash", lambda *a, **k: hashed.append(a) or original(*a, **k))
        browser, response, body = await alice_changes_her_password(h, new, current)
        assert response.code == 400 and b'role="alert"' in body and says in body, body
        assert forms(body, ACCOUNT + "/password") and b"expired" not in body
        assert hashed == [] and not audit.of("login.failed")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_long_current_password_under_the_cap_is_checked_as_any_other(tmp_path, monkeypatch):
    """One longer than a form field's cap (8192 characters) is a wrong password, not an expired form."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser, response, _ = await alice_changes_her_password(h, NEW, "p" * 9000)
        assert b"Your current password is not right." in await answered(browser, response, "current-password-wrong")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_new_password_that_cannot_be_hashed_is_refused_with_the_old_one_kept(tmp_path, monkeypatch, audit):
    """
    The new hash failing on the password pool (argon2 out of memory, say)
    is the page's own refusal after the 303, not a 500, and the password is
    the old one still.
    """
    new = "a brand new and long passphrase"
    original = PasswordHasher.hash

    def failing(hasher, password, *args, **kwargs):
        if password in (new, new.encode()):
            raise HashingError("Memory allocation error")
        return original(hasher, password, *args, **kwargs)

    h = await started(tmp_path, monkeypatch)
    monkeypatch.setattr(PasswordHasher, "hash", failing)
    try:
        browser, response, _ = await alice_changes_her_password(h, new)
        body = await answered(browser, response, "password-not-changed")
        assert b'role="alert"' in body and b"could not be changed just now" in body
        assert [e["reason"] for e in audit.of("account.password_change_refused")] == ["new password not hashed"]
        fresh = Browser(h)
        response, _ = await fresh.authorize()
        response, _ = await fresh.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "code=" in location(response), "the old password still signs in"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_user_removed_while_their_password_changes_is_signed_out_not_a_500(tmp_path, monkeypatch, audit):
    """
    An operator removing the user between the check of the current password
    and the write of the new hash (the backend then knows no such login):
    the page says the session has ended, as it has, rather than failing.
    """
    new = "a brand new and long passphrase"
    original = StaticIdentityBackend.set_password_hash

    async def removed_first(backend, login, password_hash):
        await backend.remove_user(login)
        return await original(backend, login, password_hash)

    h = await started(tmp_path, monkeypatch)
    monkeypatch.setattr(StaticIdentityBackend, "set_password_hash", removed_first)
    try:
        _, response, body = await alice_changes_her_password(h, new)
        assert response.code == 401, body
        assert b"Not signed in" in body
        assert [e["reason"] for e in audit.of("account.password_change_refused")] == ["user removed meanwhile"]
    finally:
        await h.close()


async def shown_and_reloaded(browser: Browser, url: str, fields: dict[str, str]):
    """
    A form posted and its answer reloaded, as a browser does: what it asks
    for again is the page a 303 sent it to, or else the form's own POST.
    """
    response, body = await browser.post(url, fields)
    if response.code == 303:
        return await browser.get(location(response))
    return await browser.post(url, fields)


@pytest_twisted.ensureDeferred
async def test_reloading_the_answer_of_a_password_change_sends_nothing_again(tmp_path, monkeypatch, audit):
    """Not the old password, refused then and counted as a failed sign-in toward the throttle."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser, _ = await signed_in(h)
        response, body = await browser.get(ACCOUNT)
        [change] = forms(body, ACCOUNT + "/password")
        new = "a brand new and long passphrase"
        response, body = await shown_and_reloaded(browser, ACCOUNT + "/password", {
            **change, "current_password": PASSWORDS[ALICE.sub], "new_password": new, "new_password_again": new})
        assert not audit.of("login.failed"), "the reload sent the old password again"
        assert response.code == 200 and b"Your password is changed" in body
        assert len(audit.of("account.password_changed")) == 1

        response, body = await shown_and_reloaded(browser, ACCOUNT + "/password", {
            **change, "current_password": "not it", "new_password": new, "new_password_again": new})
        assert b"Your current password is not right." in body
        assert len(audit.of("login.failed")) == 1, "the refused guess counts once, its reload not again"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_page_shows_only_its_own_messages(tmp_path, monkeypatch):
    """Words in its URL are never shown: a link cannot make the page say what its sender likes."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser, _ = await signed_in(h)
        for done in ("Call+0800+now", "%3Cscript%3Ealert(1)%3C/script%3E", "PASSWORD-CHANGED", "%FF"):
            response, body = await browser.get(f"{ACCOUNT}?done={done}")
            assert response.code == 200 and b'class="notice"' not in body and b'id="message"' not in body, done
            assert b"0800" not in body and b"alert(1)" not in body
        response, body = await browser.get(ACCOUNT + "?done=current-password-wrong")
        assert b'role="alert"' in body and b"Your current password is not right." in body
        response, body = await browser.get(ACCOUNT + "?done=chat-unlinked")
        assert b'<p class="notice" role="status">Your chat account is no longer linked.</p>' in body
    finally:
        await h.close()


async def signs_in_and_returns(h: Harness, opened: str, secret: str, back: str) -> Browser:
    """
    A browser without a session opens C{opened}: an empty login form, the
    password, the second factor, and back to exactly the page C{back}.
    """
    browser = Browser(h)
    response, _ = await browser.get(opened)
    assert response.code == 303 and location(response).startswith(ISSUER + "/login?request=")
    response, body = await browser.get(location(response))
    assert shows_login_form(response, body) and b"your account" in body
    assert b'name="username" value=""' in body, "no login is filled in"
    response, _ = await browser.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
    assert response.code == 303 and "/mfa?" in location(response)
    assert "authsrv_session" not in browser.cookies, "no session before the second factor"
    response, _ = await give_code(browser, location(response), code_at(secret, h.now()))
    assert response.code == 303 and location(response) == back
    h.clock.advance(30)
    return browser


@pytest_twisted.ensureDeferred
async def test_without_a_session_the_page_signs_in_and_comes_back(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        browser = await signs_in_and_returns(h, ACCOUNT, secret, ACCOUNT)
        response, body = await browser.get(ACCOUNT)
        assert response.code == 200 and f"Signed in as <strong>{ALICE.login}</strong>".encode() in body

        browser = await signs_in_and_returns(h, TOTP_PAGE, secret, TOTP_PAGE)
        response, body = await browser.get(TOTP_PAGE)
        assert response.code == 200 and enrolment_of(body)[0], "a new authenticator's secret"

        for opened in (ACCOUNT + "/sign-in", ACCOUNT + "?next=https://evil.example/",
                       ACCOUNT + "/sign-in?return_to=https://evil.example/", TOTP_PAGE + "?next=//evil.example"):
            await signs_in_and_returns(h, opened, secret, opened.split("?")[0].removesuffix("/sign-in"))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_form_posted_without_a_session_is_refused(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        for action in ("/apps/revoke", "/sessions/end", "/password", "/passkeys", "/mfa/totp", "/mfa/recovery"):
            response, body = await Browser(h).post(ACCOUNT + action, {"client_id": "first"})
            assert response.code == 401 and b"Open your account page to sign in" in body, action
            assert response.headers.getRawHeaders(b"location") is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_sign_ins_the_page_starts_count_toward_the_address_cap(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, {"limits": {"pending_per_address": 2}}).start()
    try:
        response, _ = await Browser(h).get(ACCOUNT)
        assert response.code == 303
        response, body = await Browser(h).authorize()
        stored = await h.store.get_interaction(hidden_fields(body)["request"], h.now())
        assert stored.address is not None
        for page in (ACCOUNT, TOTP_PAGE, ACCOUNT + "/sign-in"):
            response, body = await Browser(h).get(page)
            assert response.code == 429 and b"Too many sign-ins" in body, page
            assert response.headers.getRawHeaders(b"location") is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_removing_a_passkey_needs_a_recent_sign_in_and_signing_in_again_comes_back(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        await h.store.add_passkey(Passkey("cred-1", ALICE.sub, b"cose-key", 1, False, False, ("internal",), h.now()))
        browser = Browser(h)
        response, _ = await password(browser, ALICE)
        response, _ = await give_code(browser, location(response), code_at(secret, h.now()))
        response, body = await browser.get(ACCOUNT)
        [remove] = forms(body, ACCOUNT + "/passkeys/remove")
        h.clock.advance(601)

        response, body = await browser.post(ACCOUNT + "/passkeys/remove", remove)
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request="), body
        assert len(await h.store.list_passkeys(ALICE.sub)) == 1
        response, body = await browser.get(ACCOUNT)
        assert not forms(body, ACCOUNT + "/passkeys/remove") and not forms(body, ACCOUNT + "/passkeys")
        assert f'href="{ACCOUNT}/sign-in"'.encode() in body

        response, _ = await browser.get(ACCOUNT + "/sign-in")
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request=")
        response, _ = await browser.submit_login(location(response), ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "/mfa?" in location(response)
        response, _ = await give_code(browser, location(response), code_at(secret, h.now()))
        assert response.code == 303 and location(response) == ACCOUNT
        response, body = await browser.get(ACCOUNT)
        [remove] = forms(body, ACCOUNT + "/passkeys/remove")
        response, body = await browser.post(ACCOUNT + "/passkeys/remove", remove)
        assert b"The passkey is removed." in await answered(browser, response, "passkey-removed")
        assert await h.store.list_passkeys(ALICE.sub) == []
        response, _ = await Browser(h).get(ACCOUNT + "/sign-in")
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request=")
    finally:
        await h.close()


def test_devices_are_named_from_the_user_agent():
    assert device_of(FIREFOX) == "Firefox on Linux"
    assert device_of("Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 Version/17.0"
                     " Mobile/15E148 Safari/604.1") == "Safari on iPhone"
    assert device_of("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 Chrome/129.0 Safari/537.36"
                     " Edg/129.0") == "Edge on Windows"
    assert device_of(None) == "Unknown device"


@pytest_twisted.ensureDeferred
async def test_the_scripts_are_the_ones_the_policy_allows(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser, _ = await signed_in(h)
        response, body = await browser.get(ACCOUNT)
        passkey, guard = re.findall(r"<script>(.*?)</script>", body.decode(), re.S)
        digests = [base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() for s in (passkey, guard)]
        policy = response.headers.getRawHeaders(b"content-security-policy")[0].decode()
        assert "script-src {};".format(" ".join(f"'sha256-{d}'" for d in digests)) in policy
        assert policy.count("script-src") == 1
        assert "navigator.credentials" in passkey and 'data-passkey="create"' in body.decode()
        [add] = forms(body, ACCOUNT + "/passkeys")
        response, body = await browser.post(ACCOUNT + "/passkeys", {**add, "credential": '{"id": "forged"}'})
        assert b"The passkey could not be added." in await answered(browser, response, "passkey-not-added")
        assert await h.store.list_passkeys(ALICE.sub) == []
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_forged_passkey_answer_leaves_the_login_page_with_a_refusal(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, body = await browser.authorize()
        [fields] = forms(body, ISSUER + "/login/passkey")
        forged = '{"id": "AAAA", "response": {"clientDataJSON": "e30"}}'
        response, body = await browser.post(ISSUER + "/login/passkey", {**fields, "credential": forged})
        assert response.code == 200 and b"That passkey was not accepted." in body
        assert "authsrv_session" not in browser.cookies
    finally:
        await h.close()
