"""
Clients that register themselves, through the whole server: dynamic client
registration (RFC 7591) with RFC 7592 read and delete, and client ID
metadata documents served by a real HTTP server on 127.0.0.1 (allowed only
by the test's [remote_documents] switches), each followed by a sign-in and a
code exchange with the new client; and the attacks on both.
"""

from __future__ import annotations

import base64
import json

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import formatEvent
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET, Site

from authsrv.config import ConfigErrors, parse_config
from authsrv.flows.client_documents import DocumentClients
from authsrv.flows.registration import TAKEN_NAME, OperatorNames, RegistrationPolicy
from authsrv.protocol.client_assertion import ASSERTION_TYPE
from authsrv.records import Client
from authsrv.remote_documents import FetchPolicy, RemoteDocuments
from authsrv.sealing import new_key_text
from authsrv.testing.memory import MemoryStore
from authsrv.testing.identity import ALICE, PASSWORDS
from authsrv.tokens import token_hash

from flow_client import Browser, location
from harness import ISSUER, Harness, pkce_pair
from token_helpers import INTROSPECT, TOKEN, hmac_assertion

REGISTER = ISSUER + "/oauth2/register"
INITIAL = "initial-access-token-Q3v9ZkP2mW7xL4nR8tY6"
REDIRECT = "http://127.0.0.1:9100/callback"


def registration_config(monkeypatch, **settings) -> dict:
    monkeypatch.setenv("AUTHSRV_TEST_INITIAL_TOKEN", INITIAL)
    return {"registration": {"enabled": True, "initial_access_token_env": "AUTHSRV_TEST_INITIAL_TOKEN", **settings}}


async def register(h: Harness, metadata, token: str | None = INITIAL, headers: dict | None = None):
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return await h.json("POST", REGISTER, data=json.dumps(metadata).encode(),
                        headers={"Content-Type": "application/json", **auth, **(headers or {})})


async def sign_in_and_exchange(h: Harness, client_id: str, redirect_uri: str, **extra) -> dict:
    """A user signs in to C{client_id}, consenting, and the client swaps the code as a public client."""
    verifier, challenge = pkce_pair()
    query = await Browser(h).sign_in(ALICE, client_id, redirect_uri=redirect_uri, challenge=challenge,
                                     scope="openid offline_access", **extra)
    assert "code" in query, query
    response, body = await h.json("POST", TOKEN, data={
        "grant_type": "authorization_code", "code": query["code"], "code_verifier": verifier,
        "redirect_uri": redirect_uri, "client_id": client_id})
    assert response.code == 200, body
    return body


