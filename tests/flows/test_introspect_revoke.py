"""
Introspection (RFC 7662) and revocation (RFC 7009) in memory: what an active
answer says for each kind of token, who may see it, what makes a token
inactive (revocation, expiry, rotation, a ban, JWTs included), and what
revoking an access or a refresh token takes with it.
"""

from __future__ import annotations

import pytest_twisted

from authsrv.records import AccessToken, Ban
from authsrv.testing.identity import ALICE, MALLORY
from authsrv.tokens import new_token, token_hash
from harness import CLIENTS, ISSUER, SECRETS, Harness
from token_helpers import (
    API, INTROSPECT, REVOKE, active, basic, header, introspect, post_form, refresh, save_code, tokens,
)

REPORTS = {
    "client_id": "reports-api",
    "secret_env": "AUTHSRV_TEST_REPORTS_SECRET",
    "redirect_uris": ["http://127.0.0.1:9004/callback"],
    "audiences": [API],
}


async def start(tmp_path, monkeypatch) -> Harness:
    monkeypatch.setenv("AUTHSRV_TEST_REPORTS_SECRET", "reports-secret")
    first = [{**c, "resources": [API, "reports-api"]} if c["client_id"] == "first" else c for c in CLIENTS]
    return await Harness(tmp_path, monkeypatch, {"clients": [*first, REPORTS]}).start()


async def as_reports_api(h, token: str) -> dict:
    response, body = await post_form(
        h, INTROSPECT, {"token": token, "client_id": "reports-api", "client_secret": "reports-secret"}, client_id=None
    )
    assert response.code == 200, body
    return body


