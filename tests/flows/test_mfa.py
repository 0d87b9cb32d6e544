"""
Second factors through the in-memory server: enrolment at the service and
during a sign-in, TOTP codes computed by pyotp at the Clock's time, replay,
the ±1 step window, recovery codes, the [mfa] policy and per-client
requirement with its grace period, step-up by acr_values and the claims
request, amr and acr in ID tokens, the throttle, and an operator's reset.
"""

from __future__ import annotations

import json
import re
from html import unescape

import pyotp
import pytest
import pytest_twisted

from flow_client import Browser, hidden_fields, location, shows_login_form
from harness import CLIENTS, ISSUER, Harness, pkce_pair, query_of
from token_helpers import exchange, verify_jwt

from authsrv.config import parse_config
from authsrv.configsection import ConfigError
from authsrv.flows.login import Throttled
from authsrv.flows.mfa import CodeRefused, MfaPolicy, SecondFactors, reset_factors
from authsrv.protocol.errors import InvalidRequest
from authsrv.protocol.oidc import mfa_requested, requested_acr
from authsrv.records import ACR_MFA, ACR_PWD, Ban, ThrottlePolicy
from authsrv.testing.identity import ALICE, BOB, PASSWORDS

TOTP_PAGE = ISSUER + "/account/mfa/totp"
RECOVERY = ISSUER + "/account/mfa/recovery"
ACCOUNT_DONE = ISSUER + "/account?done="
DAY = 86400
_SECRET = re.compile(r"<p><code>([A-Z2-7]+)</code></p>")
_CODES = re.compile(r"<li><code>([a-z0-9]{5}-[a-z0-9]{5})</code></li>")


async def started(tmp_path, monkeypatch, **mfa) -> Harness:
    return await Harness(tmp_path, monkeypatch, {"mfa": mfa} if mfa else None).start()


def code_at(secret: str, moment: int) -> str:
    return pyotp.TOTP(secret).at(moment)


def enrolment_of(body: bytes) -> tuple[str, list[str], dict[str, str]]:
    """(secret, recovery codes, hidden fields) of an enrolment page."""
    text = body.decode()
    return _SECRET.search(text).group(1), _CODES.findall(text), hidden_fields(body)


async def password(browser: Browser, user, client_id="first", **params):
    """Authorize and give the password; the answer that follows it."""
    response, body = await browser.authorize(client_id, **params)
    assert shows_login_form(response, body), body
    return await browser.submit_login(response, user.login, PASSWORDS[user.sub])


async def enrol_at_account_page(h: Harness, browser: Browser) -> tuple[str, list[str]]:
    """A signed-in browser sets up an authenticator at the service; (secret, recovery codes)."""
    response, body = await browser.get(TOTP_PAGE)
    assert response.code == 200, body
    secret, codes, fields = enrolment_of(body)
    response, body = await browser.post(TOTP_PAGE, {**fields, "code": code_at(secret, h.now())})
    assert response.code == 303 and location(response) == ACCOUNT_DONE + "totp-set-up", body
    response, body = await browser.get(location(response))
    assert response.code == 200 and b"Authenticator set up" in body, body
    return secret, codes


async def enrolled(h: Harness, user=ALICE) -> tuple[Browser, str, list[str]]:
    """A user who signed in with a password and then enrolled; a later step, so the first code is spent."""
    browser = Browser(h)
    await browser.sign_in(user)
    secret, codes = await enrol_at_account_page(h, browser)
    h.clock.advance(30)
    return browser, secret, codes


async def give_code(browser: Browser, page_url: str, code: str):
    response, body = await browser.get(page_url)
    assert response.code == 200, body
    return await browser.post(ISSUER + "/mfa", {**hidden_fields(body), "code": code})


async def id_token_of(h: Harness, browser: Browser, client_id="first", **params) -> dict:
    """Sign in (the session exists and needs nothing more) and exchange the code: the ID token's claims."""
    verifier, challenge = pkce_pair()
    query = await browser.sign_in(ALICE, client_id, challenge=challenge, **params)
    return await claims_of(h, query, verifier, client_id)


async def claims_of(h: Harness, query: dict, verifier: str, client_id="first") -> dict:
    response, body = await exchange(h, query["code"], verifier, client_id)
    assert response.code == 200, body
    return verify_jwt(h, body["id_token"], aud=client_id)[1]