@pytest_twisted.ensureDeferred
async def test_registration_is_off_and_undiscovered_by_default(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        _, discovery = await h.json("GET", ISSUER + "/.well-known/openid-configuration")
        assert "registration_endpoint" not in discovery
        assert "client_id_metadata_document_supported" not in discovery
        response, body = await register(h, {"redirect_uris": [REDIRECT]})
        assert response.code == 404, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_register_sign_in_read_and_delete(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch)).start()
    try:
        _, discovery = await h.json("GET", ISSUER + "/.well-known/oauth-authorization-server")
        assert discovery["registration_endpoint"] == REGISTER
        response, body = await register(h, {"redirect_uris": [REDIRECT], "client_name": "Agent",
                                            "grant_types": ["authorization_code", "refresh_token"],
                                            "logo_uri": "https://agent.example/logo.png"})
        assert response.code == 201, body
        assert response.headers.getRawHeaders("cache-control") == ["no-store"]
        client_id = body["client_id"]
        assert body["token_endpoint_auth_method"] == "none" and "client_secret" not in body
        assert body["registration_client_uri"] == f"{REGISTER}/{client_id}"
        stored = await h.store.get_client(client_id)
        assert stored.is_public and not stored.first_party and stored.source == "registration"
        assert body["registration_access_token"] not in json.dumps(stored.registration_token_hash)

        issued = await sign_in_and_exchange(h, client_id, REDIRECT)
        assert issued["id_token"] and issued["refresh_token"] is not None

        bearer = {"Authorization": f"Bearer {body['registration_access_token']}"}
        response, read = await h.json("GET", body["registration_client_uri"], headers=bearer)
        assert response.code == 200, read
        assert (read["client_id"], read["client_name"], read["redirect_uris"]) == (client_id, "Agent", [REDIRECT])
        assert "registration_access_token" not in read
        response, _ = await h.request("DELETE", body["registration_client_uri"], headers=bearer)
        assert response.code == 204
        assert await h.store.get_client(client_id) is None
        response, _ = await h.request("GET", body["registration_client_uri"], headers=bearer)
        assert response.code == 401
        response, _ = await h.request("GET", ISSUER + "/oauth2/userinfo",
                                      headers={"Authorization": f"Bearer {issued['access_token']}"})
        assert response.code == 401
        assert await h.store.get_refresh_token(token_hash(issued["refresh_token"])) is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_registered_client_replaces_its_metadata(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch, rate="100/m")).start()
    try:
        _, mine = await register(h, {"redirect_uris": [REDIRECT], "client_name": "Agent"})
        _, theirs = await register(h, {"redirect_uris": [REDIRECT]})
        uri, client_id = mine["registration_client_uri"], mine["client_id"]
        bearer = {"Authorization": f"Bearer {mine['registration_access_token']}",
                  "Content-Type": "application/json"}

        async def put(metadata, headers=bearer, target=uri):
            return await h.json("PUT", target, data=json.dumps(metadata).encode(), headers=headers)

        moved = "http://127.0.0.1:9200/cb"
        response, body = await put({"client_id": client_id, "redirect_uris": [moved], "client_name": "Agent 2"})
        assert response.code == 200, body
        assert (body["redirect_uris"], body["client_name"]) == ([moved], "Agent 2")
        rotated = body["registration_access_token"]
        assert rotated != mine["registration_access_token"] and body["registration_client_uri"] == uri
        response, _ = await h.json("GET", uri, headers=bearer)
        assert response.code == 401
        bearer["Authorization"] = f"Bearer {rotated}"
        response, _ = await h.json("GET", uri, headers=bearer)
        assert response.code == 200
        stored = await h.store.get_client(client_id)
        assert (stored.redirect_uris, stored.source, stored.first_party) == ((moved,), "registration", False)
        assert stored.registration_token_hash is not None
        for metadata, error in (
            ({"client_id": client_id, "redirect_uris": ["https://10.0.0.1/cb"]}, "invalid_redirect_uri"),
            ({"client_id": theirs["client_id"], "redirect_uris": [moved]}, "invalid_client_metadata"),
            ({"redirect_uris": [moved]}, "invalid_client_metadata"),
            ({"client_id": client_id, "redirect_uris": [moved], "token_endpoint_auth_method": "client_secret_basic"},
             "invalid_client_metadata"),
            ({"client_id": client_id, "redirect_uris": [moved], "client_secret": "chosen-by-the-client"},
             "invalid_client_metadata"),
        ):
            response, body = await put(metadata)
            assert response.code == 400 and body["error"] == error, (metadata, body)
        response, body = await put({"client_id": theirs["client_id"], "redirect_uris": ["https://evil.example/cb"]},
                                   target=theirs["registration_client_uri"])
        assert response.code == 401 and body["error"] == "invalid_token", body
        assert (await h.store.get_client(theirs["client_id"])).redirect_uris == (REDIRECT,)
        assert (await h.store.get_client(client_id)).redirect_uris == (moved,)
        change_client = h.store.change_client

        async def removed_meanwhile(before, after):
            await h.store.remove_client(before.client_id)
            return await change_client(before, after)

        monkeypatch.setattr(h.store, "change_client", removed_meanwhile)
        response, body = await put({"client_id": client_id, "redirect_uris": [moved], "client_name": "Agent 3"})
        assert response.code == 401 and body["error"] == "invalid_token", body
        assert await h.store.get_client(client_id) is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_dpop_bound_registration_needs_dpop_offered(tmp_path, monkeypatch):
    """RFC 9449 section 5.2's dpop_bound_access_tokens: honoured when DPoP is offered, refused when it is not."""
    unoffered = "dpop_bound_access_tokens needs DPoP offered: set [dpop] enabled = true"
    bound = {"redirect_uris": [REDIRECT], "dpop_bound_access_tokens": True}
    for folder, dpop in (("off", {}), ("on", {"dpop": {"enabled": True}})):
        (tmp_path / folder).mkdir()
        h = await Harness(tmp_path / folder, monkeypatch, {**registration_config(monkeypatch), **dpop}).start()
        try:
            response, body = await register(h, {**bound, "dpop_bound_access_tokens": "yes"})
            assert (response.code, body["error"]) == (400, "invalid_client_metadata"), body
            response, body = await register(h, bound)
            if not dpop:
                assert (response.code, body["error"], body["error_description"]) == (
                    400, "invalid_client_metadata", unoffered)
                _, mine = await register(h, {"redirect_uris": [REDIRECT]})
                response, body = await h.json(
                    "PUT", mine["registration_client_uri"],
                    data=json.dumps({**bound, "client_id": mine["client_id"]}).encode(),
                    headers={"Authorization": f"Bearer {mine['registration_access_token']}",
                             "Content-Type": "application/json"})
                assert (response.code, body["error"], body["error_description"]) == (
                    400, "invalid_client_metadata", unoffered)
                assert (await h.store.get_client(mine["client_id"])).dpop_bound_access_tokens is False
            else:
                assert (response.code, body["dpop_bound_access_tokens"]) == (201, True), body
                assert (await h.store.get_client(body["client_id"])).dpop_bound_access_tokens is True
        finally:
            await h.close()


