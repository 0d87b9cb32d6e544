"""
Every audit event of a request names that request's client address, the
forwarded one behind a trusted proxy (docs/audit.md, the C{address} field):
consent, device authorization, pushed requests, the account page, second
factors, passkeys and chat links.
"""

from __future__ import annotations

import pytest
import pytest_twisted

from authsrv.records import Ban
from authsrv.testing.identity import ALICE, BOB, PASSWORDS
from device_helpers import CONSOLE, TV, approve, start
from flow_client import Browser, location
from harness import BASE, CLIENTS, ISSUER, Harness
from soft_passkey import SoftPasskey
from test_account_page import ACCOUNT, answered, forms, signed_in
from test_client_secret_jwt import HMAC_CLIENT, KEY_TEXT, KEYED, SECRET, signed
from test_end_session import END_SESSION, FIRST_LOGOUT_URI, browser_session, id_token
from test_link import LINK, LinkWorld, csrf_of, session_header
from test_mfa import (
    TOTP_PAGE,
    code_at,
    enrol_at_account_page,
    enrolment_of,
    give_code,
    new_recovery_codes,
    password,
    recovery_csrf,
)
from test_passkey_answers import add_passkey
from test_pushed_requests import OFFERED, by_reference, push, request_fields
from token_helpers import REVOKE, TOKEN, client_auth, refresh, tokens

PROXY = {"server": {"trusted_proxies": ["127.0.0.1"]}}
CLIENT = "203.0.113.7"
FORWARDED = {"X-Forwarded-For": CLIENT}


@pytest.fixture
def forwarded(monkeypatch):
    """
    Every test browser and harness request behind the trusted proxy: each
    carries C{CLIENT} in X-Forwarded-For unless it names another address.
    """
    for kind in (Browser, Harness):
        monkeypatch.setattr(kind, "request", _forwarding(kind.request))


def _forwarding(plain):
    async def request(self, method: str, url: str, **kwargs):
        return await plain(self, method, url, **{**kwargs, "headers": {**FORWARDED, **(kwargs.get("headers") or {})}})
    return request


async def started(tmp_path, monkeypatch, config: dict) -> Harness:
    return await Harness(tmp_path, monkeypatch, {**config, **PROXY}).start()


def addresses(audit, kind: str) -> list:
    return [event.get("address") for event in audit.of(kind)]


@pytest_twisted.ensureDeferred
async def test_consent_given_and_denied_name_the_browsers_address(tmp_path, monkeypatch, audit, forwarded):
    h = await started(tmp_path, monkeypatch, {})
    try:
        for user, action, kind in ((ALICE, "approve", "consent.given"), (BOB, "deny", "consent.denied")):
            assert await Browser(h).sign_in(user, "partner", consent=action)
            assert addresses(audit, kind) == [CLIENT], kind
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_device_events_name_the_devices_and_the_browsers_address(tmp_path, monkeypatch, audit, forwarded):
    h = await started(tmp_path, monkeypatch, {"clients": [*CLIENTS, TV, CONSOLE]})
    try:
        response, codes = await h.json("POST", "/api/auth/oauth2/device-authorization", headers={
            "X-Forwarded-For": "198.51.100.20"}, data={"client_id": "tv", "scope": "openid"})
        assert response.code == 200, codes
        assert addresses(audit, "device.requested") == ["198.51.100.20"]
        await approve(h, Browser(h), codes)
        assert addresses(audit, "device.approved") == [CLIENT], "the browser's, not the device's"
        await approve(h, Browser(h), await start(h), action="deny")
        assert addresses(audit, "device.denied") == [CLIENT]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_pushed_and_refused_request_uris_name_their_callers_address(tmp_path, monkeypatch, audit, forwarded):
    h = await started(tmp_path, monkeypatch, OFFERED)
    try:
        fields, _ = request_fields("first")
        auth_fields, auth_headers = client_auth("first", "post")
        response, body = await h.json("POST", "/api/auth/oauth2/par", data={**fields, **auth_fields},
                                      headers={**auth_headers, "X-Forwarded-For": "198.51.100.30"})
        assert response.code == 201, body
        assert addresses(audit, "request.pushed") == ["198.51.100.30"]
        request_uri, _ = await push(h)
        browser = Browser(h)
        assert (await browser.get(by_reference("first", request_uri)))[0].code == 303
        response, _ = await browser.get(by_reference("first", request_uri))
        assert response.code == 400, "used up"
        assert addresses(audit, "request_uri.refused") == [CLIENT]
    finally:
        await h.close()



