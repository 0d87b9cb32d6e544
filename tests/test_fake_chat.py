"""
The fake chat provider that the chat tests and the example app rely on: its
endpoints behave like a strict OAuth 2 provider, and each failure switch
does what it says, in memory and on a real port.
"""

from __future__ import annotations

import base64
import json

import pytest
import pytest_twisted
import treq
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.task import Clock
from twisted.web.client import Agent, HTTPConnectionPool, ResponseNeverReceived

from harness import pkce_pair, query_of

from authsrv.testing.fake_chat import AUTHORIZE_PATH, TOKEN_PATH, USER_PATH, FakeChatProvider, FakeChatUser

BASE = "http://chat.test"
REDIRECT = "https://auth.example.test/api/auth/link/chat/callback"


@pytest.fixture
def fake():
    return FakeChatProvider(Clock(), expires_in=3600)


def client_form(fake, **fields):
    return {"client_id": fake.client_id, "client_secret": fake.client_secret, **fields}


async def answer(d):
    response = await d
    body = await response.content()
    return response.code, json.loads(body) if body else None, response


async def authorize(fake, http, challenge=None, state="the-state", **extra):
    params = {"response_type": "code", "client_id": fake.client_id, "redirect_uri": REDIRECT,
              "scope": "identify guilds.join", "state": state, **extra}
    if challenge is not None:
        params.update(code_challenge=challenge, code_challenge_method="S256")
    response = await http.get(BASE + AUTHORIZE_PATH, params=params, allow_redirects=False)
    assert response.code == 302
    return response.headers.getRawHeaders(b"location")[0].decode()


@pytest_twisted.ensureDeferred
async def test_code_flow_with_pkce(fake):
    http = fake.memory_client()
    verifier, challenge = pkce_pair()
    location = await authorize(fake, http, challenge)
    assert location.startswith(REDIRECT + "?")
    query = query_of(location)
    assert query["state"] == "the-state"

    wrong = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="authorization_code", code=query["code"], redirect_uri=REDIRECT,
        code_verifier=pkce_pair()[0])))
    assert wrong[:2] == (400, {"error": "invalid_grant", "error_description": "PKCE verification failed"})

    location = await authorize(fake, http, challenge)
    code = query_of(location)["code"]
    status, tokens, _ = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="authorization_code", code=code, redirect_uri=REDIRECT, code_verifier=verifier)))
    assert status == 200
    assert set(tokens) == {"access_token", "token_type", "expires_in", "scope", "refresh_token"}
    assert (tokens["token_type"], tokens["expires_in"], tokens["scope"]) == ("Bearer", 3600, "identify guilds.join")
    assert fake.exchanges == 1

    again = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="authorization_code", code=code, redirect_uri=REDIRECT, code_verifier=verifier)))
    assert again[0] == 400 and again[1]["error"] == "invalid_grant"

    bearer = {"authorization": "Bearer " + tokens["access_token"]}
    status, user, _ = await answer(http.get(BASE + USER_PATH, headers=bearer))
    assert (status, user) == (200, {"id": "80351110224678912", "username": "alice"})


@pytest_twisted.ensureDeferred
async def test_authorize_refusals_and_deny(fake):
    http = fake.memory_client()
    response = await http.get(BASE + AUTHORIZE_PATH, params={"client_id": "other", "redirect_uri": REDIRECT})
    assert response.code == 400
    fake.deny = True
    query = query_of(await authorize(fake, http))
    assert (query["error"], query["state"]) == ("access_denied", "the-state")
    assert "code" not in query
    fake.deny = False
    query = query_of(await authorize(fake, http, code_challenge="x" * 43, code_challenge_method="plain"))
    assert query["error"] == "invalid_request"


@pytest_twisted.ensureDeferred
async def test_code_needs_verifier_when_challenged_and_matching_redirect(fake):
    http = fake.memory_client()
    _, challenge = pkce_pair()
    code = query_of(await authorize(fake, http, challenge))["code"]
    status, body, _ = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="authorization_code", code=code, redirect_uri=REDIRECT)))
    assert (status, body["error"]) == (400, "invalid_grant")
    code = query_of(await authorize(fake, http))["code"]
    status, body, _ = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="authorization_code", code=code, redirect_uri=REDIRECT + "x")))
    assert (status, body["error"]) == (400, "invalid_grant")


@pytest_twisted.ensureDeferred
async def test_client_authentication(fake):
    http = fake.memory_client()
    refresh = fake.grant()["refresh_token"]
    bad = await answer(http.post(BASE + TOKEN_PATH, data={
        "client_id": fake.client_id, "client_secret": "nope", "grant_type": "refresh_token", "refresh_token": refresh}))
    assert bad[:2] == (401, {"error": "invalid_client"})
    basic = base64.b64encode(f"{fake.client_id}:{fake.client_secret}".encode()).decode()
    good = await answer(http.post(BASE + TOKEN_PATH, headers={"authorization": "Basic " + basic},
                                  data={"grant_type": "refresh_token", "refresh_token": refresh}))
    assert good[0] == 200
    unsupported = await answer(http.post(BASE + TOKEN_PATH, data=client_form(fake, grant_type="password")))
    assert unsupported[:2] == (400, {"error": "unsupported_grant_type"})