@pytest_twisted.ensureDeferred
async def test_registered_clients_always_ask_for_consent(tmp_path, monkeypatch):
    """
    A registered client is never first-party: the user sees the consent
    page, which warns that nobody vetted it and says where the answer goes.
    """
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch)).start()
    try:
        _, body = await register(h, {"redirect_uris": [REDIRECT], "client_name": "Agent"})
        for client_id, redirect, warned in ((body["client_id"], REDIRECT, True), ("partner", None, False)):
            browser = Browser(h)
            response, _ = await browser.authorize(client_id, redirect_uri=redirect, scope="openid")
            response, _ = await browser.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
            _, page = await browser.get(location(response))
            assert (b"registered itself" in page) is warned
            assert (b"http://127.0.0.1:9100" in page) is warned
        browser = Browser(h)
        query = await browser.sign_in(ALICE, body["client_id"], consent="deny", redirect_uri=REDIRECT,
                                      scope="openid")
        assert query["error"] == "access_denied"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("token", [None, "wrong-token", INITIAL[:-1]])
async def test_a_missing_or_wrong_initial_token_is_refused(tmp_path, monkeypatch, token):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch)).start()
    try:
        response, body = await register(h, {"redirect_uris": [REDIRECT]}, token=token)
        assert response.code == 401 and body["error"] == "invalid_token", body
        assert 'Bearer realm="authsrv"' in response.headers.getRawHeaders("www-authenticate")[0]
        assert not [c for c in await h.store.list_clients() if c.source == "registration"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize(("metadata", "error"), [
    ({}, "invalid_redirect_uri"),
    ({"redirect_uris": []}, "invalid_redirect_uri"),
    ({"redirect_uris": ["http://app.example/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["https://app.example/cb#frag"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["https://10.0.0.5/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["https://169.254.169.254/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["https://[fd00::1]/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["http://evil.example\\@127.0.0.1/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["http://evil.example@127.0.0.1/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": ["http://127.0.0.1;report-uri=x/cb"]}, "invalid_redirect_uri"),
    ({"redirect_uris": "https://app.example/cb"}, "invalid_redirect_uri"),
    ({"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "client_secret_basic"}, "invalid_client_metadata"),
    ({"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "private_key_jwt"}, "invalid_client_metadata"),
    ({"redirect_uris": [REDIRECT], "grant_types": ["client_credentials"]}, "invalid_client_metadata"),
    ({"redirect_uris": [REDIRECT], "grant_types": "authorization_code"}, "invalid_client_metadata"),
    ({"redirect_uris": [REDIRECT], "grant_types": ["refresh_token"]}, "invalid_client_metadata"),
    ({"redirect_uris": [REDIRECT], "response_types": ["token"]}, "invalid_client_metadata"),
    ({"redirect_uris": [REDIRECT], "client_name": ""}, "invalid_client_metadata"),
    ({"redirect_uris": [REDIRECT], "client_name": "x" * 201}, "invalid_client_metadata"),
    ([REDIRECT], "invalid_client_metadata"),
])
async def test_bad_metadata_is_refused_by_field(tmp_path, monkeypatch, metadata, error):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch)).start()
    try:
        response, body = await register(h, metadata)
        assert response.code == 400 and body["error"] == error, body
        assert body["error_description"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_body_that_is_not_json_is_invalid_metadata(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch)).start()
    try:
        for data, content_type in ((b"redirect_uris=x", "application/x-www-form-urlencoded"),
                                   (b"{not json", "application/json"), (b"[" * 100_000, "application/json"),
                                   (json.dumps({"redirect_uris": [REDIRECT], "client_name": "\ud800"}).encode(),
                                    "application/json")):
            response, body = await h.json("POST", REGISTER, data=data, headers={
                "Content-Type": content_type, "Authorization": f"Bearer {INITIAL}"})
            assert response.code in (400, 413) and (response.code == 413 or body["error"] == "invalid_client_metadata")
        assert [c for c in await h.store.list_clients() if c.client_id not in {d.client_id for d in h.config.clients}] == []
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_allow_list_policy_limits_redirect_hosts(tmp_path, monkeypatch):
    config = {"registration": {"enabled": True, "allowed_redirect_hosts": ["127.0.0.1", "*.tools.example"]}}
    h = await Harness(tmp_path, monkeypatch, config).start()
    try:
        for uri in ("https://agent.tools.example/cb", REDIRECT):
            response, body = await register(h, {"redirect_uris": [uri]}, token=None)
            assert response.code == 201, body
        for uri in ("https://evil.example/cb", "https://tools.example.evil.example/cb", "com.example.app:/cb",
                    "https://eviltools.example/cb"):
            response, body = await register(h, {"redirect_uris": [REDIRECT, uri]}, token=None)
            assert response.code == 400 and body["error"] == "invalid_redirect_uri", (uri, body)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_confidential_clients_only_when_allowed(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch, allow_confidential=True)).start()
    try:
        response, body = await register(h, {"redirect_uris": [REDIRECT],
                                            "token_endpoint_auth_method": "client_secret_post"})
        assert response.code == 201, body
        assert body["client_secret"] and body["client_secret_expires_at"] == 0
        response, answer = await h.json("POST", TOKEN, data={
            "grant_type": "authorization_code", "code": "nope", "code_verifier": "v" * 43, "redirect_uri": REDIRECT,
            "client_id": body["client_id"], "client_secret": body["client_secret"]})
        assert answer["error"] == "invalid_grant", answer
        response, answer = await h.json("POST", TOKEN, data={
            "grant_type": "authorization_code", "code": "nope", "code_verifier": "v" * 43, "redirect_uri": REDIRECT,
            "client_id": body["client_id"], "client_secret": "wrong"})
        assert answer["error"] == "invalid_client", answer
    finally:
        await h.close()


def sealing_config(monkeypatch, **settings) -> dict:
    """Registration with a [client_secrets] key, so client_secret_jwt secrets can be sealed."""
    monkeypatch.setenv("AUTHSRV_TEST_CLIENT_SECRETS_KEY", new_key_text())
    return {**registration_config(monkeypatch, **settings),
            "client_secrets": {"encryption_key_env": "AUTHSRV_TEST_CLIENT_SECRETS_KEY"}}


@pytest.mark.parametrize("config, names", [
    (lambda m: sealing_config(m), "[registration] allow_confidential"),
    (lambda m: registration_config(m, allow_confidential=True), "[client_secrets] encryption_key_file"),
])
@pytest_twisted.ensureDeferred
async def test_client_secret_jwt_needs_secrets_allowed_and_a_sealing_key(tmp_path, monkeypatch, config, names):
    h = await Harness(tmp_path, monkeypatch, config(monkeypatch)).start()
    try:
        response, body = await register(h, {"redirect_uris": [REDIRECT],
                                            "token_endpoint_auth_method": "client_secret_jwt"})
        assert response.code == 400 and body["error"] == "invalid_client_metadata", body
        assert names in body["error_description"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_secret_jwt_client_registers_and_may_move_to_a_plain_secret(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, sealing_config(monkeypatch, allow_confidential=True, rate="100/m")).start()
    try:
        response, body = await register(h, {"redirect_uris": [REDIRECT],
                                            "token_endpoint_auth_method": "client_secret_jwt"})
        assert response.code == 201, body
        client_id, secret = body["client_id"], body["client_secret"]
        assert len(secret) == 64 and body["token_endpoint_auth_method"] == "client_secret_jwt"
        stored = await h.store.get_client(client_id)
        assert h.config.secret_keeper.secrets(stored, h.now()) == (secret,)
        response, answer = await h.json("POST", INTROSPECT, data={
            "token": "nope", "client_assertion_type": ASSERTION_TYPE,
            "client_assertion": hmac_assertion(secret, client_id, ISSUER, h.now(), alg="HS512")})
        assert response.code == 200 and answer == {"active": False}, answer

        uri = body["registration_client_uri"]
        bearer = {"Authorization": f"Bearer {body['registration_access_token']}", "Content-Type": "application/json"}

        async def put(method, **extra):
            return await h.json("PUT", uri, headers=bearer, data=json.dumps({
                "client_id": client_id, "redirect_uris": [REDIRECT], "token_endpoint_auth_method": method,
                **extra}).encode())

        _, read = await h.json("GET", uri, headers=bearer)
        assert read["token_endpoint_auth_method"] == "client_secret_jwt" and "client_secret" not in read
        for unknown in ("private_key_jwt", "client_secret", 5):
            response, answer = await put(unknown)
            assert response.code == 400 and answer["error"] == "invalid_client_metadata", answer
            assert "must be one of none, client_secret_basic" in answer["error_description"]
        for wrong in (secret[:-1], 5):
            response, answer = await put("client_secret_basic", client_secret=wrong)
            assert response.code == 400 and "client_secret must be this client's" in answer["error_description"]
        response, answer = await put("client_secret_basic", client_secret=secret)
        assert response.code == 200 and answer["token_endpoint_auth_method"] == "client_secret_basic", answer
        bearer["Authorization"] = f"Bearer {answer['registration_access_token']}"
        stored = await h.store.get_client(client_id)
        assert (stored.token_endpoint_auth_method, stored.sealed_secret) == (None, None)
        _, read = await h.json("GET", uri, headers=bearer)
        assert read["token_endpoint_auth_method"] == "client_secret_basic"
        response, answer = await put("client_secret_jwt")
        assert response.code == 400 and answer["error"] == "invalid_client_metadata", answer
        assert "cannot change to client_secret_jwt" in answer["error_description"]
        h.clock.advance(3)  # past the client cache
        response, answer = await h.json("POST", INTROSPECT, data={"token": "nope", "client_id": client_id,
                                                                  "client_secret": secret})
        assert response.code == 200 and answer == {"active": False}, answer
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_registration_token_reads_and_deletes_only_its_own_client(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch, rate="100/m")).start()
    try:
        _, mine = await register(h, {"redirect_uris": [REDIRECT]})
        _, theirs = await register(h, {"redirect_uris": [REDIRECT]})
        mine_bearer = {"Authorization": f"Bearer {mine['registration_access_token']}"}
        for method in ("GET", "DELETE"):
            response, body = await h.json(method, theirs["registration_client_uri"], headers=mine_bearer)
            assert response.code == 401 and body["error"] == "invalid_token", body
            for target in ("first", "nobody"):
                response, body = await h.json(method, f"{REGISTER}/{target}", headers=mine_bearer)
                assert response.code == 401, body
            response, body = await h.json(method, theirs["registration_client_uri"],
                                          headers={"Authorization": f"Bearer {INITIAL}"})
            assert response.code == 401, body
            response, body = await h.json(method, theirs["registration_client_uri"])
            assert response.code == 401, body
        assert await h.store.get_client(theirs["client_id"]) is not None
        assert await h.store.get_client("first") is not None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_registration_burst_is_rate_limited_per_address(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch, rate="3/m")).start()
    try:
        for _ in range(3):
            response, body = await register(h, {"redirect_uris": [REDIRECT]})
            assert response.code == 201, body
        response, body = await register(h, {"redirect_uris": [REDIRECT]})
        assert response.code == 429 and body["error"] == "too_many_requests", body
        assert int(response.headers.getRawHeaders("retry-after")[0]) >= 1
        response, body = await register(h, {"redirect_uris": [REDIRECT]}, token="wrong")
        assert response.code == 429, body
        h.clock.advance(60)
        response, body = await register(h, {"redirect_uris": [REDIRECT]})
        assert response.code == 201, body
        assert len([c for c in await h.store.list_clients() if c.source == "registration"]) == 4
    finally:
        await h.close()


OPERATOR_LOOKALIKES = ["Partner App", " partner \u3000 APP ", "Ｐａｒｔｎｅｒ App", "P\u0430rtner App",
                       "Part\u200dner App", "Console", "CONSOLE"]
"""Names of the harness's config client Partner App and an admin-API client Console, as a registrant might write them."""


async def add_console(h: Harness) -> None:
    """An operator's client made through the admin API, so in the store only."""
    await h.store.add_client(Client("console", None, ["https://console.example/cb"], name="Console",
                                    source="operator"))


@pytest_twisted.ensureDeferred
async def test_an_operator_clients_name_is_not_registered(tmp_path, monkeypatch):
    """The consent page would show a registrant's client under a name users trust."""
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch, rate="100/m")).start()
    try:
        await add_console(h)
        for name in OPERATOR_LOOKALIKES:
            response, body = await register(h, {"redirect_uris": [REDIRECT], "client_name": name})
            assert response.code == 400, (name, body)
            assert body == {"error": "invalid_client_metadata", "error_description": TAKEN_NAME}, name
        assert await h.store.count_clients("registration") == 0
        for name in ("Partner Apps", "Agent", "Agent"):
            response, body = await register(h, {"redirect_uris": [REDIRECT], "client_name": name})
            assert response.code == 201, (name, body)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_update_cannot_take_an_operator_clients_name(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch, rate="100/m")).start()
    try:
        await add_console(h)
        _, mine = await register(h, {"redirect_uris": [REDIRECT], "client_name": "Agent"})
        bearer = {"Authorization": f"Bearer {mine['registration_access_token']}", "Content-Type": "application/json"}
        for name in OPERATOR_LOOKALIKES:
            response, body = await h.json("PUT", mine["registration_client_uri"], headers=bearer, data=json.dumps(
                {"client_id": mine["client_id"], "redirect_uris": [REDIRECT], "client_name": name}).encode())
            assert response.code == 400, (name, body)
            assert body == {"error": "invalid_client_metadata", "error_description": TAKEN_NAME}, name
        assert (await h.store.get_client(mine["client_id"])).name == "Agent"
        response, body = await h.json("GET", mine["registration_client_uri"], headers=bearer)
        assert response.code == 200, "a refused update leaves the registration access token as it was"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_registration_is_refused_at_max_clients_until_one_is_deleted(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch, max_clients=2)).start()
    try:
        registered = []
        for _ in range(2):
            response, body = await register(h, {"redirect_uris": [REDIRECT]})
            assert response.code == 201, body
            registered.append(body)
        response, body = await register(h, {"redirect_uris": [REDIRECT]})
        assert response.code == 403, body
        assert body["error"] == "access_denied" and "max_clients" in body["error_description"], body
        assert await h.store.count_clients("registration") == 2
        response, _ = await h.request("DELETE", registered[0]["registration_client_uri"],
                                      headers={"Authorization": f"Bearer {registered[0]['registration_access_token']}"})
        assert response.code == 204
        response, body = await register(h, {"redirect_uris": [REDIRECT]})
        assert response.code == 201, body
        assert await h.store.count_clients("registration") == 2
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_registrations_and_refusals_are_audited(tmp_path, monkeypatch):
    seen: list[dict] = []
    from twisted.logger import globalLogPublisher

    def observe(event):
        if event.get("log_namespace") == "authsrv.audit":
            seen.append(event)

    globalLogPublisher.addObserver(observe)
    h = await Harness(tmp_path, monkeypatch, registration_config(monkeypatch)).start()
    try:
        _, body = await register(h, {"redirect_uris": [REDIRECT]})
        await register(h, {"redirect_uris": [REDIRECT]}, token="wrong")
        await register(h, {"redirect_uris": ["https://10.1.2.3/cb"]})
        await h.request("DELETE", body["registration_client_uri"],
                        headers={"Authorization": f"Bearer {body['registration_access_token']}"})
    finally:
        globalLogPublisher.removeObserver(observe)
        await h.close()
    kinds = [(e["event"], e.get("source"), e.get("address")) for e in seen]
    assert ("client.created", "registration", "127.0.0.1") in kinds
    assert ("client.deleted", "registration", "127.0.0.1") in kinds
    refused = [e["reason"] for e in seen if e["event"] == "registration.refused"]
    assert len(refused) == 2 and "initial access token" in refused[0] and "10.1.2.3" in refused[1]
    text = json.dumps([{k: str(v) for k, v in e.items()} for e in seen])
    assert INITIAL not in text and body["registration_access_token"] not in text


