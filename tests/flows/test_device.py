"""
The device authorization grant (RFC 8628) end to end over the harness: a
device asks for codes, polls the token endpoint (time from the Clock), a
person signs in at the verification page and approves or denies; and the
attacks: guessing user codes, replaying a device code, another client's
device code, polling on after a denial, forged approval forms.
"""

from __future__ import annotations

import sqlite3

import attrs
import pytest_twisted
from twisted.internet.defer import Deferred, fail, gatherResults
from zope.interface import Interface

from authsrv.flows.clients import TTL as CLIENT_CACHE_TTL
from authsrv.flows.csrf import session_form_token
from authsrv.flows.device import THROTTLE_ACCOUNT
from authsrv.flows.login import OTHER_COUNTS, throttle_account
from authsrv.flows.mfa import THROTTLE_PREFIX as MFA_THROTTLE_PREFIX
from authsrv.identity.errors import BackendUnavailable
from authsrv.interfaces import IStore
from authsrv.records import Ban
from authsrv.store.errors import StoreUnavailable
from authsrv.testing.identity import ALICE, BOB, PASSWORDS
from authsrv.tokens import token_hash
from device_helpers import (
    CONSOLE,
    DEVICE_AUTHORIZATION,
    DEVICE_GRANT,
    TV,
    USER_CODE,
    approve,
    error_of,
    harness,
    poll,
    start,
)
from flow_client import Browser, hidden_fields, location
from harness import CLIENTS, ENVIRON, ISSUER, SPOOF, Harness
from token_helpers import TOKEN, SignedAfterSending, introspect, post_form, refresh, verify_jwt

