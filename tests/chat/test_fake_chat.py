"""
The fake chat provider's wire, where the provider client never goes: its
authorize endpoint's refusals, client authentication, access tokens expiring
on its clock, and the user who approves. The code exchange, refresh and the
failure switches are proven through the real client by the conformance suite
(tests/test_chat_provider.py), in memory and on a real port.
"""

from __future__ import annotations

import base64
import json

import pytest
import pytest_twisted
from twisted.internet.task import Clock

from harness import query_of

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


async def authorize(fake, http, state="the-state", **extra):
    params = {"response_type": "code", "client_id": fake.client_id, "redirect_uri": REDIRECT,
              "scope": "identify guilds.join", "state": state, **extra}
    response = await http.get(BASE + AUTHORIZE_PATH, params=params, allow_redirects=False)
    assert response.code == 302
    return response.headers.getRawHeaders(b"location")[0].decode()


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