@pytest_twisted.ensureDeferred
async def test_enrol_then_every_sign_in_asks_for_a_code(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        stored = await h.store.get_totp(ALICE.sub)
        assert secret.encode() not in stored.secret_enc
        assert [e["kind"] for e in audit.of("mfa.enrolled")] == ["totp"]
        browser = Browser(h)
        verifier, challenge = pkce_pair()
        response, _ = await password(browser, ALICE, challenge=challenge)
        assert response.code == 303 and "/mfa?" in location(response)
        assert "authsrv_session" not in browser.cookies
        response, body = await give_code(browser, location(response), code_at(secret, h.now()))
        assert response.code == 303, body
        assert browser.session_hash is not None
        claims = await claims_of(h, query_of(location(response)), verifier)
        assert claims["amr"] == ["pwd", "otp", "mfa"] and claims["acr"] == ACR_MFA
        assert claims["auth_time"] == h.now()
        assert [e["method"] for e in audit.of("mfa.succeeded")] == ["totp"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_password_and_the_code_sent_twice_get_their_first_answers(tmp_path, monkeypatch):
    """
    Without JavaScript each form of a sign-in with a second factor sent
    twice: the second post of the password gets the way on to the code's
    page again, the second post of the code the first one's redirect and
    session cookie, which it does not carry yet; another browser neither.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        browser = Browser(h)
        response, body = await browser.authorize("first")
        assert shows_login_form(response, body), body
        password_form = {**hidden_fields(body), "username": ALICE.login, "password": PASSWORDS[ALICE.sub]}
        first, _ = await browser.post(ISSUER + "/login", password_form)
        again, _ = await browser.post(ISSUER + "/login", password_form)
        assert again.code == 303 and "/mfa?" in location(first) and location(again) == location(first)
        response, body = await browser.get(location(first))
        code_form = {**hidden_fields(body), "code": code_at(secret, h.now())}
        before = dict(browser.cookies)
        first, _ = await browser.post(ISSUER + "/mfa", code_form)
        session = browser.cookies["authsrv_session"]
        browser.cookies = before
        again, _ = await browser.post(ISSUER + "/mfa", code_form)
        assert again.code == 303 and "code" in query_of(location(first)) and location(again) == location(first)
        assert browser.cookies["authsrv_session"] == session
        stranger = Browser(h)
        for path, form in (("/login", password_form), ("/mfa", code_form)):
            response, body = await stranger.post(ISSUER + path, form)
            assert response.code == 400 and "authsrv_session" not in stranger.cookies
    finally:
        await h.close()


def enrolment_dropped(response) -> bool:
    """Whether the answer clears the enrolment the browser kept."""
    return any(header.startswith(b"authsrv_enrolment=;") and b"Max-Age=0" in header
               for header in response.headers.getRawHeaders(b"set-cookie", []))


@pytest_twisted.ensureDeferred
async def test_the_enrolment_confirmed_or_put_off_sent_twice_gets_its_first_answer(tmp_path, monkeypatch):
    """
    Without JavaScript a sign-in's enrolment form sent twice: the second
    post gets the first one's redirect and session cookie, which it does
    not carry yet, and a confirmed enrolment's second answer drops the
    enrolment the browser kept too; another browser gets neither.
    """
    h = await started(tmp_path, monkeypatch, required="required", enrol_grace="7d")
    try:
        for user, action in ((ALICE, "confirm"), (BOB, "later")):
            browser = Browser(h)
            response, _ = await password(browser, user)
            response, body = await browser.get(location(response))
            assert response.code == 200, body
            secret, _, fields = enrolment_of(body)
            form = {**fields, "action": action, "code": code_at(secret, h.now())}
            before = dict(browser.cookies)
            first, body = await browser.post(ISSUER + "/mfa/enrol", form)
            assert first.code == 303 and "code" in query_of(location(first)), body
            session = browser.cookies["authsrv_session"]
            browser.cookies = before
            again, body = await browser.post(ISSUER + "/mfa/enrol", form)
            assert again.code == 303 and location(again) == location(first), body
            assert browser.cookies["authsrv_session"] == session
            assert (enrolment_dropped(first), enrolment_dropped(again)) == ((action == "confirm"),) * 2
            stranger = Browser(h)
            response, _ = await stranger.post(ISSUER + "/mfa/enrol", form)
            assert response.code == 400 and "authsrv_session" not in stranger.cookies
            h.clock.advance(30)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_step_ups_enrolment_sent_twice_gets_its_first_answer(tmp_path, monkeypatch):
    """The step-up's raised session cookie is set again, and the enrolment dropped, for the second post."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, _ = await browser.authorize("first", acr_values=ACR_MFA)
        secret, _, fields = enrolment_of((await browser.get(location(response)))[1])
        form = {**fields, "code": code_at(secret, h.now())}
        before = dict(browser.cookies)
        first, body = await browser.post(ISSUER + "/mfa/enrol", form)
        assert first.code == 303 and "code" in query_of(location(first)), body
        session = browser.cookies["authsrv_session"]
        browser.cookies = before
        again, body = await browser.post(ISSUER + "/mfa/enrol", form)
        assert again.code == 303 and location(again) == location(first), body
        assert browser.cookies["authsrv_session"] == session and enrolment_dropped(again)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_code_is_accepted_once_and_within_one_step_either_side(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        first = Browser(h)
        response, _ = await password(first, ALICE)
        code = code_at(secret, h.now())
        response, _ = await give_code(first, location(response), code)
        assert response.code == 303
        second = Browser(h)
        response, _ = await password(second, ALICE)
        page = location(response)
        response, body = await give_code(second, page, code)
        assert response.code == 200 and b"was used already" in body
        response, body = await give_code(second, page, code_at(secret, h.now() - 30))
        assert response.code == 200, "a step before the one used is no good either"
        response, body = await give_code(second, page, code_at(secret, h.now() + 60))
        assert response.code == 200, "two steps ahead is outside the window"
        response, body = await give_code(second, page, code_at(secret, h.now() + 30))
        assert response.code == 303, body
        h.clock.advance(90)
        third = Browser(h)
        response, _ = await password(third, ALICE)
        response, body = await give_code(third, location(response), code_at(secret, h.now() - 30))
        assert response.code == 303, "a phone's clock half a minute behind still works"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_recovery_code_works_once_and_new_ones_replace_the_old(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        signed_in, secret, codes = await enrolled(h)
        assert len(codes) == 10 and len(set(codes)) == 10
        browser = Browser(h)
        verifier, challenge = pkce_pair()
        response, _ = await password(browser, ALICE, challenge=challenge)
        response, _ = await give_code(browser, location(response), codes[0].upper().replace("-", " "))
        assert response.code == 303
        claims = await claims_of(h, query_of(location(response)), verifier)
        assert claims["amr"] == ["pwd", "otp", "mfa"]
        other = Browser(h)
        response, _ = await password(other, ALICE)
        response, body = await give_code(other, location(response), codes[0])
        assert response.code == 200 and b"was used already" in body
        factors = await h.store.list_factors(ALICE.sub)
        assert [(f.kind, f.remaining) for f in factors] == [("totp", None), ("recovery", 9)]

        # New codes need a session that gave its second factor: one that did not signs in again.
        response, body = await signed_in.get(TOTP_PAGE)
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request=")
        response, body = await browser.get(TOTP_PAGE)
        assert response.code == 200 and b"replaces your current authenticator" in body
        csrf = re.search(r'name="csrf" value="([^"]+)"', body.decode().split("/recovery")[1]).group(1)
        response, body = await browser.post(RECOVERY, {"csrf": "forged"})
        assert response.code == 403
        response, body = await new_recovery_codes(browser, unescape(csrf))
        assert response.code == 200, body
        fresh = _CODES.findall(body.decode())
        assert len(fresh) == 10 and not set(fresh) & set(codes)
        assert len(audit.of("mfa.recovery_codes_replaced")) == 1
        response, _ = await password(other, ALICE)
        response, _ = await give_code(other, location(response), codes[1])
        assert response.code == 200, "the old set is gone"
        third = Browser(h)
        response, _ = await password(third, ALICE)
        response, _ = await give_code(third, location(response), fresh[4])
        assert response.code == 303
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_account_page_needs_a_session_and_a_form_of_this_browser(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        stranger = Browser(h)
        response, body = await stranger.get(TOTP_PAGE)
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request="), body
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, body = await browser.get(TOTP_PAGE)
        secret, _, fields = enrolment_of(body)
        assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
        assert b'src="data:image/svg+xml' in body
        response, body = await browser.post(TOTP_PAGE, {**fields, "csrf": "x", "code": code_at(secret, h.now())})
        assert response.code == 403
        response, body = await browser.post(TOTP_PAGE, {**fields, "code": "000000"})
        assert response.code == 200 and b"does not match" in body
        assert enrolment_of(body)[0] == secret, "a wrong first code shows the same secret again"
        assert await h.store.get_totp(ALICE.sub) is None
        tampered = {**fields, "sealed": fields["sealed"][:-4] + "AAAA", "code": code_at(secret, h.now())}
        response, body = await browser.post(TOTP_PAGE, tampered)
        assert b"does not match" in body and await h.store.get_totp(ALICE.sub) is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_enrolling_needs_a_recent_sign_in_and_signing_in_again_comes_back(tmp_path, monkeypatch, audit):
    """A stolen session cookie alone enrols no authenticator once its sign-in is older than recent_sign_in."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, body = await browser.get(TOTP_PAGE)
        secret, _, fields = enrolment_of(body)
        h.clock.advance(601)
        response, body = await browser.post(TOTP_PAGE, {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request="), body
        assert await h.store.get_totp(ALICE.sub) is None and not audit.of("mfa.enrolled")
        response, _ = await browser.get(TOTP_PAGE)
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request=")

        response, body = await browser.get(location(response))
        assert shows_login_form(response, body) and b"your account" in body
        assert f'value="{ALICE.login}"'.encode() in body, "the user's login is filled in"
        stale = browser.session_hash
        response, _ = await browser.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and location(response) == TOTP_PAGE
        assert browser.session_hash != stale and await h.store.get_session(stale, h.now()) is None
        assert (await h.store.get_session(browser.session_hash, h.now())).auth_time == h.now()
        await enrol_at_account_page(h, browser)
        assert await h.store.get_totp(ALICE.sub) is not None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_step_up_enrols_an_old_session_only_after_the_password(tmp_path, monkeypatch):
    """An authorization request asking for the MFA class is no way around the account page's rule."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, _ = await browser.authorize("first", acr_values=ACR_MFA)
        assert response.code == 303 and "/mfa/enrol?" in location(response), "a recent session steps up"
        h.clock.advance(601)
        response, body = await browser.authorize("first", acr_values=ACR_MFA)
        assert shows_login_form(response, body), "an old one signs in again first"
        response, _ = await browser.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "/mfa/enrol?" in location(response)
        response, body = await browser.get(location(response))
        secret, _, fields = enrolment_of(body)
        response, _ = await browser.post(ISSUER + "/mfa/enrol", {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303 and await h.store.get_totp(ALICE.sub) is not None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_enrolment_page_left_open_enrols_nothing_once_the_sign_in_is_old(tmp_path, monkeypatch, audit):
    """
    A step-up's enrolment page waits longer than recent_sign_in: confirmed
    after it, the password is asked for first, as at the account page.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, _ = await browser.authorize("first", acr_values=ACR_MFA)
        response, body = await browser.get(location(response))
        secret, _, fields = enrolment_of(body)
        h.clock.advance(601)
        response, body = await browser.post(ISSUER + "/mfa/enrol", {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request="), body
        assert await h.store.get_totp(ALICE.sub) is None and not audit.of("mfa.enrolled")
        response, _ = await browser.submit_login(location(response), ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "/mfa/enrol?" in location(response)
        response, body = await browser.get(location(response))
        secret, _, fields = enrolment_of(body)
        response, _ = await browser.post(ISSUER + "/mfa/enrol", {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303 and "code" in query_of(location(response))
        assert await h.store.get_totp(ALICE.sub) is not None
    finally:
        await h.close()


@pytest.mark.parametrize("code", ["12\x003456", "1" * 9000, b"\xff123456"])
@pytest_twisted.ensureDeferred
async def test_a_code_no_app_shows_is_a_wrong_code_not_an_expired_form(tmp_path, monkeypatch, code):
    """
    A NUL, text that is not UTF-8 or more than a form field's cap in the
    code field made the form unreadable: the page of a form expired, which
    sent the person back to the application. It is a wrong code, on the
    same form, for the second factor as for a new authenticator.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        await enrolled(h)
        browser = Browser(h)
        response, _ = await password(browser, ALICE)
        response, body = await give_code(browser, location(response), code)
        assert response.code == 200 and b"That code is not right" in body, body
        fresh = Browser(h)
        await fresh.sign_in(BOB)
        response, body = await fresh.get(TOTP_PAGE)
        response, body = await fresh.post(TOTP_PAGE, {**enrolment_of(body)[2], "code": code})
        assert response.code == 200 and b"That code does not match" in body, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_reloading_the_authenticator_page_shows_the_same_key_and_codes(tmp_path, monkeypatch):
    """
    Each opening of the page made a new key and recovery codes, so the
    codes written down before a reload were silently not the ones confirmed.
    The browser keeps the enrolment it was shown (sealed, for its
    ENROLMENT_TTL), and the page shows it again; another user's is not theirs.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, body = await browser.get(TOTP_PAGE)
        secret, codes, fields = enrolment_of(body)
        h.clock.advance(60)
        response, body = await browser.get(TOTP_PAGE)
        assert response.code == 200 and enrolment_of(body)[:2] == (secret, codes)
        bob = Browser(h)
        await bob.sign_in(BOB)
        bob.cookies.update({name: value for name, value in browser.cookies.items() if "enrolment" in name})
        response, body = await bob.get(TOTP_PAGE)
        assert enrolment_of(body)[0] != secret, "sealed for Alice alone"
        response, body = await browser.post(TOTP_PAGE, {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303 and location(response) == ACCOUNT_DONE + "totp-set-up", body
        other = Browser(h)
        response, _ = await password(other, ALICE)
        response, _ = await give_code(other, location(response), codes[0])
        assert response.code == 303, "the codes shown first are the ones kept"
        other.cookies.update({name: value for name, value in browser.cookies.items() if "enrolment" in name})
        response, body = await other.get(TOTP_PAGE)
        assert response.code == 200 and enrolment_of(body)[0] != secret, "a confirmed key is never shown again"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_reloading_a_sign_ins_enrolment_page_shows_the_same_key_and_codes(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, _ = await browser.authorize("first", acr_values=ACR_MFA)
        page = location(response)
        shown = [enrolment_of((await browser.get(page))[1]) for _ in range(2)]
        assert shown[0][:2] == shown[1][:2]
        secret, _, fields = shown[1]
        response, _ = await browser.post(ISSUER + "/mfa/enrol", {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303 and "code" in query_of(location(response))
    finally:
        await h.close()


def recovery_csrf(body: bytes) -> str:
    """The CSRF token of the page's form that asks for new recovery codes."""
    return unescape(re.search(r'name="csrf" value="([^"]+)"', body.decode().split("/recovery")[1]).group(1))


async def new_recovery_codes(browser: Browser, csrf: str):
    """Ask for new recovery codes: (the page the form's 303 leads to, its body)."""
    response, body = await browser.post(RECOVERY, {"csrf": csrf})
    assert response.code == 303 and location(response) == RECOVERY, (response.code, body)
    return await browser.get(RECOVERY)


@pytest_twisted.ensureDeferred
async def test_reloading_new_recovery_codes_shows_them_once_and_makes_no_other_set(tmp_path, monkeypatch, audit):
    """
    The form's answer is the page showing the codes, which a reload sent
    again: a new set each time, the one written down silently gone. Now the
    form's 303 leads to the codes, shown once; the page opened again makes
    nothing and says so, with the form for a set asked for on purpose.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        browser = Browser(h)
        response, _ = await password(browser, ALICE)
        await give_code(browser, location(response), code_at(secret, h.now()))
        response, body = await browser.get(TOTP_PAGE)
        response, body = await new_recovery_codes(browser, recovery_csrf(body))
        assert response.code == 200 and response.headers.getRawHeaders("cache-control") == ["no-store"]
        shown = _CODES.findall(body.decode())
        assert len(shown) == 10
        for _ in range(2):
            response, body = await browser.get(RECOVERY)
            assert response.code == 200 and b"<h1>Recovery codes shown already</h1>" in body
            assert not _CODES.findall(body.decode())
        assert len(audit.of("mfa.recovery_codes_replaced")) == 1
        other = Browser(h)
        response, _ = await password(other, ALICE)
        response, _ = await give_code(other, location(response), shown[0])
        assert response.code == 303, "the set shown is the set kept"

        response, body = await new_recovery_codes(browser, recovery_csrf(body))
        again = _CODES.findall(body.decode())
        assert len(again) == 10 and not set(again) & set(shown), "asked for on purpose, a new set"
        assert len(audit.of("mfa.recovery_codes_replaced")) == 2
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_new_recovery_codes_need_a_recent_sign_in_with_the_second_factor(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, codes = await enrolled(h)
        browser = Browser(h)
        response, _ = await password(browser, ALICE)
        response, _ = await give_code(browser, location(response), code_at(secret, h.now()))
        response, body = await browser.get(TOTP_PAGE)
        csrf = unescape(re.search(r'name="csrf" value="([^"]+)"', body.decode().split("/recovery")[1]).group(1))
        h.clock.advance(601)
        response, body = await browser.post(RECOVERY, {"csrf": csrf})
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request="), body
        assert not audit.of("mfa.recovery_codes_replaced")

        response, _ = await browser.submit_login(location(response), ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "/mfa?" in location(response), "the password alone is not enough"
        response, _ = await give_code(browser, location(response), code_at(secret, h.now()))
        assert response.code == 303 and location(response) == TOTP_PAGE
        response, body = await browser.get(TOTP_PAGE)
        response, body = await new_recovery_codes(browser, recovery_csrf(body))
        assert response.code == 200 and not set(_CODES.findall(body.decode())) & set(codes)
        assert len(audit.of("mfa.recovery_codes_replaced")) == 1
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_policy_off_asks_nothing_and_offers_no_enrolment(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch, required="off")
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, _ = await browser.get(TOTP_PAGE)
        assert response.code == 404
        verifier, challenge = pkce_pair()
        query = await Browser(h).sign_in(ALICE, challenge=challenge, acr_values=ACR_MFA)
        claims = await claims_of(h, query, verifier)
        assert claims["acr"] == ACR_PWD and claims["amr"] == ["pwd"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_policy_optional_leaves_users_without_factors_alone(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch, required="optional")
    try:
        claims = await id_token_of(h, Browser(h))
        assert claims["acr"] == ACR_PWD and claims["amr"] == ["pwd"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_policy_required_sends_to_enrolment_with_a_grace_period(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch, required="required", enrol_grace="7d")
    try:
        browser = Browser(h)
        verifier, challenge = pkce_pair()
        response, _ = await password(browser, ALICE, challenge=challenge)
        assert "/mfa/enrol?" in location(response)
        response, body = await browser.get(location(response))
        assert response.code == 200 and b"Not now" in body and b"put this off until" in body
        _, _, fields = enrolment_of(body)
        response, body = await browser.post(ISSUER + "/mfa/enrol", {**fields, "action": "later"})
        assert response.code == 303, body
        claims = await claims_of(h, query_of(location(response)), verifier)
        assert claims["acr"] == ACR_PWD
        assert len(audit.of("mfa.put_off")) == 1

        h.clock.advance(7 * DAY)
        late = Browser(h)
        verifier, challenge = pkce_pair()
        response, _ = await password(late, ALICE, challenge=challenge)
        page = location(response)
        response, body = await late.get(page)
        assert b"Not now" not in body
        secret, _, fields = enrolment_of(body)
        response, body = await late.post(ISSUER + "/mfa/enrol", {**fields, "action": "later"})
        assert response.code == 200 and b"cannot put it off" in body
        assert "authsrv_session" not in late.cookies
        response, body = await late.post(ISSUER + "/mfa/enrol",
                                         {**hidden_fields(body), "action": "confirm", "code": code_at(secret, h.now())})
        assert response.code == 303, body
        claims = await claims_of(h, query_of(location(response)), verifier)
        assert claims["acr"] == ACR_MFA and claims["amr"] == ["pwd", "otp", "mfa"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_second_factor_and_enrolment_pages_open_only_in_the_browser_the_sign_in_began_in(
        tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        await enrolled(h, BOB)
        victim, other, fresh = Browser(h), Browser(h), Browser(h)
        await other.authorize("first")
        response, _ = await password(victim, BOB)
        second_factor = location(response)
        response, _ = await password(victim, ALICE, acr_values=ACR_MFA)
        enrolment = location(response)
        assert "/mfa?" in second_factor and "/mfa/enrol?" in enrolment
        for url in (second_factor, enrolment):
            for who in (other, fresh):
                response, body = await who.get(url)
                assert response.code == 400 and b"<title>Sign-in ended</title>" in body, body
                assert b'name="code"' not in body and b"<code>" not in body
        response, body = await victim.get(second_factor)
        assert response.code == 200 and b'name="code"' in body, "a reload in the browser it began in shows it again"
        response, body = await victim.get(enrolment)
        assert response.code == 200 and enrolment_of(body)[0]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_may_require_mfa_of_its_users(tmp_path, monkeypatch):
    clients = [{**c, "require_mfa": True} if c["client_id"] == "partner" else c for c in CLIENTS]
    h = await Harness(tmp_path, monkeypatch, {"clients": clients, "mfa": {"enrol_grace": 0}}).start()
    try:
        assert (await h.store.get_client("partner")).require_mfa
        browser = Browser(h)
        await browser.sign_in(BOB, "first")
        response, _ = await browser.authorize("partner")
        assert response.code == 303 and "/mfa/enrol?" in location(response), "the live session is stepped up"
        response, body = await browser.get(location(response))
        assert b"Not now" not in body and b"Partner App" in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_acr_values_step_up_a_password_session(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, _ = await browser.authorize("first", acr_values=ACR_MFA)
        response, _ = await browser.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert "/mfa/enrol?" in location(response), "a user without factors is asked to enrol"
        response, body = await browser.get(location(response))
        secret, _, fields = enrolment_of(body)
        response, _ = await browser.post(ISSUER + "/mfa/enrol", {**fields, "action": "later"})
        assert response.code == 303
        pwd_session = await h.store.get_session(browser.session_hash, h.now())
        assert pwd_session.acr == ACR_PWD

        # Enrol later; then a request for the MFA class steps the same session up.
        h.clock.advance(60)
        secret, _ = await enrol_at_account_page(h, browser)
        h.clock.advance(30)
        response, _ = await browser.authorize("first", acr_values=ACR_MFA, prompt="none")
        assert query_of(location(response))["error"] == "login_required"
        verifier, challenge = pkce_pair()
        response, _ = await browser.authorize("first", challenge=challenge, acr_values=f"{ACR_MFA} urn:other")
        assert "/mfa?" in location(response)
        response, _ = await give_code(browser, location(response), code_at(secret, h.now()))
        assert response.code == 303
        raised = await h.store.get_session(browser.session_hash, h.now())
        assert raised.sid == pwd_session.sid and raised.session_hash != pwd_session.session_hash
        assert raised.acr == ACR_MFA and raised.auth_time == h.now()
        assert await h.store.get_session(pwd_session.session_hash, h.now()) is None
        claims = await claims_of(h, query_of(location(response)), verifier)
        assert claims["acr"] == ACR_MFA and claims["sid"] == pwd_session.sid
        claims = await id_token_of(h, browser, acr_values=ACR_MFA)
        assert claims["acr"] == ACR_MFA, "a session that gave its factor is not asked again"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_enrolment_put_off_past_max_age_signs_in_again(tmp_path, monkeypatch, audit):
    """
    A step-up's enrolment page left open past the request's max_age: putting
    it off must not give a code with the session's old auth_time (OIDC Core
    3.1.2.1); the user signs in again, and the code carries the new one.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        verifier, challenge = pkce_pair()
        response, _ = await browser.authorize("first", challenge=challenge, acr_values=ACR_MFA, max_age="120")
        assert "/mfa/enrol?" in location(response), "the live session is stepped up"
        response, body = await browser.get(location(response))
        h.clock.advance(121)
        issued = len(audit.of("code.issued"))
        response, _ = await browser.post(ISSUER + "/mfa/enrol", {**hidden_fields(body), "action": "later"})
        assert response.code == 303 and location(response).startswith(ISSUER + "/login?request="), location(response)
        assert len(audit.of("code.issued")) == issued
        response, _ = await browser.submit_login(location(response), ALICE.login, PASSWORDS[ALICE.sub])
        assert "/mfa/enrol?" in location(response)
        response, body = await browser.get(location(response))
        response, _ = await browser.post(ISSUER + "/mfa/enrol", {**hidden_fields(body), "action": "later"})
        claims = await claims_of(h, query_of(location(response)), verifier)
        assert claims["auth_time"] == h.now() and claims["acr"] == ACR_PWD
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_claims_request_for_the_mfa_acr_is_honoured(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        claims = json.dumps({"id_token": {"acr": {"essential": True, "values": [ACR_MFA]}}})
        response, _ = await password(Browser(h), BOB, claims=claims)
        assert "/mfa/enrol?" in location(response)
        response, _ = await password(Browser(h), BOB, claims=json.dumps({"id_token": {"acr": {"value": ACR_PWD}}}))
        assert "/mfa" not in location(response)
        response, _ = await Browser(h).authorize("first", claims="[1]")
        assert query_of(location(response))["error"] == "invalid_request"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_max_age_and_prompt_login_ask_for_password_and_code_again(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser, secret, _ = await enrolled(h)
        response, _ = await browser.authorize("first")
        assert "/mfa?" in location(response), "a user with a factor is asked for it by the live session too"
        response, _ = await give_code(browser, location(response), code_at(secret, h.now()))
        assert response.code == 303
        h.clock.advance(60)
        for params in ({"prompt": "login"}, {"max_age": "30"}):
            assert shows_login_form(*await browser.authorize("first", **params))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_id_token_hint_holds_through_the_second_factor(tmp_path, monkeypatch, audit):
    """
    OIDC Core section 3.1.2.1: the hinted user, signed in and asked for a
    code, gets the code; another user with a second factor who gives a
    password on the sign-in the hint asks for gets login_required at once,
    audited, never the second-factor page, and no code nor session.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        alice, alice_secret, _ = await enrolled(h)
        await enrolled(h, BOB)
        claims = {"iss": ISSUER, "sub": ALICE.sub, "aud": "first", "iat": h.now(), "exp": h.now() + 60}
        hint = h.keystore.sign(claims, "RS256", "JWT")
        response, _ = await alice.authorize("first", id_token_hint=hint)
        assert "/mfa?" in location(response)
        response, _ = await give_code(alice, location(response), code_at(alice_secret, h.now()))
        assert "code" in query_of(location(response))
        bob = Browser(h)
        response, _ = await password(bob, BOB, id_token_hint=hint)
        assert response.code == 303 and location(response).startswith(CLIENTS[0]["redirect_uris"][0] + "?")
        query = query_of(location(response))
        assert query["error"] == "login_required" and "code" not in query and query["state"] == "st4te"
        assert query["iss"] == ISSUER and bob.session_hash is None
        assert [(e["sub"], e["hinted_sub"], e["client_id"]) for e in audit.of("login.hint_mismatch")] == [
            (BOB.sub, ALICE.sub, "first")]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_wrong_codes_are_throttled_and_a_correct_password_does_not_clear_them(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        browser = Browser(h)
        response, _ = await password(browser, ALICE)
        page = location(response)
        for _ in range(5):
            response, body = await give_code(browser, page, "123456" if code_at(secret, h.now()) != "123456"
                                             else "654321")
            assert response.code == 200
        response, body = await give_code(browser, page, code_at(secret, h.now()))
        assert response.code == 429 and response.headers.getRawHeaders(b"retry-after")
        again = Browser(h)
        response, _ = await password(again, ALICE)
        response, body = await give_code(again, location(response), code_at(secret, h.now()))
        assert response.code == 429, "the password's success does not clear the code's failures"
        assert len(audit.of("mfa.failed")) == 7
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_wrong_passwords_for_a_login_named_after_the_code_count_never_hold_the_user_back(tmp_path, monkeypatch):
    """
    The user name mfa:<sub> was counted under the very account of that
    user's second-factor codes: ten wrong passwords for it, from anyone who
    knows the sub, kept the user from finishing any sign-in on a new browser.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        for _ in range(10):
            attacker = Browser(h)
            response, _ = await attacker.authorize("first")
            await attacker.submit_login(response, "MFA:" + ALICE.sub, "not-the-password")
            h.clock.advance(40)
        h.clock.advance(300)
        victim = Browser(h)
        response, _ = await password(victim, ALICE)
        response, body = await give_code(victim, location(response), code_at(secret, h.now()))
        assert response.code == 303, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_operator_reset_removes_the_factors_audited(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        await enrolled(h)
        assert await reset_factors(h.store, ALICE.sub, actor="operator") is True
        assert await h.store.list_factors(ALICE.sub) == []
        assert [e["actor"] for e in audit.of("mfa.reset")] == ["operator"]
        claims = await id_token_of(h, Browser(h))
        assert claims["acr"] == ACR_PWD, "the password alone signs in again"
    finally:
        await h.close()


def test_the_mfa_section_is_read_strictly():
    strict = parse_config({"mfa": {"required": "required", "enrol_grace": "2d", "recent_sign_in": "15m"}}, None)
    assert strict.mfa == MfaPolicy("required", 2 * DAY, 900)
    assert parse_config({}, None).mfa == MfaPolicy("optional", 7 * DAY, 600)
    for outside in ("30s", "2d"):
        with pytest.raises(ConfigError, match="mfa.recent_sign_in: must be between 1m and 1d"):
            parse_config({"mfa": {"recent_sign_in": outside}}, None)
    with pytest.raises(ConfigError, match="mfa.required"):
        parse_config({"mfa": {"required": "sometimes"}}, None)
    with pytest.raises(ConfigError, match="mfa.grace"):
        parse_config({"mfa": {"grace": "1d"}}, None)
    client = {"client_id": "c", "redirect_uris": ["https://c.example/cb"], "require_mfa": True}
    assert parse_config({"clients": [client]}, None).clients[0].require_mfa


def test_requested_acr_reads_acr_values_and_the_claims_request():
    assert requested_acr({"acr_values": f"{ACR_MFA} {ACR_PWD}"}) == (ACR_MFA, ACR_PWD)
    claims = json.dumps({"id_token": {"acr": {"essential": True, "value": ACR_MFA}}})
    assert requested_acr({"acr_values": ACR_MFA, "claims": claims}) == (ACR_MFA,)
    assert requested_acr({"claims": json.dumps({"userinfo": {"acr": None}})}) == ()
    for malformed in ("not json", "[]", '{"id_token": []}', '{"userinfo": {"name": true}}',
                      '{"id_token": {"acr": "' + ACR_MFA + '"}}'):
        with pytest.raises(InvalidRequest):
            requested_acr({"claims": malformed})
    assert mfa_requested((ACR_MFA, "urn:unknown"))
    assert not mfa_requested((ACR_PWD, ACR_MFA)), "a client that accepts a password does not ask for more"
    assert not mfa_requested(("urn:unknown",))


@pytest_twisted.ensureDeferred
async def test_codes_from_everywhere_are_held_to_ten_an_hour(tmp_path, monkeypatch):
    """
    With the password known, codes guessed from a new address each time met
    only the password limit (a hundred every fifteen minutes): weeks to a
    live code. Ten failures an hour hold every further guess.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        factors = SecondFactors(store=h.store, policy=MfaPolicy("optional", DAY), throttle=ThrottlePolicy(),
                                issuer_label="test")
        live = {code_at(secret, h.now() + drift) for drift in (-30, 0, 30)}
        wrong = next(code for code in ("000000", "111111", "222222", "333333") if code not in live)
        for n in range(10):
            assert isinstance(await factors.verify(ALICE.sub, wrong, f"203.0.113.{n}", None, h.now()), CodeRefused)
        held = await factors.verify(ALICE.sub, code_at(secret, h.now()), "203.0.113.99", None, h.now())
        assert isinstance(held, Throttled) and held.retry_after > 15 * 60
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_confirmed_enrolment_is_never_shown_or_confirmed_again(tmp_path, monkeypatch):
    """
    The enrolment page's sealed form outlives its confirmation: posted
    again, it showed the live secret and recovery codes once more, and
    confirmed again it brought back the recovery codes used since.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        first = Browser(h)
        await first.sign_in(ALICE)
        response, body = await first.get(TOTP_PAGE)
        secret, codes, fields = enrolment_of(body)
        response, body = await first.post(TOTP_PAGE, {**fields, "code": code_at(secret, h.now())})
        assert location(response) == ACCOUNT_DONE + "totp-set-up"
        h.clock.advance(30)
        strong = Browser(h)
        response, _ = await password(strong, ALICE)
        response, _ = await give_code(strong, location(response), codes[0])
        assert response.code == 303, "a recovery code signs in once"
        response, body = await strong.get(TOTP_PAGE)
        stale = {**hidden_fields(body.split(b"/recovery")[0]), "sealed": fields["sealed"]}
        response, body = await strong.post(TOTP_PAGE, {**stale, "code": "000000"})
        assert response.code == 200 and secret.encode() not in body
        assert not set(_CODES.findall(body.decode())) & set(codes), "the live recovery codes are not shown again"
        response, body = await strong.post(TOTP_PAGE, {**stale, "code": code_at(secret, h.now())})
        assert response.code == 200 and b"Authenticator set up" not in body
        other = Browser(h)
        response, _ = await password(other, ALICE)
        response, body = await give_code(other, location(response), codes[0])
        assert response.code == 200 and b"was used already" in body, "a used recovery code stays used"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_enrolment_begun_before_the_user_had_a_factor_neither_replaces_nor_skips_it(
        tmp_path, monkeypatch, audit):
    """
    Whoever has the password of a user without a factor reaches enrolment;
    once the user has set one up meanwhile, that waiting page neither puts
    it off nor replaces it: the factor the user now has is asked for.
    """
    h = await started(tmp_path, monkeypatch, required="required")
    try:
        waiting = []
        for _ in range(3):
            browser = Browser(h)
            response, _ = await password(browser, ALICE)
            response, body = await browser.get(location(response))
            waiting.append((browser, *enrolment_of(body)))
        (owner, secret, _, fields), *intruders = waiting
        response, _ = await owner.post(ISSUER + "/mfa/enrol", {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303 and "code" in query_of(location(response))
        stored = await h.store.get_totp(ALICE.sub)
        for (intruder, secret, _, fields), action in zip(intruders, ("later", "confirm")):
            response, body = await intruder.post(ISSUER + "/mfa/enrol",
                                                 {**fields, "action": action, "code": code_at(secret, h.now())})
            assert response.code == 303 and "/mfa?" in location(response), (action, body)
            assert "authsrv_session" not in intruder.cookies
            response, body = await intruder.get(location(response))
            assert response.code == 200 and b'name="code"' in body
        assert await h.store.get_totp(ALICE.sub) == stored and len(audit.of("mfa.enrolled")) == 1
        assert not audit.of("mfa.put_off")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_user_banned_between_password_and_code_gets_no_session(tmp_path, monkeypatch, audit):
    h = await started(tmp_path, monkeypatch)
    try:
        _, secret, _ = await enrolled(h)
        browser = Browser(h)
        response, _ = await password(browser, ALICE)
        await h.store.ban_user(Ban(sub=ALICE.sub, reason="abuse", created_at=h.now()))
        audit.clear()
        response, body = await give_code(browser, location(response), code_at(secret, h.now()))
        assert response.code == 403 and b"suspended" in body, body
        assert "authsrv_session" not in browser.cookies and not audit.of("login.succeeded")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_session_signed_out_while_it_steps_up_stays_signed_out(tmp_path, monkeypatch):
    """
    The step-up ended the session it had read and stored the raised one
    whether or not the first was still there: one signed out meanwhile (from
    the account page, a password change, an operator) came back to life.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE)
        secret, _ = await enrol_at_account_page(h, browser)
        h.clock.advance(30)
        signed_out = browser.session_hash
        response, _ = await browser.authorize("first", acr_values=ACR_MFA)
        page = location(response)
        use_totp_step = h.store.use_totp_step

        async def signed_out_meanwhile(sub, step):
            used = await use_totp_step(sub, step)
            await h.store.end_session(signed_out)
            return used

        monkeypatch.setattr(h.store, "use_totp_step", signed_out_meanwhile)
        response, body = await give_code(browser, page, code_at(secret, h.now()))
        assert response.code == 400 and b"no longer signed in" in body, body
        assert await h.store.list_user_sessions(ALICE.sub, h.now()) == []
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_authenticator_reset_after_its_enrolment_never_shows_the_old_key_again(tmp_path, monkeypatch):
    """
    A phone lost soon after its authenticator was set up: the operator
    resets the user's factors, and the user sets up a new one. The browser
    that showed the old key still kept it (sealed, for ENROLMENT_TTL), and
    the page showed it again, with its recovery codes: the lost phone's key
    enrolled once more. A confirmed enrolment is dropped from the browser.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser, secret, codes = await enrolled(h)
        assert not [name for name, value in browser.cookies.items() if "enrolment" in name and value]
        assert await reset_factors(h.store, ALICE.sub, actor="operator") is True
        response, body = await browser.get(TOTP_PAGE)
        assert response.code == 200 and enrolment_of(body)[0] != secret and not set(enrolment_of(body)[1]) & set(codes)
        sign_in = Browser(h)
        await sign_in.sign_in(ALICE)
        response, _ = await sign_in.authorize("first", acr_values=ACR_MFA)
        page = location(response)
        secret, _, fields = enrolment_of((await sign_in.get(page))[1])
        response, _ = await sign_in.post(ISSUER + "/mfa/enrol", {**fields, "code": code_at(secret, h.now())})
        assert response.code == 303 and "code" in query_of(location(response))
        assert not [name for name, value in sign_in.cookies.items() if "enrolment" in name and value]
    finally:
        await h.close()