@pytest_twisted.ensureDeferred
async def test_discovery_lists_the_grant_only_when_a_client_uses_it(tmp_path, monkeypatch):
    for name in ("plain", "device"):
        (tmp_path / name).mkdir()
    plain = await Harness(tmp_path / "plain", monkeypatch).start()
    try:
        _, document = await plain.json("GET", "/api/auth/.well-known/openid-configuration")
        assert "device_authorization_endpoint" not in document
        assert DEVICE_GRANT not in document["grant_types_supported"]
        response, body = await post_form(plain, DEVICE_AUTHORIZATION, {"scope": "openid"}, "first")
        assert response.code == 404
        response, body = await poll(plain, "whatever", "first")
        assert body["error"] == "unsupported_grant_type"
        response, _ = await plain.get("/api/auth/device")
        assert response.code == 404
    finally:
        await plain.close()
    h = await harness(tmp_path / "device", monkeypatch).start()
    try:
        for path in ("/api/auth/.well-known/openid-configuration", "/api/auth/.well-known/oauth-authorization-server"):
            _, document = await h.json("GET", path)
            assert document["device_authorization_endpoint"] == ISSUER + "/oauth2/device-authorization"
            assert DEVICE_GRANT in document["grant_types_supported"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_device_codes_as_rfc_8628_words_them(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        assert set(codes) == {"device_code", "user_code", "verification_uri", "verification_uri_complete",
                              "expires_in", "interval"}
        assert USER_CODE.match(codes["user_code"])
        assert codes["verification_uri"] == ISSUER + "/device"
        assert codes["verification_uri_complete"] == f"{ISSUER}/device?user_code={codes['user_code']}"
        assert (codes["expires_in"], codes["interval"]) == (600, 5)
        assert len(codes["device_code"]) >= 43
        assert len({(await start(h))["user_code"] for _ in range(5)}) == 5
        with sqlite3.connect(tmp_path / "authsrv.sqlite3") as db:
            rows = db.execute("SELECT * FROM device_authorizations").fetchall()
        text = repr(rows)
        assert codes["device_code"] not in text and codes["user_code"].replace("-", "") not in text
        assert token_hash(codes["device_code"]) in text
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_scope_values_the_server_does_not_offer_are_ignored(tmp_path, monkeypatch):
    """As at the authorization endpoint (OIDC Core 3.1.2.1): the device is asked for the offered values alone."""
    h = await harness(tmp_path, monkeypatch).start()
    try:
        response, body = await h.json("POST", DEVICE_AUTHORIZATION,
                                      data={"client_id": "tv", "scope": "openid address admin"})
        assert response.code == 200, body
        with sqlite3.connect(tmp_path / "authsrv.sqlite3") as db:
            (scope,), = db.execute("SELECT scope FROM device_authorizations").fetchall()
        assert scope == "openid"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_device_authorization_refusals(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        response, body = await post_form(h, DEVICE_AUTHORIZATION, {"scope": "openid"}, "first")
        assert (response.code, body["error"]) == (400, "unauthorized_client")
        response, body = await h.json("POST", DEVICE_AUTHORIZATION, data={"client_id": "tv", "scope": "admin phone"})
        assert (response.code, body["error"]) == (400, "invalid_scope")
        response, body = await h.json("POST", DEVICE_AUTHORIZATION,
                                      data={"client_id": "console", "client_secret": "wrong", "scope": "openid"})
        assert (response.code, body["error"]) == (401, "invalid_client")
        response, body = await h.json("POST", DEVICE_AUTHORIZATION,
                                      data={"client_id": "tv", "resource": "https://elsewhere.example"})
        assert (response.code, body["error"]) == (400, "invalid_target")
        response, body = await h.json("POST", DEVICE_AUTHORIZATION, data=[
            ("client_id", "tv"), ("resource", "https://api.example"), ("resource", "https://files.example")])
        assert (response.code, body["error"]) == (400, "invalid_target") and "one resource" in body["error_description"]
        response, body = await h.json("POST", DEVICE_AUTHORIZATION, data=[("client_id", "tv"), ("scope", "openid"),
                                                                          ("scope", "openid")])
        assert (response.code, body["error"]) == (400, "invalid_request") and "repeated" in body["error_description"]
        response, body = await post_form(h, TOKEN, {"grant_type": DEVICE_GRANT, "device_code": "x"}, "first")
        assert (response.code, body["error"]) == (400, "unauthorized_client")
        response, body = await post_form(h, TOKEN, {"grant_type": DEVICE_GRANT}, None, headers={})
        assert response.code in (400, 401)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_polling_pending_slow_down_then_tokens_once(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        device_code = codes["device_code"]
        assert error_of(await poll(h, device_code)) == "authorization_pending"
        h.clock.advance(2)
        response, body = await poll(h, device_code)
        assert body["error"] == "slow_down" and "10 seconds" in body["error_description"]
        h.clock.advance(9)
        assert error_of(await poll(h, device_code)) == "slow_down"
        h.clock.advance(15)
        assert error_of(await poll(h, device_code)) == "authorization_pending"

        browser = Browser(h)
        page = await approve(h, browser, codes)
        assert b"Device connected" in page and b"Living-Room TV" in page
        h.clock.advance(15)
        sent = SignedAfterSending(monkeypatch, h.store, h.keystore, ("redeem_device_authorization",))
        response, body = await poll(h, device_code)
        assert response.code == 200, body
        assert sent.since_last() == ["redeem_device_authorization", "sign"], "signed while the store writes the tokens"
        assert body["token_type"] == "Bearer" and set(body["scope"].split()) == {"openid", "profile", "offline_access"}
        _, claims = verify_jwt(h, body["id_token"], aud="tv", sub=ALICE.sub)
        assert claims["name"] == ALICE.name and "nonce" not in claims
        assert (await introspect(h, body["access_token"]))["active"]
        response, rotated = await refresh(h, body["refresh_token"], client_id="tv")
        assert response.code == 200, rotated

        replay = await poll(h, device_code)
        assert error_of(replay) == "invalid_grant" and "already used" in replay[1]["error_description"]
        assert not (await introspect(h, rotated["access_token"]))["active"]
        assert error_of(await refresh(h, rotated["refresh_token"], client_id="tv")) == "invalid_grant"
    finally:
        await h.close()


async def _tokens_at_the_next_poll_once(h, device_code: str) -> None:
    """Five seconds on, the device's poll gets live tokens, and a poll after it "already used"."""
    h.clock.advance(5)
    response, body = await poll(h, device_code)
    assert response.code == 200, body
    assert (await introspect(h, body["access_token"]))["active"]
    assert error_of(await poll(h, device_code)) == "invalid_grant"


@pytest_twisted.ensureDeferred
async def test_a_poll_that_could_not_be_answered_leaves_the_device_code_usable(tmp_path, monkeypatch):
    """
    An approved device's poll that fails before its tokens are issued (the
    directory down, a resource the user did not grant) uses nothing up: the
    next poll gets the tokens, not "already used" with the grant revoked.
    """
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        await approve(h, Browser(h), codes)
        h.clock.advance(15)
        with monkeypatch.context() as outage:
            outage.setattr(h.identity, "user_by_id", lambda sub: fail(BackendUnavailable("directory down")))
            response, body = await poll(h, codes["device_code"])
        assert (response.code, body["error"]) == (503, "temporarily_unavailable"), body
        h.clock.advance(5)
        response, body = await post_form(h, TOKEN, {"grant_type": DEVICE_GRANT, "device_code": codes["device_code"],
                                                    "client_id": "tv", "resource": "https://elsewhere.example"}, None)
        assert (response.code, body["error"]) == (400, "invalid_target"), body
        await _tokens_at_the_next_poll_once(h, codes["device_code"])
    finally:
        await h.close()


def _store_down_after(monkeypatch, store, call: str) -> None:
    """Every store call fails as a store outage from the moment C{call} answers (inside C{monkeypatch}'s context)."""
    answered = getattr(store, call)

    def then_down(*args, **kwargs):
        def down(result):
            for name in _store_methods():
                monkeypatch.setattr(store, name, lambda *args, **kwargs: fail(StoreUnavailable("connection refused")))
            return result

        return answered(*args, **kwargs).addCallback(down)

    monkeypatch.setattr(store, call, then_down)


def _store_methods() -> set[str]:
    return {name for interface in IStore.__iro__ if interface is not Interface for name in interface.names()}


@pytest_twisted.ensureDeferred
async def test_a_store_outage_after_the_poll_leaves_the_device_code_usable(tmp_path, monkeypatch):
    """
    The store going down once an approved device's poll is read fails that
    poll (503) and uses nothing up: redeeming the code and writing its
    tokens are one store step, so the next poll gets the tokens rather than
    "already used" with the grant revoked.
    """
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        await approve(h, Browser(h), codes)
        h.clock.advance(15)
        with monkeypatch.context() as outage:
            _store_down_after(outage, h.store, "poll_device_authorization")
            response, body = await poll(h, codes["device_code"])
        assert (response.code, body["error"]) == (503, "temporarily_unavailable"), body
        await _tokens_at_the_next_poll_once(h, codes["device_code"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_no_refresh_token_without_offline_access_or_the_refresh_grant(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        for client_id, scope in (("tv", "openid"), ("console", "openid offline_access")):
            codes = await start(h, client_id, scope)
            await approve(h, Browser(h), codes)
            response, body = await poll(h, codes["device_code"], client_id)
            assert response.code == 200, body
            assert "refresh_token" not in body and "id_token" in body
            assert body["scope"] == "openid"  # no offline access granted without a refresh token (RFC 6749 5.1)
        codes = await start(h, "tv", "offline_access")
        await approve(h, Browser(h), codes)
        response, body = await poll(h, codes["device_code"])
        assert response.code == 200 and "id_token" not in body and "refresh_token" in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_denied_device_keeps_getting_access_denied(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        page = await approve(h, Browser(h), codes, action="deny")
        assert b"Device not connected" in page
        for _ in range(3):
            assert error_of(await poll(h, codes["device_code"])) == "access_denied"
            h.clock.advance(30)
        h.clock.advance(600)
        assert error_of(await poll(h, codes["device_code"])) == "expired_token"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_expired_codes_cannot_be_approved_or_polled_and_are_purged(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch, code_ttl="2m", interval="3s").start()
    try:
        codes = await start(h)
        assert (codes["expires_in"], codes["interval"]) == (120, 3)
        browser = Browser(h)
        response, _ = await browser.get(codes["verification_uri_complete"])
        response, _ = await browser.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        response, body = await browser.get(location(response))
        fields = hidden_fields(body)
        h.clock.advance(120)
        response, body = await browser.post(ISSUER + "/device", {**fields, "action": "approve"})
        assert response.code == 200 and b"not right, or it was used already or expired" in body
        assert error_of(await poll(h, codes["device_code"])) == "expired_token"
        await h.store.gc(h.now(), 100)
        assert error_of(await poll(h, codes["device_code"])) == "invalid_grant"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_another_clients_device_code_is_refused_and_left_alone(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h, "console", "openid")
        await approve(h, Browser(h), codes)
        response, body = await poll(h, codes["device_code"], "tv")
        assert body["error"] == "invalid_grant" and "another client" in body["error_description"]
        response, body = await poll(h, codes["device_code"], "console")
        assert response.code == 200, body
        verify_jwt(h, body["id_token"], aud="console")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_signed_in_user_sees_client_and_scopes_and_the_code(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        browser = Browser(h)
        await browser.sign_in(BOB, "first", scope="openid")
        codes = await start(h, scope="openid profile email")
        typed = codes["user_code"].replace("-", "").lower()
        response, body = await browser.get(f"{ISSUER}/device?user_code={typed}")
        assert response.code == 200, body
        text = body.decode()
        assert "Living-Room TV" in text and codes["user_code"] in text and f"Signed in as {BOB.login}" in text
        assert "Your name and picture" in text and "Your email address" in text
        assert b"frame-ancestors 'none'" in response.headers.getRawHeaders(b"content-security-policy")[0]
        assert response.headers.getRawHeaders(b"x-frame-options") == [b"DENY"]
        response, body = await browser.post(ISSUER + "/device", {**hidden_fields(body), "action": "approve"})
        assert response.code == 200
        response, tokens = await poll(h, codes["device_code"])
        verify_jwt(h, tokens["id_token"], aud="tv", sub=BOB.sub)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_code_form_without_a_code_and_with_a_malformed_one(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        response, body = await h.get("/api/auth/device")
        assert response.code == 200 and b'name="user_code"' in body and b'method="get"' in body
        response, body = await h.get("/api/auth/device?user_code=<script>")
        assert response.code == 200 and b"eight letters" in body and body.count(b"<script>") == 1
        response, body = await h.get("/api/auth/device?user_code=a&user_code=b")
        assert response.code == 400
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_forged_approval_forms_are_refused(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        victim, attacker = Browser(h), Browser(h)
        await attacker.sign_in(BOB, "first", scope="openid")
        response, _ = await victim.get(codes["verification_uri_complete"])
        response, _ = await victim.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        response, body = await victim.get(location(response))
        fields = hidden_fields(body)
        for browser, changes in ((victim, {"csrf": "0" * 64}), (victim, {"csrf": None}),
                                 (attacker, {}), (victim, {"action": "steal"})):
            form = {**fields, "action": "approve", **changes}
            response, _ = await browser.post(ISSUER + "/device", {k: v for k, v in form.items() if v is not None})
            assert response.code in (400, 403)
        response, _ = await Browser(h).post(ISSUER + "/device", {**fields, "action": "approve"})
        assert response.code == 400
        assert error_of(await poll(h, codes["device_code"])) == "authorization_pending"
        response, _ = await victim.post(ISSUER + "/device", {**fields, "action": "approve"})
        assert response.code == 200
        response, second = await victim.post(ISSUER + "/device", {**fields, "action": "deny"})
        assert response.code == 200 and b"not right, or it was used already" in second
        response, body = await poll(h, codes["device_code"])
        assert response.code == 200, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_user_code_guessing_is_throttled_per_address(tmp_path, monkeypatch):
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        guesser = Browser(h)
        for n in range(5):
            response, body = await guesser.get(f"{ISSUER}/device?user_code=BBBB-BBB{'BCDFG'[n]}")
            assert response.code == 200 and b"not right" in body
        response, body = await guesser.get(codes["verification_uri_complete"])
        assert response.code == 429 and b"Too many attempts; try again in 1 second" in body
        assert response.headers.getRawHeaders(b"retry-after") == [b"1"]
        h.clock.advance(1)
        response, _ = await guesser.get(f"{ISSUER}/device?user_code=BBBB-BBBH")
        response, body = await guesser.get(codes["verification_uri_complete"])
        assert response.code == 429 and b"2 seconds" in body
        h.clock.advance(2)
        response, _ = await guesser.get(codes["verification_uri_complete"])
        assert response.code == 303 and "/login?" in location(response)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_user_code_guessing_is_throttled_over_the_whole_code_space(tmp_path, monkeypatch):
    h = Harness(tmp_path, monkeypatch, {
        "clients": [*CLIENTS, TV], "server": {"trusted_proxies": ["127.0.0.1", "10.0.0.0/8"]},
        "device": {"user_code_failures": 3},
    })
    await h.start()
    try:
        codes = await start(h)
        for n in range(3):
            response, body = await h.get(f"/api/auth/device?user_code=BBBBBBB{'BCD'[n]}",
                                         headers={"X-Forwarded-For": f"198.51.100.{n}, 10.0.0.2"})
            assert response.code == 200 and b"not right" in body
        response, body = await h.get(f"/api/auth/device?user_code={codes['user_code']}",
                                     headers={"X-Forwarded-For": "203.0.113.9, 10.0.0.2"})
        assert response.code == 429 and b"Too many attempts" in body and b"sign in first" in body
        # A signed-in browser's codes count under its user: the guesses from everywhere do not hold it back.
        user = Browser(h)
        await user.sign_in(ALICE, "first")
        response, _ = await user.request("GET", f"{ISSUER}/device?user_code={codes['user_code']}",
                                         headers={"X-Forwarded-For": "203.0.113.10, 10.0.0.2"})
        assert response.code == 200, "the approval form"
        h.clock.advance(15 * 60)
        codes = await start(h)
        response, _ = await h.get(f"/api/auth/device?user_code={codes['user_code']}",
                                  headers={"X-Forwarded-For": "203.0.113.9, 10.0.0.2"})
        assert response.code == 303
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_failed_logins_named_after_a_users_code_count_never_hold_that_user_back(tmp_path, monkeypatch):
    """
    The throttle's accounts are shared with logins, which anyone types: the
    user name device:user-codes:<sub> once filled that user's own count of
    codes, so wrong passwords given for it kept a signed-in user from
    connecting a device (and device:user-codes the whole code space).
    """
    h = await harness(tmp_path, monkeypatch, user_code_failures=3).start()
    try:
        codes = await start(h)
        for name in (f"{THROTTLE_ACCOUNT}:{ALICE.sub}", THROTTLE_ACCOUNT.upper()):
            for _ in range(3):
                attacker = Browser(h)
                response, _ = await attacker.authorize("first")
                response, body = await attacker.submit_login(response, name, "not-the-password")
                assert response.code == 200 and b"password" in body, body
        user = Browser(h)
        await user.sign_in(ALICE, "first")
        response, body = await user.get(codes["verification_uri_complete"])
        assert response.code == 200 and b"Allow" in body, body
        response, body = await Browser(h).get(codes["verification_uri_complete"])
        assert response.code == 303, "nor does the whole code space fill up for browsers not signed in"
    finally:
        await h.close()


def test_the_throttles_other_counts_are_kept_apart_from_logins():
    assert THROTTLE_ACCOUNT.startswith(OTHER_COUNTS) and MFA_THROTTLE_PREFIX.startswith(OTHER_COUNTS)
    for login in (THROTTLE_ACCOUNT, f"{THROTTLE_ACCOUNT}:{ALICE.sub}", f"{MFA_THROTTLE_PREFIX}{ALICE.sub}",
                  f" MFA:{ALICE.sub.upper()}".strip(), "Device:User-Codes"):
        assert not throttle_account(login).startswith(OTHER_COUNTS), login
    assert throttle_account("Alice") == "alice", "every other login is counted as before"


@pytest_twisted.ensureDeferred
async def test_config_turns_the_grant_on_and_checks_its_settings(tmp_path, monkeypatch):
    from authsrv.config import ConfigErrors, parse_config

    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    plain = parse_config({"clients": CLIENTS}, tmp_path / "a.toml")
    assert not plain.device.enabled
    assert parse_config({"clients": CLIENTS, "device": {"enabled": True}}, tmp_path / "a.toml").device.enabled
    for device, key in (({"enabled": False}, "device.enabled"), ({"code_ttl": "2h"}, "device.code_ttl"),
                        ({"interval": 0}, "device.interval"), ({"user_code_failures": 0}, "device.user_code_failures"),
                        ({"colour": "red"}, "device.colour")):
        try:
            parse_config({"clients": [*CLIENTS, TV], "device": device}, tmp_path / "a.toml")
        except ConfigErrors as e:
            assert key in str(e)
        else:
            raise AssertionError(f"{device} was accepted")


@pytest_twisted.ensureDeferred
async def test_the_sign_in_asks_for_the_second_factor_and_steps_up_a_password_session(tmp_path, monkeypatch):
    from test_mfa import code_at, enrolled, give_code

    h = await Harness(tmp_path, monkeypatch, {"clients": [*CLIENTS, {**TV, "require_mfa": True}]}).start()
    try:
        password_browser, secret, _ = await enrolled(h)
        codes = await start(h)
        fresh = Browser(h)
        response, _ = await fresh.get(codes["verification_uri_complete"])
        response, _ = await fresh.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert response.code == 303 and "/mfa?" in location(response)
        response, _ = await give_code(fresh, location(response), code_at(secret, h.now()))
        assert response.code == 303 and location(response) == codes["verification_uri_complete"]
        response, body = await fresh.get(location(response))
        response, _ = await fresh.post(ISSUER + "/device", {**hidden_fields(body), "action": "approve"})
        assert response.code == 200
        response, tokens = await poll(h, codes["device_code"])
        _, claims = verify_jwt(h, tokens["id_token"], aud="tv")
        assert claims["acr"] == "urn:authsrv:acr:mfa" and "otp" in claims["amr"]

        h.clock.advance(30)
        codes = await start(h)
        csrf = session_form_token(password_browser.cookies["authsrv_session"],
                                  b"device " + token_hash(codes["user_code"].replace("-", "")).encode())
        response, _ = await password_browser.post(ISSUER + "/device", {"user_code": codes["user_code"],
                                                                      "csrf": csrf, "action": "approve"})
        assert response.code == 303 and "/mfa?" in location(response), "no approval without the second factor"
        assert error_of(await poll(h, codes["device_code"])) == "authorization_pending"
        response, _ = await password_browser.get(codes["verification_uri_complete"])
        assert response.code == 303 and "/mfa?" in location(response), "the password session is stepped up"
        response, _ = await give_code(password_browser, location(response), code_at(secret, h.now()))
        assert location(response) == codes["verification_uri_complete"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_old_session_gives_the_password_before_enrolling_at_the_verification_page(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, {"clients": [*CLIENTS, {**TV, "require_mfa": True}]}).start()
    try:
        browser = Browser(h)
        await browser.sign_in(BOB)
        h.clock.advance(601)
        codes = await start(h)
        response, _ = await browser.get(codes["verification_uri_complete"])
        assert response.code == 303 and "/login?" in location(response), "a session cookie alone enrols nothing"
        response, _ = await browser.submit_login(response, BOB.login, PASSWORDS[BOB.sub])
        assert response.code == 303 and "/mfa/enrol?" in location(response)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_removed_between_approval_and_poll_gets_nothing(tmp_path, monkeypatch):
    """
    The client is removed (its grants with it) after the person approved
    and while this instance still caches it: the device's poll issues no
    token and leaves nothing behind, and a poll after the cache ends is
    invalid_client.
    """
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        assert error_of(await poll(h, codes["device_code"])) == "authorization_pending"
        await approve(h, Browser(h), codes)
        assert await h.store.remove_client("tv") is True
        response, body = await poll(h, codes["device_code"])
        assert (response.code, body["error"]) == (400, "invalid_grant"), body
        h.clock.advance(600)
        response, body = await poll(h, codes["device_code"])
        assert (response.code, body["error"]) == (401, "invalid_client"), body
        with sqlite3.connect(tmp_path / "authsrv.sqlite3") as db:
            assert db.execute("SELECT count(*) FROM access_tokens").fetchone() == (0,)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_code_of_a_client_no_longer_allowed_the_grant_is_not_shown_for_approval(tmp_path, monkeypatch):
    """
    The device grant taken off the client after its device got a code: the
    person is not asked to approve (and told the device is connected) a
    device whose polls can only be unauthorized_client now.
    """
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        before = await h.store.get_client("tv")
        assert await h.store.change_client(before, attrs.evolve(before, grant_types=("refresh_token",))) is True
        h.clock.advance(CLIENT_CACHE_TTL + 1)
        browser = Browser(h)
        await browser.sign_in(ALICE)
        response, body = await browser.get(codes["verification_uri_complete"])
        assert response.code == 200 and b"That code is not right" in body, body
        assert b'value="approve"' not in body
        assert error_of(await poll(h, codes["device_code"])) == "unauthorized_client"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_user_banned_between_approval_and_poll_gets_nothing_even_once_unbanned(tmp_path, monkeypatch):
    """
    The person who approved is banned before the device polls: no token, the
    grant is revoked, and lifting the ban does not make the approval good
    again; the device starts over.
    """
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        await approve(h, Browser(h), codes)
        await h.store.ban_user(Ban(ALICE.sub, "abuse", h.now()))
        h.clock.advance(5)
        response, body = await poll(h, codes["device_code"])
        assert (response.code, body["error"]) == (400, "invalid_grant"), body
        assert "no longer use" in body["error_description"]
        await h.store.unban_user(ALICE.sub)
        h.clock.advance(5)
        response, body = await poll(h, codes["device_code"])
        assert (response.code, body["error"]) == (400, "invalid_grant"), body
        with sqlite3.connect(tmp_path / "authsrv.sqlite3") as db:
            assert db.execute("SELECT count(*) FROM access_tokens").fetchone() == (0,)
            assert db.execute("SELECT count(*) FROM grants WHERE revoked_at IS NULL").fetchone() == (0,)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_parallel_polls_of_an_approved_device_issue_once(tmp_path, monkeypatch):
    """
    Two polls of one approved device at once: the store redeems the code
    once; the other is a reuse, which revokes the grant, as for a code.
    """
    h = await harness(tmp_path, monkeypatch).start()
    try:
        codes = await start(h)
        await approve(h, Browser(h), codes)
        h.clock.advance(5)
        answers = await gatherResults([Deferred.fromCoroutine(poll(h, codes["device_code"])) for _ in range(2)])
        assert sorted(response.code for response, _ in answers) == [200, 400], answers
        issued = next(body for response, body in answers if response.code == 200)
        refused = next(body for response, body in answers if response.code == 400)
        assert refused["error"] == "invalid_grant" and "already used" in refused["error_description"]
        assert not (await introspect(h, issued["access_token"]))["active"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_refused_verification_page_names_no_parameter_of_the_request(tmp_path, monkeypatch):
    """Whoever makes the link chooses its parameters' names: the error page shows none of them."""
    h = await harness(tmp_path, monkeypatch).start()
    try:
        response, body = await h.get(f"/api/auth/device?{SPOOF}=1&{SPOOF}=2")
        assert response.code == 400 and b"repeated" in body and b"locked" not in body, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_address_keeps_only_so_many_device_authorizations_of_public_clients_waiting(tmp_path, monkeypatch):
    """
    Each waits in the store for its code's life: at the token endpoint's
    rate one address kept tens of thousands, whichever public clients it
    named. Public clients' count per address at [limits] pending_per_address
    per code_ttl; a confidential client counts against its own rate only.
    """
    radio = {**TV, "client_id": "radio", "redirect_uris": ["http://127.0.0.1:9011/unused"]}
    h = await Harness(tmp_path, monkeypatch, {"clients": [*CLIENTS, TV, radio, CONSOLE],
                                              "limits": {"pending_per_address": 3}}).start()
    try:
        codes = []
        for client_id in ("tv", "radio", "tv", "radio", "tv"):
            response, body = await h.json("POST", DEVICE_AUTHORIZATION, data={"client_id": client_id})
            codes.append(response.code)
        assert codes == [200, 200, 200, 429, 429], codes
        assert body["error"] == "too_many_requests"
        assert response.headers.getRawHeaders(b"retry-after") == [b"200"]
        for _ in range(3):
            await start(h, "console")
        h.clock.advance(200)
        await start(h, "radio")
        response, _ = await h.json("POST", DEVICE_AUTHORIZATION, data={"client_id": "tv"})
        assert response.code == 429
    finally:
        await h.close()
