"""
UserInfo in memory: the bearer token from the header or a POST form (never
both, never the URL: a Bearer challenge says so), the claims each scope releases, and the RFC 6750
answers for a token that is missing, unknown, expired, revoked, of a banned
user, or without openid.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest_twisted

from authsrv.records import Ban
from authsrv.testing.identity import ALICE, BOB, ZOE
from harness import CLIENTS, ISSUER, Harness
from token_helpers import API, REVOKE, USERINFO, header, post_form, refresh, tokens, verify_jwt

ALICE_CLAIMS = {
    "sub": ALICE.sub, "name": ALICE.name, "picture": ALICE.picture, "email": ALICE.email,
    "email_verified": True, "chat_user_id": ALICE.chat_user_id,
}


def bearer(token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


def assert_challenge(response, body, status: int, error: str) -> None:
    assert (response.code, body["error"]) == (status, error), body
    challenge = header(response, "www-authenticate")[0]
    assert challenge.startswith("Bearer ") and f'error="{error}"' in challenge
    assert header(response, "cache-control") == ["no-store"]
    assert header(response, "access-control-allow-origin") == ["*"]


@pytest_twisted.ensureDeferred
async def test_userinfo_by_get_and_post(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        token = (await tokens(h))["access_token"]
        response, body = await h.json("GET", USERINFO, headers=bearer(token))
        assert response.code == 200
        assert body == ALICE_CLAIMS
        assert header(response, "cache-control") == ["no-store"]
        assert header(response, "content-type") == ["application/json"]
        assert header(response, "access-control-allow-origin") == ["*"]

        response, body = await h.json("POST", USERINFO, headers=bearer(token))
        assert (response.code, body) == (200, ALICE_CLAIMS)
        response, body = await h.json("POST", USERINFO, data={"access_token": token})
        assert (response.code, body) == (200, ALICE_CLAIMS)
        response, body = await h.json("GET", USERINFO, headers={"Authorization": f"bearer   {token}"})
        assert (response.code, body) == (200, ALICE_CLAIMS)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_claims_follow_the_scopes(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        cases = [
            (ALICE.sub, "openid", {"sub": ALICE.sub, "chat_user_id": ALICE.chat_user_id}),
            (ALICE.sub, "openid profile", {
                "sub": ALICE.sub, "name": ALICE.name, "picture": ALICE.picture, "chat_user_id": ALICE.chat_user_id,
            }),
            (ZOE.sub, "openid profile email", {
                "sub": ZOE.sub, "name": ZOE.name, "email": ZOE.email, "email_verified": False,
            }),
            (BOB.sub, "openid profile email", {"sub": BOB.sub}),
        ]
        for sub, scope, expected in cases:
            token = (await tokens(h, sub=sub, scope=scope))["access_token"]
            response, body = await h.json("GET", USERINFO, headers=bearer(token))
            assert (response.code, body) == (200, expected), scope
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_claims_follow_the_user_not_the_grant(tmp_path, monkeypatch):
    """
    A name, an email address or a chat account changed after the sign-in
    shows in the grant's next UserInfo answer and refreshed ID token: the
    claims are read at each request, never copied into the grant.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        issued = await tokens(h)
        users = tmp_path / "users.toml"
        edited = tmp_path / "users.toml.new"
        edited.write_text(users.read_text().replace(ALICE.email, "alice@example.net")
                          .replace(ALICE.name, "Alice Pleasance").replace(ALICE.chat_user_id, "80351110224678913"))
        edited.replace(users)
        await h.users_reread()
        changed = {"name": "Alice Pleasance", "email": "alice@example.net", "chat_user_id": "80351110224678913"}

        response, body = await h.json("GET", USERINFO, headers=bearer(issued["access_token"]))
        assert (response.code, body) == (200, {**ALICE_CLAIMS, **changed})
        response, refreshed = await refresh(h, issued["refresh_token"])
        assert response.code == 200, refreshed
        _, claims = verify_jwt(h, refreshed["id_token"], aud="first")
        assert {name: claims[name] for name in changed} == changed
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_jwt_access_token_works_only_when_meant_for_userinfo(tmp_path, monkeypatch):
    """A JWT for another resource server never reads the profile; one whose audience names the issuer does."""
    clients = [{**c, "resources": [API, ISSUER]} if c["client_id"] == "first" else c for c in CLIENTS]
    h = await Harness(tmp_path, monkeypatch, {"clients": clients}).start()
    try:
        token = (await tokens(h, resource=(API,)))["access_token"]
        response, body = await h.json("GET", USERINFO, headers=bearer(token))
        assert_challenge(response, body, 401, "invalid_token")
        token = (await tokens(h, resource=(API, ISSUER)))["access_token"]
        response, body = await h.json("GET", USERINFO, headers=bearer(token))
        assert (response.code, body) == (200, ALICE_CLAIMS)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_token_problems(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        issued = await tokens(h)
        token = issued["access_token"]
        response, body = await h.json("GET", USERINFO)
        assert_challenge(response, body, 401, "invalid_token")
        for authorization in ("Bearer nope", "Basic Zmlyc3Q6eA==", "Bearer", "Bearer a b", "Bearer ü"):
            response, body = await h.json("GET", USERINFO, headers={"Authorization": authorization})
            assert_challenge(response, body, 401, "invalid_token")
        response, body = await h.json("GET", USERINFO, headers=bearer(issued["refresh_token"]))
        assert_challenge(response, body, 401, "invalid_token")
        response, body = await h.json("GET", USERINFO, headers=bearer(issued["id_token"]))
        assert_challenge(response, body, 401, "invalid_token")

        # RFC 6750 section 3: a request without a usable credential is answered with a challenge, 400 here (3.1).
        response, body = await h.json("POST", USERINFO, headers=bearer(token), data={"access_token": token})
        assert_challenge(response, body, 400, "invalid_request")
        response, body = await h.json("GET", USERINFO + "?access_token=" + token)
        assert_challenge(response, body, 400, "invalid_request")
        response, body = await h.json("POST", USERINFO, data=[("access_token", token), ("access_token", token)])
        assert_challenge(response, body, 400, "invalid_request")
        for unusable in (b"a" * 9000, b"a%00b", b"%FF"):
            response, body = await h.json("POST", USERINFO, data=b"access_token=" + unusable,
                                          headers={"Content-Type": "application/x-www-form-urlencoded"})
            assert_challenge(response, body, 401, "invalid_token")

        response, body = await h.json("GET", USERINFO, headers=bearer(token))
        assert response.code == 200

        h.clock.advance(3600)
        response, body = await h.json("GET", USERINFO, headers=bearer(token))
        assert_challenge(response, body, 401, "invalid_token")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_revoked_token_and_banned_user(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        revoked = (await tokens(h))["access_token"]
        response, _ = await post_form(h, REVOKE, {"token": revoked})
        assert response.code == 200
        response, body = await h.json("GET", USERINFO, headers=bearer(revoked))
        assert_challenge(response, body, 401, "invalid_token")

        token = (await tokens(h))["access_token"]
        await h.store.ban_user(Ban(ALICE.sub, "abuse", h.now()))
        response, body = await h.json("GET", USERINFO, headers=bearer(token))
        assert_challenge(response, body, 401, "invalid_token")
        await h.store.unban_user(ALICE.sub)
        response, body = await h.json("GET", USERINFO, headers=bearer(token))
        assert (response.code, body) == (200, ALICE_CLAIMS)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_token_without_openid_is_insufficient(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        token = (await tokens(h, scope="profile email"))["access_token"]
        response, body = await h.json("GET", USERINFO, headers=bearer(token))
        assert_challenge(response, body, 403, "insufficient_scope")
        # RFC 6750 section 3: the challenge names the scope the resource needs, as node-oidc-provider's does.
        assert header(response, "www-authenticate")[0].endswith(', scope="openid"')
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_cors_preflight_and_methods(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        response, body = await h.request(
            "OPTIONS", USERINFO,
            headers={"Origin": "https://spa.example", "Access-Control-Request-Method": "GET",
                     "Access-Control-Request-Headers": "authorization"},
        )
        assert (response.code, body) == (204, b"")
        assert header(response, "access-control-allow-origin") == ["*"]
        assert header(response, "access-control-allow-methods") == ["GET, POST, OPTIONS"]
        assert "Authorization" in header(response, "access-control-allow-headers")[0]
        response, _ = await h.request("DELETE", USERINFO)
        assert response.code == 405
    finally:
        await h.close()


CHALLENGE_TEXT = re.compile(r'Bearer realm="authsrv", error="invalid_request", error_description="[\x20\x21\x23-\x5b\x5d-\x7e]*"')
"""RFC 6750 section 3: error_description holds only these characters, none outside ASCII."""


@pytest_twisted.ensureDeferred
async def test_a_bearer_challenge_holds_only_what_rfc_6750_allows(tmp_path, monkeypatch):
    """
    A form whose repeated field is named with text outside RFC 6750's
    characters (a backslash, a quote, non-ASCII, a very long name): the
    JSON body names it as sent, the challenge's error_description stays
    within the grammar and short enough for any proxy.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        name = "na\\me\"\u00e9" + "x" * 3000
        form = urlencode([(name, "1"), (name, "2"), ("access_token", "t")]).encode()
        response, body = await h.json("POST", USERINFO, data=form,
                                      headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert_challenge(response, body, 400, "invalid_request")
        assert name in body["error_description"]
        challenge = response.headers.getRawHeaders(b"www-authenticate")[0].decode("latin-1")
        assert CHALLENGE_TEXT.fullmatch(challenge), challenge[:200]
        assert len(challenge) < 1024
    finally:
        await h.close()