@pytest_twisted.ensureDeferred
async def test_active_answers(tmp_path, monkeypatch):
    h = await start(tmp_path, monkeypatch)
    try:
        issued = await tokens(h, scope="openid profile offline_access")
        now = h.now()
        common = {
            "active": True, "scope": "offline_access openid profile", "client_id": "first", "sub": ALICE.sub,
            "iat": now, "iss": ISSUER,
        }
        response, body = await post_form(h, INTROSPECT, {"token": issued["access_token"]})
        assert response.code == 200
        assert header(response, "cache-control") == ["no-store"]
        assert body == {**common, "exp": now + 3600, "token_type": "Bearer"}
        assert await introspect(h, issued["refresh_token"], "first") == {
            **common, "exp": now + 30 * 86400, "token_type": "refresh_token",
        }
        # The hint only orders the lookups.
        assert (await introspect(h, issued["access_token"], "first", token_type_hint="refresh_token"))["active"]
        assert (await introspect(h, issued["refresh_token"], "first", token_type_hint="access_token"))["active"]
        assert (await introspect(h, issued["refresh_token"], "first", token_type_hint="bogus"))["active"]

        jwt_issued = await tokens(h, resource=(API,))
        answer = await introspect(h, jwt_issued["access_token"], "first")
        assert answer["aud"] == API and answer["token_type"] == "Bearer" and len(answer["jti"]) >= 16

        for token in ("unknown", issued["id_token"], "x" * 5000):
            assert await introspect(h, token) == {"active": False}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_who_sees_what(tmp_path, monkeypatch):
    h = await start(tmp_path, monkeypatch)
    try:
        issued = await tokens(h)
        for token in (issued["access_token"], issued["refresh_token"]):
            assert (await introspect(h, token, "first"))["active"]
            assert await introspect(h, token, "partner") == {"active": False}
            assert await as_reports_api(h, token) == {"active": False}
        assert (await introspect(h, issued["access_token"], "gateway"))["active"]
        assert await introspect(h, issued["refresh_token"], "gateway") == {"active": False}, (
            "introspect_any never shows another client's refresh token"
        )

        for_api = await tokens(h, resource=(API,))
        answer = await as_reports_api(h, for_api["access_token"])
        assert (answer["active"], answer["aud"]) == (True, API), "the resource server of the token's audience"
        assert await as_reports_api(h, for_api["refresh_token"]) == {"active": False}

        for_reports = await tokens(h, resource=("reports-api",))
        answer = await as_reports_api(h, for_reports["access_token"])
        assert (answer["active"], answer["aud"], answer["client_id"]) == (True, "reports-api", "first")
        assert await as_reports_api(h, for_reports["refresh_token"]) == {"active": False}
        assert await introspect(h, for_reports["access_token"], "partner") == {"active": False}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_introspection_needs_a_confidential_client(tmp_path, monkeypatch):
    h = await start(tmp_path, monkeypatch)
    try:
        token = (await tokens(h))["access_token"]
        for fields, headers in (
            ({}, {}),
            ({"client_id": "spa"}, {}),
            ({"client_id": "first"}, {}),
            ({"client_id": "first", "client_secret": "wrong"}, {}),
            ({}, basic("gateway", "wrong")),
            ({}, {"Authorization": f"Bearer {token}"}),
        ):
            response, body = await post_form(h, INTROSPECT, {"token": token, **fields}, client_id=None,
                                             headers=headers)
            assert (response.code, body["error"]) == (401, "invalid_client"), fields
            assert header(response, "www-authenticate")
        response, body = await post_form(h, INTROSPECT, {"token": token}, client_id="gateway", method="basic")
        assert body["active"] is True
        response, body = await post_form(h, INTROSPECT, {})
        assert (response.code, body["error"]) == (400, "invalid_request")
        response, body = await h.json("POST", INTROSPECT, json={"token": token})
        assert (response.code, body["error"]) == (400, "invalid_request")
        response, _ = await h.request("GET", INTROSPECT)
        assert response.code == 405
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_inactive_after_expiry_and_rotation(tmp_path, monkeypatch):
    h = await start(tmp_path, monkeypatch)
    try:
        issued = await tokens(h)
        response, rotated = await refresh(h, issued["refresh_token"])
        assert response.code == 200
        assert not await active(h, issued["refresh_token"])
        assert await active(h, issued["access_token"])
        h.clock.advance(3599)
        assert await active(h, rotated["access_token"])
        h.clock.advance(1)
        assert not await active(h, rotated["access_token"])
        assert await active(h, rotated["refresh_token"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_banned_or_disabled_users_tokens_are_inactive(tmp_path, monkeypatch):
    h = await start(tmp_path, monkeypatch)
    try:
        opaque = await tokens(h)
        jwt = await tokens(h, resource=(API,))
        everything = (opaque["access_token"], opaque["refresh_token"], jwt["access_token"], jwt["refresh_token"])
        await h.store.ban_user(Ban(ALICE.sub, "abuse", h.now(), until=h.now() + 100))
        for token in everything:
            assert await introspect(h, token) == {"active": False}
            assert await introspect(h, token, "first") == {"active": False}
        h.clock.advance(100)
        for token in everything:
            assert await active(h, token)

        # A user disabled in the identity backend after the token was issued.
        code, _ = await save_code(h, sub=MALLORY.sub)
        consumed = await h.store.find_code(token_hash(code), h.now())
        token = new_token()
        await h.store.issue_tokens(
            AccessToken(token_hash(token), consumed.code.grant_id, "first", MALLORY.sub, {"openid"},
                        issued_at=h.now(), expires_at=h.now() + 60),
            None,
        )
        assert await h.store.find_access_token(token_hash(token), h.now()) is not None
        assert await introspect(h, token) == {"active": False}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_revoking_an_access_token(tmp_path, monkeypatch):
    h = await start(tmp_path, monkeypatch)
    try:
        issued = await tokens(h)
        other = await tokens(h)
        response, body = await h.request("POST", REVOKE, data={
            "token": issued["access_token"], "token_type_hint": "access_token",
            "client_id": "first", "client_secret": SECRETS["first"],
        })
        assert (response.code, body) == (200, b"")
        assert header(response, "access-control-allow-origin") == ["*"]
        assert header(response, "content-type") is None, "an empty body is not an HTML page"
        assert not await active(h, issued["access_token"])
        assert await active(h, issued["refresh_token"])
        assert await active(h, other["access_token"])
        response, refreshed = await refresh(h, issued["refresh_token"])
        assert response.code == 200
        assert await active(h, refreshed["access_token"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_revoking_a_refresh_token_ends_its_grant(tmp_path, monkeypatch):
    h = await start(tmp_path, monkeypatch)
    try:
        issued = await tokens(h)
        response, rotated = await refresh(h, issued["refresh_token"])
        other = await tokens(h)
        response, body = await h.request("POST", REVOKE, data={"token": rotated["refresh_token"]},
                                         headers=basic("first", SECRETS["first"]))
        assert (response.code, body) == (200, b"")
        for token in (issued["access_token"], rotated["access_token"], rotated["refresh_token"]):
            assert not await active(h, token)
        response, body = await refresh(h, rotated["refresh_token"])
        assert (response.code, body["error"]) == (400, "invalid_grant")
        assert await active(h, other["access_token"]) and await active(h, other["refresh_token"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_revocation_answers_200_for_what_it_does_not_revoke(tmp_path, monkeypatch):
    h = await start(tmp_path, monkeypatch)
    try:
        firsts = await tokens(h)
        for token in ("unknown", firsts["access_token"], firsts["refresh_token"]):
            response, body = await post_form(h, REVOKE, {"token": token}, client_id="partner")
            assert response.code == 200
        assert await active(h, firsts["access_token"]) and await active(h, firsts["refresh_token"])

        spas = await tokens(h, client_id="spa")
        response, _ = await post_form(h, REVOKE, {"token": spas["refresh_token"]}, client_id="spa")
        assert response.code == 200
        assert not await active(h, spas["access_token"])

        response, body = await post_form(h, REVOKE, {})
        assert (response.code, body["error"]) == (400, "invalid_request")
        response, body = await post_form(h, REVOKE, {"token": firsts["access_token"]}, client_id=None)
        assert (response.code, body["error"]) == (401, "invalid_client")
        response, body = await post_form(h, REVOKE, {"token": firsts["access_token"], "client_id": "first",
                                                     "client_secret": "wrong"}, client_id=None)
        assert (response.code, body["error"]) == (401, "invalid_client")
        assert await active(h, firsts["access_token"])
        response, _ = await h.request("OPTIONS", REVOKE)
        assert response.code == 204
        response, _ = await h.request("GET", REVOKE)
        assert response.code == 405
    finally:
        await h.close()


FORM = {"Content-Type": "application/x-www-form-urlencoded"}
UNUSABLE_TOKENS = [b"a" * 9000, b"a%00b", b"%FF%FE", b"eyJ%00.e30.x"]
"""Tokens no server ever issued: too long for any parameter, holding NUL, not UTF-8."""


@pytest_twisted.ensureDeferred
async def test_an_unusable_token_is_inactive_and_revoked(tmp_path, monkeypatch):
    """
    The contract: an invalid token gives active false, not an error status
    (RFC 7662 section 2.2); RFC 7009 section 2.2: revocation answers 200.
    Without client authentication, both still answer 401.
    """
    h = await start(tmp_path, monkeypatch)
    try:
        credentials = b"&client_id=first&client_secret=" + SECRETS["first"].encode()
        for token in UNUSABLE_TOKENS:
            response, body = await h.request("POST", INTROSPECT, data=b"token=" + token + credentials, headers=FORM)
            assert (response.code, body) == (200, b'{"active":false}'), token[:16]
            response, body = await h.request("POST", REVOKE, data=b"token=" + token + credentials, headers=FORM)
            assert (response.code, body) == (200, b""), token[:16]
            response, body = await h.json("POST", INTROSPECT, data=b"token=" + token, headers=FORM)
            assert (response.code, body["error"]) == (401, "invalid_client")
        response, body = await h.json("POST", INTROSPECT, data=b"token=a&token=%00" + credentials, headers=FORM)
        assert (response.code, body["error"]) == (400, "invalid_request")
        response, body = await h.json("POST", INTROSPECT, data=b"token=a&state=%00" + credentials, headers=FORM)
        assert (response.code, body["error"]) == (400, "invalid_request")
    finally:
        await h.close()
