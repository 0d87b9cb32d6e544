"""
The internal user-access endpoint, row by row of the contract's Errors
table, and the ban and grant states it reports.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted

from authsrv.records import AccessToken, Ban, Grant, RefreshToken
from authsrv.testing.identity import ALICE, BOB, MALLORY
from authsrv.tokens import new_token, token_hash

from harness import INTERNAL_SECRET, Harness

PATH = "/api/internal/user-access"
AUTH = {"Authorization": f"Bearer {INTERNAL_SECRET}", "Content-Type": "application/json"}


@pytest.fixture
def harness(tmp_path, monkeypatch):
    return Harness(tmp_path, monkeypatch)


async def call(h, body, headers=AUTH, method="POST", path=PATH):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response, raw = await h.request(method, path, data=data, headers=headers)
    return response, json.loads(raw) if raw else None


async def give_grant(h, sub, *, refresh=True, access=True, expires_in=3600):
    now = h.now()
    grant = Grant(grant_id=new_token(16), client_id="first", sub=sub, scope={"openid"},
                  created_at=now, expires_at=now + 86400)
    code_hash = token_hash(new_token())
    from authsrv.records import AuthorizationCode

    await h.store.save_code(AuthorizationCode(code_hash=code_hash, grant_id=grant.grant_id, client_id="first",
                                              sub=sub, redirect_uri="http://127.0.0.1:9000/callback",
                                              scope={"openid"}, issued_at=now, expires_at=now + 60), grant)
    access_token = AccessToken(token_hash=token_hash(new_token()), grant_id=grant.grant_id, client_id="first",
                               sub=sub, scope={"openid"}, issued_at=now, expires_at=now + expires_in)
    refresh_token = RefreshToken(token_hash=token_hash(new_token()), grant_id=grant.grant_id, client_id="first",
                                 sub=sub, scope={"openid"}, issued_at=now, expires_at=now + 86400)
    await h.store.redeem_code(code_hash, access_token, refresh_token if refresh else None, now)
    return grant


@pytest_twisted.ensureDeferred
async def test_user_access_states(harness):
    h = await harness.start()
    try:
        response, body = await call(h, {"userId": ALICE.sub})
        assert response.code == 200
        assert body == {"allowed": False, "banned": False, "banReason": None, "hasActiveGrant": False}
        assert response.headers.getRawHeaders("set-cookie") is None
        assert response.headers.getRawHeaders("cache-control") == ["no-store"]

        grant = await give_grant(h, ALICE.sub)
        _, body = await call(h, {"authUserId": ALICE.sub})
        assert body == {"allowed": True, "banned": False, "banReason": None, "hasActiveGrant": True}

        await h.store.ban_user(Ban(sub=ALICE.sub, reason="spam", created_at=h.now()))
        _, body = await call(h, {"userId": ALICE.sub})
        assert body == {"allowed": False, "banned": True, "banReason": "spam", "hasActiveGrant": True}
        await h.store.unban_user(ALICE.sub)

        await h.store.revoke_grant(grant.grant_id, h.now())
        _, body = await call(h, {"userId": ALICE.sub})
        assert body == {"allowed": False, "banned": False, "banReason": None, "hasActiveGrant": False}

        _, body = await call(h, {"userId": MALLORY.sub})
        assert body["banned"] is True and body["banReason"] == MALLORY.disabled_reason
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_has_active_grant_ends_with_the_last_token(harness):
    h = await harness.start()
    try:
        await give_grant(h, BOB.sub, refresh=False, expires_in=60)
        _, body = await call(h, {"userId": BOB.sub})
        assert body["hasActiveGrant"] is True and body["allowed"] is True
        h.clock.advance(60)
        _, body = await call(h, {"userId": BOB.sub})
        assert body["hasActiveGrant"] is False and body["allowed"] is False
    finally:
        await h.close()


@pytest.mark.parametrize(
    "body, headers, status, error",
    [
        ({"userId": "nobody"}, AUTH, 404, "user_not_found"),
        (b'{"userId": "\\ud800"}', AUTH, 404, "user_not_found"),
        ({"userId": "nul\x00"}, AUTH, 404, "user_not_found"),
        ({}, AUTH, 400, "invalid_request"),
        ({"userId": ""}, AUTH, 400, "invalid_request"),
        ({"userId": 42}, AUTH, 400, "invalid_request"),
        ({"userId": None}, AUTH, 400, "invalid_request"),
        ({"userId": ALICE.sub, "authUserId": BOB.sub}, AUTH, 400, "invalid_request"),
        ([ALICE.sub], AUTH, 400, "invalid_request"),
        (b"{not json", AUTH, 400, "invalid_request"),
        (b"\xff\xfe", AUTH, 400, "invalid_request"),
        (b"[" * 30_000 + b"]" * 30_000, AUTH, 400, "invalid_request"),
        ({"userId": ALICE.sub}, {**AUTH, "Authorization": f"Bearer {INTERNAL_SECRET}x"}, 401, "unauthorized"),
        ({"userId": ALICE.sub}, {**AUTH, "Authorization": f"Bearer {INTERNAL_SECRET[:-1]}"}, 401, "unauthorized"),
        ({"userId": ALICE.sub}, {"Content-Type": "application/json"}, 401, "unauthorized"),
        ({"userId": ALICE.sub}, {**AUTH, "Authorization": "Bearer wrong"}, 401, "unauthorized"),
        ({"userId": ALICE.sub}, {**AUTH, "Authorization": f"Basic {INTERNAL_SECRET}"}, 401, "unauthorized"),
        ({}, {"Content-Type": "application/json"}, 401, "unauthorized"),
        ({"userId": ALICE.sub}, {**AUTH, "Content-Type": "text/plain"}, 400, "invalid_request"),
        ({"userId": ALICE.sub}, {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}, 400,
         "invalid_request"),
        (f"userId={ALICE.sub}".encode(), {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}, 400,
         "invalid_request"),
        ({"userId": ALICE.sub}, {"Authorization": AUTH["Authorization"]}, 400, "invalid_request"),
    ],
)
@pytest_twisted.ensureDeferred
async def test_errors_table(harness, body, headers, status, error):
    h = await harness.start()
    try:
        response, answer = await call(h, body, headers)
        assert response.code == status
        assert answer["error"] == error and answer["message"]
        if status == 404:
            assert answer["allowed"] is False
        if status == 401:
            assert response.headers.getRawHeaders("www-authenticate") == ['Bearer realm="authsrv-internal"']
    finally:
        await h.close()


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "OPTIONS"])
@pytest_twisted.ensureDeferred
async def test_other_methods_and_no_cors(harness, method):
    h = await harness.start()
    try:
        response, answer = await call(h, {"userId": ALICE.sub}, {**AUTH, "Origin": "https://evil.example",
                                                                 "Access-Control-Request-Method": "POST"},
                                      method=method)
        assert response.code == 405
        assert answer["error"] == "method_not_allowed"
        assert response.headers.getRawHeaders("access-control-allow-origin") is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_unknown_internal_path(harness):
    h = await harness.start()
    try:
        response, answer = await call(h, {"userId": ALICE.sub}, path="/api/internal/nope")
        assert (response.code, answer["error"]) == (404, "not_found")
    finally:
        await h.close()


CHAT = "/api/internal/chat-token"


async def link_alice(h, expires_in: int):
    from authsrv.chat.crypto import ACCESS, REFRESH
    from authsrv.records import LinkedAccount

    grant = h.chat_fake.grant()
    account = LinkedAccount(
        account_id="acct-alice", sub=ALICE.sub, provider="discord", provider_user_id=h.chat_fake.user.id,
        access_token_enc=h.chat_cipher.encrypt(grant["access_token"], "acct-alice", ACCESS),
        refresh_token_enc=h.chat_cipher.encrypt(grant["refresh_token"], "acct-alice", REFRESH),
        scope=grant["scope"], expires_at=h.now() + expires_in, updated_at=h.now(),
    )
    await h.store.link_account(account)
    return grant


@pytest.mark.parametrize("path", [
    CHAT + "/", CHAT + "%2F", CHAT + "//", "/api/internal//chat-token", "/api/internal/chat-token/x",
    PATH + "/", PATH + "%2F", "/api/internal//user-access", "/api/internal/chat%2Dtoken", "/api/internal/user%2Daccess",
])
@pytest_twisted.ensureDeferred
async def test_a_near_miss_of_an_internal_path_is_not_found(harness, path):
    """
    The contract's paths are exact (SERVICE-INTERFACE.md): chat-token with
    a trailing slash was served as chat-token itself, handing out the
    provider token at a path no first-party service is told of, and so was
    chat%2Dtoken (while user%2Daccess was not). Every near miss is a 404
    in the internal API's shape.
    """
    h = await harness.start()
    try:
        await link_alice(h, expires_in=3600)
        response, answer = await call(h, {"userId": ALICE.sub}, path=path)
        assert response.code == 404 and answer == {"error": "not_found", "message": "no such internal endpoint"}
        response, answer = await call(h, {"userId": ALICE.sub}, path=CHAT)
        assert response.code == 200 and answer["accountId"] == "acct-alice"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_chat_token_fields_and_freshness(harness):
    h = await harness.start()
    try:
        grant = await link_alice(h, expires_in=3600)
        response, body = await call(h, {"userId": ALICE.sub}, path=CHAT)
        assert response.code == 200
        assert set(body) == {"accountId", "accessToken", "scope", "accessTokenExpiresAt"}
        assert body["accountId"] == "acct-alice" and body["accessToken"] == grant["access_token"]
        assert set(body["scope"].split()) == {"identify", "guilds.join"}
        from datetime import datetime, timezone

        assert body["accessTokenExpiresAt"].endswith("Z")
        expires = datetime.strptime(body["accessTokenExpiresAt"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        assert int(expires.timestamp()) == h.now() + 3600
        assert h.chat_fake.refreshes == 0
        assert response.headers.getRawHeaders("set-cookie") is None

        h.clock.advance(3600 - 60)
        response, body = await call(h, {"authUserId": ALICE.sub}, path=CHAT)
        assert response.code == 200 and h.chat_fake.refreshes == 1
        assert body["accessToken"] != grant["access_token"] and h.chat_fake.access_valid(body["accessToken"])
    finally:
        await h.close()


@pytest.mark.parametrize(
    "switch, status, error",
    [("unavailable", 503, "chat_provider_unavailable"), ("refuse_refresh", 502, "chat_refresh_refused")],
)
@pytest_twisted.ensureDeferred
async def test_chat_token_provider_failures(harness, switch, status, error):
    h = await harness.start()
    try:
        await link_alice(h, expires_in=30)
        before = await h.store.get_linked_account(ALICE.sub, "discord")
        setattr(h.chat_fake, switch, True)
        response, body = await call(h, {"userId": ALICE.sub}, path=CHAT)
        assert (response.code, body["error"]) == (status, error) and body["message"]
        assert await h.store.get_linked_account(ALICE.sub, "discord") == before
    finally:
        await h.close()


@pytest.mark.parametrize("user", [BOB.sub, "nobody"])
@pytest_twisted.ensureDeferred
async def test_chat_token_not_linked(harness, user):
    h = await harness.start()
    try:
        response, body = await call(h, {"userId": user}, path=CHAT)
        assert (response.code, body["error"]) == (404, "chat_not_linked")
        response, body = await call(h, {}, path=CHAT)
        assert (response.code, body["error"]) == (400, "invalid_request")
        response, body = await call(h, {"userId": user}, {"Content-Type": "application/json"}, path=CHAT)
        assert (response.code, body["error"]) == (401, "unauthorized")
    finally:
        await h.close()


@pytest.mark.parametrize("path", [PATH, CHAT])
@pytest.mark.parametrize("body", [
    f'{{"userId": "{ALICE.sub}", "userId": "nobody"}}',
    f'{{"userId": "nobody", "user\\u0049d": "{ALICE.sub}"}}',
    f'{{"authUserId": "{ALICE.sub}", "authUserId": "{BOB.sub}"}}',
])
@pytest_twisted.ensureDeferred
async def test_repeated_member_is_refused(harness, path, body):
    """
    A body naming userId twice is refused, never answered for the last one
    (which a proxy in front, reading the first, did not check).
    """
    h = await harness.start()
    try:
        await link_alice(h, expires_in=3600)
        response, answer = await call(h, body.encode(), path=path)
        assert (response.code, answer["error"]) == (400, "invalid_request")
        assert "appears twice in one object" in answer["message"]
    finally:
        await h.close()


@pytest.mark.parametrize("body, named", [
    ({"userId": ALICE.sub, "authUserId": ""}, "authUserId"),
    ({"authUserId": 7}, "authUserId"),
    ({"userId": None, "authUserId": ALICE.sub}, "userId"),
])
@pytest_twisted.ensureDeferred
async def test_a_bad_id_is_named_as_sent(harness, body, named):
    """The message names the member that is wrong, so the caller knows which to fix."""
    h = await harness.start()
    try:
        response, answer = await call(h, body)
        assert (response.code, answer["error"]) == (400, "invalid_request")
        assert answer["message"] == f"{named} must be a non-empty string"
    finally:
        await h.close()