@pytest_twisted.ensureDeferred
async def test_refresh_rotates_by_default(fake):
    http = fake.memory_client()
    first = fake.grant()
    status, second, _ = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="refresh_token", refresh_token=first["refresh_token"])))
    assert status == 200 and second["refresh_token"] != first["refresh_token"]
    assert fake.refreshes == 1
    status, body, _ = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="refresh_token", refresh_token=first["refresh_token"])))
    assert (status, body["error"]) == (400, "invalid_grant")
    assert fake.refreshes == 1


@pytest_twisted.ensureDeferred
async def test_refresh_without_rotation_keeps_the_old_token(fake):
    http = fake.memory_client()
    fake.rotate_refresh = False
    first = fake.grant()
    for n in (1, 2):
        status, body, _ = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
            fake, grant_type="refresh_token", refresh_token=first["refresh_token"])))
        assert status == 200 and "refresh_token" not in body
        assert fake.refreshes == n


@pytest_twisted.ensureDeferred
async def test_refuse_refresh(fake):
    http = fake.memory_client()
    fake.refuse_refresh = True
    status, body, _ = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="refresh_token", refresh_token=fake.grant()["refresh_token"])))
    assert (status, body["error"], fake.refreshes) == (400, "invalid_grant", 0)


@pytest_twisted.ensureDeferred
async def test_access_tokens_expire_on_the_clock(fake):
    http = fake.memory_client()
    access = fake.grant()["access_token"]
    headers = {"authorization": "Bearer " + access}
    assert (await http.get(BASE + USER_PATH, headers=headers)).code == 200
    fake.clock.advance(3600)
    assert not fake.access_valid(access)
    assert (await http.get(BASE + USER_PATH, headers=headers)).code == 401
    assert (await http.get(BASE + USER_PATH)).code == 401


@pytest_twisted.ensureDeferred
async def test_another_user_approves(fake):
    http = fake.memory_client()
    fake.user = FakeChatUser("42", "bob")
    access = fake.grant()["access_token"]
    _, user, _ = await answer(http.get(BASE + USER_PATH, headers={"authorization": "Bearer " + access}))
    assert user == {"id": "42", "username": "bob"}


@pytest_twisted.ensureDeferred
async def test_unavailable_answers_503(fake):
    http = fake.memory_client()
    fake.unavailable = True
    status, _, _ = await answer(http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="refresh_token", refresh_token=fake.grant()["refresh_token"])))
    assert (status, fake.refreshes) == (503, 0)


@pytest_twisted.ensureDeferred
async def test_down_drops_the_connection(fake):
    http = fake.memory_client()
    fake.down = True
    with pytest.raises(ResponseNeverReceived):
        await http.get(BASE + USER_PATH)


@pytest_twisted.ensureDeferred
async def test_slow_answers_after_the_delay(fake):
    http = fake.memory_client()
    fake.slow = 5
    results: list = []
    d = http.post(BASE + TOKEN_PATH, data=client_form(
        fake, grant_type="refresh_token", refresh_token=fake.grant()["refresh_token"]))
    d.addBoth(results.append)
    fake.clock.advance(4)
    assert results == [] and fake.refreshes == 0
    fake.clock.advance(1)
    assert results[0].code == 200 and fake.refreshes == 1


@pytest_twisted.ensureDeferred
async def test_on_a_real_port():
    fake = FakeChatProvider(reactor)
    port = fake.listen(reactor)
    pool = HTTPConnectionPool(reactor, persistent=False)
    http = HTTPClient(Agent(reactor, pool=pool))
    try:
        base = f"http://127.0.0.1:{port.getHost().port}"
        assert port.getHost().host == "127.0.0.1"
        endpoints = fake.endpoints(base)
        assert endpoints["token_url"] == base + TOKEN_PATH
        response = await http.post(endpoints["token_url"], data=client_form(
            fake, grant_type="refresh_token", refresh_token=fake.grant()["refresh_token"]))
        body = json.loads(await treq.content(response))
        assert response.code == 200 and fake.refreshes == 1
        response = await http.get(endpoints["user_url"], headers={"authorization": "Bearer " + body["access_token"]})
        assert json.loads(await treq.content(response))["id"] == fake.user.id
        fake.down = True
        with pytest.raises(ResponseNeverReceived):
            await http.get(endpoints["user_url"])
    finally:
        await pool.closeCachedConnections()
        await port.stopListening()