def test_registration_config_needs_a_policy_and_good_host_patterns(tmp_path, monkeypatch):
    with pytest.raises(ConfigErrors, match="registration.enabled.*needs a policy"):
        parse_config({"registration": {"enabled": True}}, tmp_path / "a.toml")
    with pytest.raises(ConfigErrors, match=r"allowed_redirect_hosts\[1\]"):
        parse_config({"registration": {"enabled": True, "allowed_redirect_hosts": ["ok.example", "*bad"]}},
                     tmp_path / "a.toml")
    with pytest.raises(ConfigErrors, match="initial_access_token"):
        parse_config({"registration": {"enabled": True, "initial_access_token": "in-the-file"}}, tmp_path / "a.toml")
    for wrong in (0, 10_000_001):
        with pytest.raises(ConfigErrors, match="registration.max_clients"):
            parse_config({"registration": {"max_clients": wrong}}, tmp_path / "a.toml")
    policy = parse_config({}, tmp_path / "a.toml").registration
    assert not policy.enabled and not policy.metadata_documents and policy.max_clients == 10_000


# --- client ID metadata documents ------------------------------------------------


class Documents(Resource):
    """A document server: C{documents} by path, C{slow} paths never answered."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.documents: dict[bytes, bytes] = {}
        self.slow: set[bytes] = set()
        self.hits: list[bytes] = []

    def render_GET(self, request):
        self.hits.append(request.path)
        if request.path in self.slow:
            return NOT_DONE_YET
        if request.path not in self.documents:
            request.setResponseCode(404)
            return b"{}"
        request.setHeader(b"content-type", b"application/json")
        return self.documents[request.path]


@pytest.fixture
def document_server():
    server = Documents()
    port = reactor.listenTCP(0, Site(server), interface="127.0.0.1")
    base = f"http://127.0.0.1:{port.getHost().port}"
    yield server, base
    port.stopListening()


def serve(server: Documents, url: str, document: dict | bytes) -> None:
    path = url.split("/", 3)[3]
    server.documents[b"/" + path.encode()] = document if isinstance(document, bytes) else json.dumps(document).encode()


RESOURCE = "https://tools.example.test/mcp"
LOCAL_DOCUMENTS = {"remote_documents": {"allow_http": True, "allow_private_addresses": True, "max_bytes": 2048},
                   "registration": {"client_id_metadata_documents": True, "resources": [RESOURCE]}}


@pytest_twisted.ensureDeferred
async def test_a_metadata_document_client_signs_in(tmp_path, monkeypatch, document_server):
    server, base = document_server
    url = f"{base}/agent.json"
    serve(server, url, {"client_id": url, "client_name": "Doc Agent", "redirect_uris": [REDIRECT],
                        "token_endpoint_auth_method": "none"})
    h = await Harness(tmp_path, monkeypatch, LOCAL_DOCUMENTS, fetch_documents=True).start()
    try:
        _, discovery = await h.json("GET", ISSUER + "/.well-known/openid-configuration")
        assert discovery["client_id_metadata_document_supported"] is True
        assert "registration_endpoint" not in discovery
        issued = await sign_in_and_exchange(h, url, REDIRECT, resource=RESOURCE)
        payload = issued["access_token"].split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        assert (claims["aud"], claims["client_id"]) == (RESOURCE, url)
        query = await Browser(h).sign_in(ALICE, url, redirect_uri=REDIRECT, resource="https://other.example/")
        assert query["error"] == "invalid_target", query
        assert server.hits.count(b"/agent.json") == 1, "the document is cached"
        assert await h.store.get_client(url) is None
        assert await h.store.get_consent(ALICE.sub, url) is not None, "a client never stored keeps its consent"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("document", [
    "mismatch", "secret", "private_key_jwt", "bad_redirect", "oversized", "not_json", "not_text", "missing",
    "dpop_unoffered", "operator_name",
])
async def test_a_bad_metadata_document_is_an_unknown_client(tmp_path, monkeypatch, document_server, document):
    server, base = document_server
    url = f"{base}/agent.json"
    good = {"client_id": url, "redirect_uris": [REDIRECT]}
    bodies = {
        "mismatch": {**good, "client_id": f"{base}/other.json"},
        "secret": {**good, "client_secret": "s3cret"},
        "private_key_jwt": {**good, "token_endpoint_auth_method": "private_key_jwt"},
        "bad_redirect": {**good, "redirect_uris": ["http://attacker.example/cb"]},
        "oversized": {**good, "client_name": "x" * 4096},
        "not_json": b"<html>",
        "not_text": json.dumps({**good, "client_name": "\udc00"}).encode(),
        "dpop_unoffered": {**good, "dpop_bound_access_tokens": True},
        "operator_name": {**good, "client_name": "PARTNER  app"},
    }
    if document in bodies:
        serve(server, url, bodies[document])
    h = await Harness(tmp_path, monkeypatch, LOCAL_DOCUMENTS, fetch_documents=True).start()
    try:
        response, body = await Browser(h).authorize(url, redirect_uri=REDIRECT)
        assert response.code == 400, body
        assert b"code=" not in body and response.headers.getRawHeaders("location") is None
        assert server.hits == [b"/agent.json"]
        h.clock.advance(h.config.remote_documents.refetch_after - 1)
        response, _ = await Browser(h).authorize(url, redirect_uri=REDIRECT)
        assert response.code == 400 and server.hits == [b"/agent.json"], "a refusal is remembered"
        h.clock.advance(2)
        await Browser(h).authorize(url, redirect_uri=REDIRECT)
        assert server.hits == [b"/agent.json"] * 2, "then fetched again: an invalid document is not cached"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_metadata_document_may_ask_for_dpop_bound_tokens(tmp_path, monkeypatch, document_server):
    server, base = document_server
    url = f"{base}/agent.json"
    serve(server, url, {"client_id": url, "redirect_uris": [REDIRECT], "dpop_bound_access_tokens": True})
    h = await Harness(tmp_path, monkeypatch, {**LOCAL_DOCUMENTS, "dpop": {"enabled": True}},
                      fetch_documents=True).start()
    try:
        verifier, challenge = pkce_pair()
        query = await Browser(h).sign_in(ALICE, url, redirect_uri=REDIRECT, challenge=challenge)
        response, body = await h.json("POST", TOKEN, data={
            "grant_type": "authorization_code", "code": query["code"], "code_verifier": verifier,
            "redirect_uri": REDIRECT, "client_id": url})
        assert (response.code, body["error"]) == (400, "invalid_dpop_proof"), body
        assert "must send a DPoP proof" in body["error_description"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_documents_on_private_addresses_or_over_http_are_not_fetched(tmp_path, monkeypatch, document_server):
    server, base = document_server
    url = f"{base}/agent.json"
    serve(server, url, {"client_id": url, "redirect_uris": [REDIRECT]})
    h = await Harness(tmp_path, monkeypatch, {"registration": {"client_id_metadata_documents": True},
                                              "remote_documents": {"allow_http": True}}, fetch_documents=True).start()
    try:
        for client_id in (url, "http://169.254.169.254/latest/meta-data", "http://10.0.0.1/a.json"):
            response, _ = await Browser(h).authorize(client_id, redirect_uri=REDIRECT)
            assert response.code == 400
        assert server.hits == []
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("path", ["", "/tools/../agent.json", "/./agent.json", "/tools/%2E%2e/agent.json"])
async def test_a_client_id_without_a_path_or_with_dot_segments_is_not_fetched(document_server, path):
    """
    The draft's section 3: such a URL is shown to the user as one document
    while the server that answers may take it for another one's.
    """
    server, base = document_server
    url = base + path
    server.documents[path.encode() or b"/"] = json.dumps({"client_id": url, "redirect_uris": [REDIRECT]}).encode()
    documents = RemoteDocuments(reactor, FetchPolicy(allow_http=True, allow_private_addresses=True))
    clients = DocumentClients(None, documents, RegistrationPolicy(metadata_documents=True), reactor,
                              OperatorNames(MemoryStore()))
    assert await clients.get_client(url) is None
    assert server.hits == []


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("path", ["/agent\x1b[2J.json", "/agent.json\r\tforged line", "/a gent.json", "/agént.json"])
async def test_a_client_id_that_is_no_uri_is_neither_fetched_nor_logged(document_server, path, logged):
    """
    Whoever sends a request chooses its client_id: one holding a control
    character, a space or a non-ASCII letter (RFC 3986 allows none) names no
    document, and its text, an escape sequence a terminal acts on say, never
    reaches the diagnostic log.
    """
    server, base = document_server
    url = base + path
    documents = RemoteDocuments(reactor, FetchPolicy(allow_http=True, allow_private_addresses=True))
    clients = DocumentClients(None, documents, RegistrationPolicy(metadata_documents=True), reactor,
                              OperatorNames(MemoryStore()))
    assert await clients.get_client(url) is None
    assert server.hits == []
    assert not [event for event in logged if path.strip("/") in formatEvent(event)]


@pytest_twisted.ensureDeferred
async def test_a_slow_document_times_out(document_server):
    from twisted.internet.task import Clock

    server, base = document_server
    url = f"{base}/slow.json"
    server.slow.add(b"/slow.json")
    clock = Clock()
    documents = RemoteDocuments(reactor, FetchPolicy(allow_http=True, allow_private_addresses=True), clock=clock)
    clients = DocumentClients(None, documents, RegistrationPolicy(metadata_documents=True), clock,
                              OperatorNames(MemoryStore()))
    results: list = []
    Deferred.fromCoroutine(clients.get_client(url)).addBoth(results.append)
    for _ in range(200):
        if server.hits:
            break
        await deferLater(reactor, 0.005, lambda: None)
    assert server.hits == [b"/slow.json"] and results == []
    clock.advance(FetchPolicy().timeout + 1)
    for _ in range(200):
        if results:
            break
        await deferLater(reactor, 0.005, lambda: None)
    assert results == [None]


@pytest_twisted.ensureDeferred
async def test_a_document_not_fetched_because_others_are_is_not_remembered_as_refused(document_server):
    """Someone naming many slow URLs must not lock an agent out of its own document for refetch_after."""
    from twisted.internet.task import Clock

    server, base = document_server
    server.slow.add(b"/slow.json")
    url = f"{base}/agent.json"
    serve(server, url, {"client_id": url, "redirect_uris": [REDIRECT]})
    clock = Clock()
    documents = RemoteDocuments(reactor, FetchPolicy(allow_http=True, allow_private_addresses=True,
                                                     fetches_in_flight=1), clock=clock)
    clients = DocumentClients(None, documents, RegistrationPolicy(metadata_documents=True), clock,
                              OperatorNames(MemoryStore()))
    slow = Deferred.fromCoroutine(clients.get_client(f"{base}/slow.json"))
    assert await clients.get_client(url) is None
    clock.advance(FetchPolicy().timeout)
    assert await slow is None
    assert (await clients.get_client(url)).client_id == url