@pytest_twisted.ensureDeferred
async def test_account_page_events_name_the_browsers_address(tmp_path, monkeypatch, audit, forwarded):
    h = await started(tmp_path, monkeypatch, {})
    try:
        phone, _ = await signed_in(h)
        laptop, _ = await signed_in(h, client_id="partner")
        response, body = await laptop.get(ACCOUNT)
        [other] = forms(body, ACCOUNT + "/sessions/end")
        await answered(laptop, (await laptop.post(ACCOUNT + "/sessions/end", other))[0], "session-ended")
        [revoke] = [form for form in forms(body, ACCOUNT + "/apps/revoke") if form["client_id"] == "partner"]
        await answered(laptop, (await laptop.post(ACCOUNT + "/apps/revoke", revoke))[0], "app-revoked")
        [change] = forms(body, ACCOUNT + "/password")
        new = "a brand new and long passphrase"
        fields = {**change, "current_password": PASSWORDS[ALICE.sub], "new_password": new}
        response, _ = await laptop.post(ACCOUNT + "/password", {**fields, "new_password_again": "typo"})
        assert response.code == 400
        await answered(laptop, (await laptop.post(ACCOUNT + "/password", {**fields, "new_password_again": new}))[0],
                       "password-changed")
        for kind in ("account.session_ended", "account.app_revoked", "account.password_change_refused",
                     "account.password_changed", "session.ended"):
            assert addresses(audit, kind) == [CLIENT], kind
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_second_factor_and_passkey_events_name_the_browsers_address(tmp_path, monkeypatch, audit, forwarded):
    h = await started(tmp_path, monkeypatch, {"mfa": {"required": "required", "enrol_grace": "7d"}})
    try:
        browser = Browser(h)
        response, _ = await password(browser, ALICE)
        response, body = await browser.get(location(response))
        response, _ = await browser.post(ISSUER + "/mfa/enrol", {**enrolment_of(body)[2], "action": "later"})
        assert response.code == 303
        assert addresses(audit, "mfa.put_off") == [CLIENT]
        secret, _ = await enrol_at_account_page(h, browser)
        assert addresses(audit, "mfa.enrolled") == [CLIENT]
        h.clock.advance(30)
        browser = Browser(h)
        response, _ = await password(browser, ALICE)
        await give_code(browser, location(response), code_at(secret, h.now()))
        response, body = await browser.get(TOTP_PAGE)
        assert (await new_recovery_codes(browser, recovery_csrf(body)))[0].code == 200
        assert addresses(audit, "mfa.recovery_codes_replaced") == [CLIENT]
        await add_passkey(browser, SoftPasskey("127.0.0.1", BASE, ALICE.sub.encode()).create)
        assert addresses(audit, "passkey.registered") == [CLIENT]
        response, body = await browser.get(ACCOUNT)
        [remove] = forms(body, ACCOUNT + "/passkeys/remove")
        await answered(browser, (await browser.post(ACCOUNT + "/passkeys/remove", remove))[0], "passkey-removed")
        assert addresses(audit, "passkey.removed") == [CLIENT]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_chat_link_events_name_the_browsers_address(tmp_path, monkeypatch, audit, forwarded):
    world = LinkWorld(await started(tmp_path, monkeypatch, {}))
    try:
        alice = await world.sign_in()
        response, body = await world.callback(await world.approve(await world.start(alice)), alice)
        assert response.code == 200
        bob = await world.sign_in(BOB.sub)
        response, _ = await world.callback(await world.approve(await world.start(bob)), bob)
        assert response.code == 409
        response, _ = await world.h.post(LINK + "/unlink", {"csrf": csrf_of(body)}, headers=session_header(alice))
        assert response.code == 303
        for kind in ("chat.linked", "chat.link_refused", "chat.unlinked"):
            assert addresses(audit, kind) == [CLIENT], kind
    finally:
        await world.h.close()


@pytest_twisted.ensureDeferred
async def test_replayed_assertions_and_ended_grants_name_the_callers_address(tmp_path, monkeypatch, audit,
                                                                             forwarded):
    """At the token and revocation endpoints, where the route has the address already."""
    monkeypatch.setenv("AUTHSRV_TEST_HMAC_SECRET", SECRET)
    monkeypatch.setenv("AUTHSRV_TEST_CLIENT_SECRETS_KEY", KEY_TEXT)
    h = await started(tmp_path, monkeypatch, {"clients": [*CLIENTS, HMAC_CLIENT], **KEYED})
    try:
        for endpoint, fields in ((TOKEN, {"grant_type": "client_credentials"}), (REVOKE, {"token": "x"})):
            once = signed(h, **fields)
            assert (await h.post(endpoint, data=once))[0].code == 200
            assert (await h.post(endpoint, data=once))[0].code == 401
        assert addresses(audit, "assertion.replayed") == [CLIENT, CLIENT]

        issued = await tokens(h)
        await h.store.ban_user(Ban(sub=ALICE.sub, reason="abuse", created_at=h.now()))
        response, _ = await refresh(h, issued["refresh_token"])
        assert response.code == 400
        assert addresses(audit, "grant.revoked") == [CLIENT]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_sessions_ended_by_a_request_name_its_address_and_by_a_ban_none(tmp_path, monkeypatch, audit,
                                                                             forwarded):
    """Logging out, and signing in as another user, end a session at the browser's request; a ban does not."""
    h = await started(tmp_path, monkeypatch, {})
    try:
        cookie = await browser_session(h)
        response, _ = await h.get(END_SESSION, params={
            "id_token_hint": id_token(h), "post_logout_redirect_uri": FIRST_LOGOUT_URI}, cookies={"authsrv_session": cookie})
        assert response.code == 302
        browser = Browser(h)
        await browser.sign_in(ALICE)
        await browser.sign_in(BOB, prompt="login")
        assert addresses(audit, "session.ended") == [CLIENT, CLIENT]
        await h.store.ban_user(Ban(sub=BOB.sub, reason="abuse", created_at=h.now()))
        await browser.authorize("first", prompt="none")
        assert addresses(audit, "session.ended") == [CLIENT, CLIENT, None]
    finally:
        await h.close()
