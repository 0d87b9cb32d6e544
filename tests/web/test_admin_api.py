"""
The admin API in memory: the real AdminAPI resource over the test harness's
SQLite store, static users file and keystore, with time from a Clock. Each
endpoint's answers and refusals, the one error shape, ETag / If-Match, and
the audit event (with the actor) of every change.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from jwcrypto.jwk import JWK
from treq.client import HTTPClient
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.defer import succeed
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThreadPool
from twisted.logger import LogLevel
from twisted.web.client import Agent
from twisted.web.server import Site

from authsrv.flows.backchannel import BackchannelNotifier, PinnedEndpoints
from authsrv.identity.passwords import hash_password
from authsrv.identity.static import add_user
from authsrv.operations import AdminOperations
from authsrv.operations.clients import ClientOperations
from authsrv.configsection import Section
from authsrv.keys import jwkfile
from authsrv.operations.keys import ADOPTED, JWKS_MAX_AGE, KeyOperations
from authsrv.operations.paging import decode_cursor, encode_cursor
from authsrv.operations.users import UserOperations
from authsrv.records import BrowserSession, Client, LinkedAccount, Passkey
from authsrv.sealing import new_key_text
from authsrv.testing.identity import ALICE, BOB, MALLORY
from authsrv.testing.store import start_grant
from authsrv.tokens import token_hash
from authsrv.web.admin import AdminAPI
from authsrv.web.root import Root

from flows.test_backchannel import HANG, FakeRelyingParty
from harness import BASE, CHEAP, INTERNAL_SECRET, ISSUER, Harness, settle
from web.test_internal import give_grant

ADMIN_SECRET = "admin-test-secret-Xq4Lm9Pz2Rt7Wv3Ny8"
ACTOR = "provisioning-bot"
AUTH = {"Authorization": f"Bearer {ADMIN_SECRET}"}
JSON = {**AUTH, "Content-Type": "application/json"}


class Admin:
    """The harness's server with the admin API beside it, as the internal listener serves it."""

    def __init__(self, h: Harness, notify=None, revoke_link=None):
        self.h = h
        self.ended: list[BrowserSession] = []
        hashing = h.context.threadpool("admin-passwords", 1)

        def record(session):
            self.ended.append(session)
            return succeed(None)

        operations = AdminOperations(
            clients=ClientOperations(store=h.store, clock=h.clock, resolve=None,
                                     declared=frozenset(c.client_id for c in h.config.clients),
                                     dpop_offered=h.config.dpop is not None, secrets=h.config.secret_keeper),
            users=UserOperations(
                store=h.store, identity=h.identity, clock=h.clock, notify=notify or record,
                hash_password=lambda p: deferToThreadPool(reactor, hashing, hash_password, p, CHEAP),
                link_provider="discord", revoke_link=revoke_link,
            ),
            keys=KeyOperations(keystore=h.keystore, clock=h.clock),
        )
        admin = AdminAPI(operations=operations, secret=ADMIN_SECRET, actor=ACTOR).resource()
        self.http = StubTreq(Root({}, h.internal.resource(), h.internal.resource(), h.config.input_limits, admin))

    async def call(self, method: str, path: str, body=None, headers=None, raw: bytes | None = None):
        headers = JSON if headers is None else headers
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        response = await settle(self.http, self.http.request(method, BASE + path, data=data, headers=headers))
        content = await settle(self.http, response.content())
        return response, json.loads(content) if content else None


@pytest.fixture
def harness(tmp_path, monkeypatch):
    return Harness(tmp_path, monkeypatch)


async def started(harness) -> Admin:
    await harness.start()
    return Admin(harness)


def assert_problem(response, body, status, code, field=None):
    assert response.code == status, body
    assert body["error"] == code and isinstance(body["message"], str)
    assert body.get("field") == field
    assert response.headers.getRawHeaders("content-type") == ["application/json"]
    assert response.headers.getRawHeaders("cache-control") == ["no-store"]


NEW_CLIENT = {"client_id": "crm", "name": "CRM", "redirect_uris": ["https://crm.example/cb"]}


@pytest_twisted.ensureDeferred
async def test_the_secret_is_required_and_the_internal_one_refused(harness):
    a = await started(harness)
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {INTERNAL_SECRET}"},
                        {"Authorization": f"Basic {ADMIN_SECRET}"}):
            for method, path in (("GET", "/api/admin/clients"), ("GET", "/api/admin/nothing"),
                                 ("PUT", "/api/admin/keys")):
                response, body = await a.call(method, path, headers=headers)
                assert_problem(response, body, 401, "unauthorized")
                assert response.headers.getRawHeaders("www-authenticate") == ['Bearer realm="authsrv-admin"']
        response, body = await a.call("GET", "/api/admin/clients", headers=AUTH)
        assert response.code == 200 and body["next_cursor"] is None
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_unknown_paths_and_methods(harness):
    a = await started(harness)
    try:
        for path in ("/api/admin/nothing", "/api/admin/clients/", f"/api/admin/users/{BOB.sub}/", "/api/admin//bans"):
            response, body = await a.call("GET", path, headers=AUTH)
            assert_problem(response, body, 404, "not_found")
        response, body = await a.call("PUT", "/api/admin/keys", headers=AUTH)
        assert_problem(response, body, 405, "method_not_allowed")
        assert "GET" in response.headers.getRawHeaders("allow")[0]
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_path_that_is_not_utf8_is_refused_in_each_listener_shape(harness, audit):
    """
    A %-escape that decodes to no UTF-8 text (/users/%ff) is the caller's
    mistake: a 400 in the shape of the endpoint it was sent to (the admin
    API's JSON, the OAuth JSON, a page), never Klein's plain text with a
    critical log line and a traceback, which anyone could fill the log with.
    """
    a = await started(harness)
    try:
        response, body = await a.call("GET", "/api/admin/users/%ff", headers=AUTH)
        assert_problem(response, body, 400, "invalid_request")
        response, body = await a.call("GET", "/api/admin/clients/a%c3%28b", headers=AUTH)
        assert_problem(response, body, 400, "invalid_request")
        response, body = await a.call("GET", "/api/auth/oauth2/%ff", headers={})
        assert response.code == 400 and body["error"] == "invalid_request", body
        response = await settle(a.http, a.http.get(BASE + "/api/auth/oauth2/end-session/%ff"))
        assert response.code == 400
        assert response.headers.getRawHeaders("content-type") == ["text/html; charset=utf-8"]
        response, body = await a.call("GET", "/api/admin/users/%c3%a9", headers=AUTH)
        assert_problem(response, body, 404, "not_found", "user_id")
        assert not [e for e in audit if e.get("log_level") == LogLevel.critical]
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_create_get_update_delete_a_client(harness, audit):
    a = await started(harness)
    try:
        response, body = await a.call("POST", "/api/admin/clients", NEW_CLIENT)
        assert response.code == 201, body
        assert response.headers.getRawHeaders("location") == ["/api/admin/clients/crm"]
        secret = body["client_secret"]
        assert len(secret) >= 43
        assert body["client"]["type"] == "confidential" and "secret_hash" not in body["client"]
        stored = await harness.store.get_client("crm")
        assert secret not in json.dumps(body["client"]) and stored.secret_hash.startswith("hmac-sha256:")

        response, body = await a.call("GET", "/api/admin/clients/crm", headers=AUTH)
        etag = response.headers.getRawHeaders("etag")[0]
        assert body["name"] == "CRM" and body["redirect_uris"] == ["https://crm.example/cb"]

        change = {"name": "CRM 2", "first_party": True, "rate_limit": "5/s", "refresh_grace": "30s",
                  "audiences": ["https://api.crm.example"], "grant_types": ["authorization_code"]}
        response, body = await a.call("PATCH", "/api/admin/clients/crm", change, headers={**JSON, "If-Match": etag})
        assert response.code == 200, body
        assert (body["name"], body["first_party"], body["rate_limit"], body["refresh_grace"]) == ("CRM 2", True, "5/s", 30)
        new_etag = response.headers.getRawHeaders("etag")[0]
        assert new_etag != etag

        response, body = await a.call("PATCH", "/api/admin/clients/crm", {"name": "stale"},
                                      headers={**JSON, "If-Match": etag})
        assert_problem(response, body, 412, "precondition_failed")
        response, body = await a.call("DELETE", "/api/admin/clients/crm", headers={**AUTH, "If-Match": etag})
        assert_problem(response, body, 412, "precondition_failed")
        response, body = await a.call("PATCH", "/api/admin/clients/crm", {"name": "last write"})
        assert response.code == 200 and body["name"] == "last write"
        response, body = await a.call("PATCH", "/api/admin/clients/crm", {})
        assert response.code == 200 and body["name"] == "last write", "an empty merge patch changes nothing"

        response, body = await a.call("DELETE", "/api/admin/clients/crm", headers=AUTH)
        assert response.code == 204 and body is None
        response, body = await a.call("GET", "/api/admin/clients/crm", headers=AUTH)
        assert_problem(response, body, 404, "not_found", "client_id")

        ours = [e for e in audit if e.get("log_namespace") == "authsrv.audit" and e.get("client_id") == "crm"]
        assert [e["event"] for e in ours] == ["client.created", "client.changed", "client.changed", "client.deleted"]
        assert all(e["actor"] == ACTOR for e in ours)
        assert audit.of("client.changed")[0]["fields"] == sorted(change)
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_client_secret_jwt_client_is_created_read_and_rotated(tmp_path, monkeypatch):
    """Its sealed secret is bytes: the ETag must still be computed (it was a 500)."""
    monkeypatch.setenv("AUTHSRV_TEST_CLIENT_SECRETS_KEY", new_key_text())
    h = Harness(tmp_path, monkeypatch, {"client_secrets": {"encryption_key_env": "AUTHSRV_TEST_CLIENT_SECRETS_KEY"}})
    a = await started(h)
    try:
        response, body = await a.call("POST", "/api/admin/clients", {
            "client_id": "job", "token_endpoint_auth_method": "client_secret_jwt",
            "grant_types": ["client_credentials"], "scopes": ["reports.read"]})
        assert response.code == 201, body
        secret, created_tag = body["client_secret"], response.headers.getRawHeaders("etag")[0]
        assert len(secret) == 64 and "sealed_secret" not in body["client"]
        assert h.config.secret_keeper.secrets(await h.store.get_client("job"), h.now()) == (secret,)

        response, shown = await a.call("GET", "/api/admin/clients/job", headers=AUTH)
        assert response.code == 200, shown
        assert response.headers.getRawHeaders("etag") == [created_tag]
        assert shown["token_endpoint_auth_method"] == "client_secret_jwt" and "sealed_secret" not in shown

        response, body = await a.call("POST", "/api/admin/clients/job/secret", {"overlap": 60},
                                      headers={**JSON, "If-Match": created_tag})
        assert response.code == 200, body
        assert len(body["client_secret"]) == 64 and response.headers.getRawHeaders("etag")[0] != created_tag
        assert h.config.secret_keeper.secrets(await h.store.get_client("job"), h.now()) == (
            body["client_secret"], secret)
    finally:
        await h.close()


@pytest.mark.parametrize("body,field", [
    ({**NEW_CLIENT, "client_id": ""}, "client_id"),
    ({**NEW_CLIENT, "client_id": 5}, "client_id"),
    ({**NEW_CLIENT, "client_id": "crm/eu"}, "client_id"),
    ({**NEW_CLIENT, "client_id": ".."}, "client_id"),
    ({k: v for k, v in NEW_CLIENT.items() if k != "redirect_uris"}, "redirect_uris"),
    ({**NEW_CLIENT, "redirect_uris": []}, "redirect_uris"),
    ({**NEW_CLIENT, "redirect_uris": ["http://crm.example/cb"]}, "redirect_uris"),
    ({**NEW_CLIENT, "redirect_uris": "https://crm.example/cb"}, "redirect_uris"),
    ({**NEW_CLIENT, "backchannel_logout_uri": "https://169.254.169.254/logout"}, "backchannel_logout_uri"),
    ({**NEW_CLIENT, "first_party": "yes"}, "first_party"),
    ({**NEW_CLIENT, "grant_types": ["password"]}, "grant_types"),
    ({**NEW_CLIENT, "rate_limit": "fast"}, "rate_limit"),
    ({**NEW_CLIENT, "refresh_grace": -1}, "refresh_grace"),
    ({**NEW_CLIENT, "refresh_grace": "36500d"}, "refresh_grace"),
    ({**NEW_CLIENT, "refresh_grace": "99999999999999999999d"}, "refresh_grace"),
    ({**NEW_CLIENT, "name": "CRM\x00"}, "name"),
    ({**NEW_CLIENT, "name": "CRM\nsecond line"}, "name"),
    ({**NEW_CLIENT, "name": "\u202enim\u0434A"}, "name"),
    ({**NEW_CLIENT, "secret_hash": "x"}, "secret_hash"),
    ({**NEW_CLIENT, "post_logout_redirect_uris": ["https://crm.example/"]}, "end_session_enabled"),
    ({**NEW_CLIENT, "public": 1}, "public"),
])
@pytest_twisted.ensureDeferred
async def test_invalid_client_input_names_the_field(harness, body, field):
    a = await started(harness)
    try:
        response, answer = await a.call("POST", "/api/admin/clients", body)
        assert_problem(response, answer, 400, "invalid_request", field)
        assert await harness.store.get_client("crm") is None
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_client_that_requires_a_second_factor_is_made_and_changed(harness, audit):
    """require_mfa, which the answer shows, is set as the config file's [[clients]] sets it."""
    a = await started(harness)
    try:
        response, body = await a.call("POST", "/api/admin/clients", {**NEW_CLIENT, "require_mfa": True})
        assert response.code == 201 and body["client"]["require_mfa"] is True, body
        assert (await harness.store.get_client("crm")).require_mfa is True
        response, body = await a.call("PATCH", "/api/admin/clients/crm", {"require_mfa": False})
        assert response.code == 200 and body["require_mfa"] is False, body
        assert (await harness.store.get_client("crm")).require_mfa is False
        assert audit.of("client.changed")[0]["fields"] == ["require_mfa"]
        response, body = await a.call("PATCH", "/api/admin/clients/crm", {"require_mfa": "yes"})
        assert_problem(response, body, 400, "invalid_request", "require_mfa")
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_dpop_bound_clients_need_dpop_offered(tmp_path, monkeypatch):
    """Refused with the config file's words while [dpop] is off, made and changed once it is on."""
    bound = {**NEW_CLIENT, "dpop_bound_access_tokens": True}
    for folder, config in (("off", None), ("on", {"dpop": {"enabled": True}})):
        (tmp_path / folder).mkdir()
        h = Harness(tmp_path / folder, monkeypatch, config)
        a = await started(h)
        try:
            response, answer = await a.call("POST", "/api/admin/clients", bound)
            if config is None:
                assert_problem(response, answer, 400, "invalid_request", "dpop_bound_access_tokens")
                assert answer["message"] == "dpop_bound_access_tokens needs DPoP offered: set [dpop] enabled = true"
                assert await h.store.get_client("crm") is None
                response, answer = await a.call("POST", "/api/admin/clients", NEW_CLIENT)
                assert response.code == 201, answer
                response, answer = await a.call("PATCH", "/api/admin/clients/crm", {"dpop_bound_access_tokens": True})
                assert_problem(response, answer, 400, "invalid_request", "dpop_bound_access_tokens")
                assert (await h.store.get_client("crm")).dpop_bound_access_tokens is False
            else:
                assert response.code == 201 and answer["client"]["dpop_bound_access_tokens"] is True, answer
        finally:
            await h.close()


@pytest_twisted.ensureDeferred
async def test_malformed_bodies(harness):
    a = await started(harness)
    try:
        response, body = await a.call("POST", "/api/admin/clients", raw=b"{", headers=JSON)
        assert_problem(response, body, 400, "invalid_request")
        response, body = await a.call("POST", "/api/admin/clients", raw=b"[]", headers=JSON)
        assert_problem(response, body, 400, "invalid_request")
        response, body = await a.call("POST", "/api/admin/clients", NEW_CLIENT,
                                      headers={**AUTH, "Content-Type": "text/plain"})
        assert_problem(response, body, 415, "unsupported_media_type")
        response, body = await a.call("POST", "/api/admin/clients", raw=b"{" + b" " * 70_000 + b"}", headers=JSON)
        assert_problem(response, body, 413, "too_large")
        for path, raw in ((f"/api/admin/users/{BOB.sub}/ban", rb'{"reason": "\ud800"}'),
                          (f"/api/admin/users/{BOB.sub}/disable", rb'{"reason": "left \udfff"}'),
                          (f"/api/admin/users/{BOB.sub}/ban", b'{"reason": "\xed\xa0\x80"}'),
                          (f"/api/admin/users/{BOB.sub}/ban", b'{"reason": "\xff"}')):
            method = "PUT" if path.endswith("/ban") else "POST"
            response, body = await a.call(method, path, raw=raw, headers=JSON)
            assert_problem(response, body, 400, "invalid_request")
        response, body = await a.call("PUT", f"/api/admin/users/{BOB.sub}/ban", raw=rb'{"reason": "a\u0000b"}',
                                      headers=JSON)
        assert_problem(response, body, 400, "invalid_request", "reason")  # PostgreSQL text holds no NUL
        response, body = await a.call("GET", f"/api/admin/users/{BOB.sub}", headers=AUTH)
        assert body["ban"] is None and body["user"]["disabled"] is False
        for limit in ("500", "%C2%B2"):  # "²" is a digit to str.isdigit, and no number to int
            response, body = await a.call("GET", f"/api/admin/clients?limit={limit}", headers=AUTH)
            assert_problem(response, body, 400, "invalid_request", "limit")
        response, body = await a.call("GET", "/api/admin/clients?cursor=%%%", headers=AUTH)
        assert_problem(response, body, 400, "invalid_request", "cursor")
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_body_naming_a_field_twice_is_refused(harness, audit):
    """
    JSON leaves a repeated member name to the reader: Python keeps the
    last, a gateway or an audit proxy in front may check the first. A
    body naming a field twice was taken with its last value (a user made
    as "b" where "a" was checked); it is refused, as I-JSON says.
    """
    a = await started(harness)
    try:
        response, body = await a.call("POST", "/api/admin/users",
                                      raw=b'{"login": "a", "password": "correct horse", "login": "b"}')
        assert_problem(response, body, 400, "invalid_request")
        assert "'login' appears twice" in body["message"]
        assert await harness.identity.user_by_login("b") is None and not audit.of("user.created")
        response, body = await a.call("PUT", f"/api/admin/users/{BOB.sub}/ban",
                                      raw=b'{"reason": "x", "until": {"a": 1, "a": 2}}')
        assert_problem(response, body, 400, "invalid_request")
        assert not audit.of("user.banned")
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_conflicts(harness):
    a = await started(harness)
    try:
        assert (await a.call("POST", "/api/admin/clients", NEW_CLIENT))[0].code == 201
        response, body = await a.call("POST", "/api/admin/clients", NEW_CLIENT)
        assert_problem(response, body, 409, "conflict", "client_id")
        for method, path, payload in (("PATCH", "/api/admin/clients/first", {"name": "x"}),
                                      ("DELETE", "/api/admin/clients/first", None),
                                      ("POST", "/api/admin/clients/first/secret", None),
                                      ("POST", "/api/admin/clients", {**NEW_CLIENT, "client_id": "first"})):
            response, body = await a.call(method, path, payload)
            assert_problem(response, body, 409, "conflict", "client_id")
            assert "config file" in body["message"]
        await a.call("POST", "/api/admin/clients", {**NEW_CLIENT, "client_id": "pwa", "public": True})
        response, body = await a.call("POST", "/api/admin/clients/pwa/secret")
        assert_problem(response, body, 409, "conflict", "client_id")
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_clients_are_paged(harness):
    a = await started(harness)
    try:
        for n in range(5):
            await a.call("POST", "/api/admin/clients", {**NEW_CLIENT, "client_id": f"app-{n}"})
        seen, cursor = [], None
        while True:
            response, body = await a.call("GET", "/api/admin/clients?limit=3" + (f"&cursor={cursor}" if cursor else ""),
                                          headers=AUTH)
            assert response.code == 200 and len(body["clients"]) <= 3
            seen += [c["client_id"] for c in body["clients"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == sorted(["app-0", "app-1", "app-2", "app-3", "app-4", "first", "gateway", "partner", "spa"])
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_users_grants_are_paged_oldest_first(harness):
    """
    A user's grants (one per sign-in, over the years) were listed whole:
    they come a page at a time, continued with next_cursor, as clients and
    bans do, and a cursor this server did not give is a 400 naming it.
    """
    a = await started(harness)
    try:
        grants = [await start_grant(harness.store, f"g-{n}", sub=BOB.sub, client_id="first", created_at=at,
                                    expires_at=harness.now() + 3600)
                  for n, at in enumerate((harness.now(), harness.now() - 5, harness.now(), harness.now() - 5, 7))]
        path = f"/api/admin/users/{BOB.login}/grants"
        seen, cursor = [], None
        while True:
            response, body = await a.call("GET", f"{path}?limit=2" + (f"&cursor={cursor}" if cursor else ""),
                                          headers=AUTH)
            assert response.code == 200 and len(body["grants"]) <= 2 and body["sub"] == BOB.sub, body
            seen += [g["grant_id"] for g in body["grants"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == [g.grant_id for g in sorted(grants, key=lambda g: (g.created_at, g.grant_id))]
        for bad in ("%%%", encode_cursor("g-1"), encode_cursor("99999999999999999999 g-1"), encode_cursor("1x g")):
            response, body = await a.call("GET", f"{path}?cursor={bad}", headers=AUTH)
            assert_problem(response, body, 400, "invalid_request", "cursor")
            assert "next_cursor of the page before" in body["message"]
        response, body = await a.call("GET", f"{path}?cursor={encode_cursor(f'{harness.now()} g-0')}", headers=AUTH)
        assert [g["grant_id"] for g in body["grants"]] == ["g-2"] and body["next_cursor"] is None
        for query, field in (("limit=0", "limit"), ("limit=101", "limit"), ("limit=1&limit=2", "limit"),
                             (f"cursor={cursor}&cursor=x", "cursor")):
            for listing in (path, "/api/admin/clients", "/api/admin/bans"):
                response, body = await a.call("GET", f"{listing}?{query}", headers=AUTH)
                assert_problem(response, body, 400, "invalid_request", field)
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_users_sessions_are_paged_oldest_first_by_their_public_sid(harness):
    """
    A user's browser sessions (one per sign-in, in every browser) were
    listed whole: they come a page at a time as grants do, continued after
    the last (created_at, sid) shown; neither a page nor its cursor holds a
    session_hash (the hash a cookie is checked by).
    """
    a = await started(harness)
    try:
        now = harness.now()
        sessions = [BrowserSession(token_hash(f"cookie-{n}"), f"sid-{n}", BOB.sub, now, at, now + 3600)
                    for n, at in enumerate((now, now - 5, now, now - 5, 7))]
        for session in sessions:
            await harness.store.create_session(session)
        path = f"/api/admin/users/{BOB.login}/sessions"
        seen, cursors, cursor = [], [], None
        while True:
            response, body = await a.call("GET", f"{path}?limit=2" + (f"&cursor={cursor}" if cursor else ""),
                                          headers=AUTH)
            assert response.code == 200 and len(body["sessions"]) <= 2 and body["sub"] == BOB.sub, body
            assert not any("session_hash" in s for s in body["sessions"]), body
            seen += [s["sid"] for s in body["sessions"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
            cursors.append(decode_cursor(cursor))
        assert seen == [s.sid for s in sorted(sessions, key=lambda s: (s.created_at, s.sid))]
        assert not any(s.session_hash in key for s in sessions for key in cursors), cursors
        response, body = await a.call("GET", f"{path}?cursor={encode_cursor(f'{now} sid-0')}", headers=AUTH)
        assert [s["sid"] for s in body["sessions"]] == ["sid-2"] and body["next_cursor"] is None
        for query, field in (("cursor=%25%25", "cursor"), (f"cursor={encode_cursor('sid-1')}", "cursor"),
                             ("limit=0", "limit"), ("limit=101", "limit")):
            response, body = await a.call("GET", f"{path}?{query}", headers=AUTH)
            assert_problem(response, body, 400, "invalid_request", field)
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_limit_of_any_length_is_refused_by_name(harness):
    """A limit too long for int() (over 4300 digits) is a 400 naming it, never a 500."""
    a = await started(harness)
    try:
        for path in ("/api/admin/clients", "/api/admin/bans"):
            for limit in ("1" * 5000, "0" * 4999 + "7", "101", "1" * 30):
                response, body = await a.call("GET", f"{path}?limit={limit}", headers=AUTH)
                assert_problem(response, body, 400, "invalid_request", "limit")
            response, body = await a.call("GET", f"{path}?limit=007", headers=AUTH)
            assert response.code == 200, body
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_client_that_signs_with_its_keys_has_no_secret_to_rotate(harness, audit):
    """
    A private_key_jwt client has no secret (clientauth.auth_settings_problem):
    a rotation must not give it one, which no token request could use and
    which made every later change to it a 400 until it was deleted.
    """
    a = await started(harness)
    try:
        key = JWK.generate(kty="EC", crv="P-256")
        response, body = await a.call("POST", "/api/admin/clients", {
            **NEW_CLIENT, "token_endpoint_auth_method": "private_key_jwt",
            "jwks": {"keys": [json.loads(key.export_public())]},
        })
        assert response.code == 201 and body["client_secret"] is None, body
        before = await harness.store.get_client("crm")
        response, body = await a.call("POST", "/api/admin/clients/crm/secret", {"overlap": 0})
        assert_problem(response, body, 409, "conflict", "client_id")
        assert await harness.store.get_client("crm") == before
        assert not audit.of("client.secret_rotated")
        response, body = await a.call("PATCH", "/api/admin/clients/crm", {"name": "CRM"})
        assert response.code == 200 and body["name"] == "CRM", body
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_rotate_secret_with_an_overlap(harness, audit):
    a = await started(harness)
    try:
        _, created = await a.call("POST", "/api/admin/clients", NEW_CLIENT)
        response, body = await a.call("POST", "/api/admin/clients/crm/secret", {"overlap": "2h"})
        assert response.code == 200, body
        assert body["previous_secret_until"] == harness.now() + 7200
        assert body["client_secret"] != created["client_secret"]
        stored = await harness.store.get_client("crm")
        assert stored.previous_secret_hash == (await harness.store.get_client("crm")).previous_secret_hash
        assert audit.of("client.secret_rotated")[0]["previous_until"] == harness.now() + 7200

        response, body = await a.call("POST", "/api/admin/clients/crm/secret", headers=AUTH)
        assert body["previous_secret_until"] == harness.now() + 86400
        response, body = await a.call("POST", "/api/admin/clients/crm/secret", {"overlap": 0})
        assert body["previous_secret_until"] is None
        for bad in ({"overlap": "soon"}, {"overlap": -1}, {"overlap": 10**9}, {"until": 5}):
            response, answer = await a.call("POST", "/api/admin/clients/crm/secret", bad)
            assert_problem(response, answer, 400, "invalid_request", next(iter(bad)))
        response, body = await a.call("POST", "/api/admin/clients/nobody/secret")
        assert_problem(response, body, 404, "not_found", "client_id")
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_users_ban_unban_and_bans(harness, audit):
    a = await started(harness)
    try:
        response, body = await a.call("GET", f"/api/admin/users/{ALICE.login}", headers=AUTH)
        assert response.code == 200 and body["user"]["sub"] == ALICE.sub and body["ban"] is None
        response, body = await a.call("GET", "/api/admin/users/nobody", headers=AUTH)
        assert_problem(response, body, 404, "not_found", "user_id")

        await harness.store.create_session(BrowserSession(token_hash("c"), "sid-1", ALICE.sub, 0, harness.now(),
                                                          harness.now() + 3600))
        response, body = await a.call("PUT", f"/api/admin/users/{ALICE.sub}/ban",
                                      {"reason": "spam", "until": "2099-01-01T00:00:00Z"})
        assert response.code == 200, body
        assert body == {"sub": ALICE.sub, "until": 4070908800, "sessions_ended": 1}
        assert [s.sid for s in a.ended] == ["sid-1"]
        response, body = await a.call("GET", f"/api/admin/users/{ALICE.sub}", headers=AUTH)
        assert body["ban"]["reason"] == "spam"
        response, body = await a.call("GET", "/api/admin/bans", headers=AUTH)
        assert [b["sub"] for b in body["bans"]] == [ALICE.sub] and body["next_cursor"] is None

        for bad, field in (({"until": None}, "reason"), ({"reason": "x", "until": "2000-01-01T00:00:00Z"}, "until"),
                           ({"reason": "x", "until": "tomorrow"}, "until"), ({"reason": "x", "for": "1d"}, "for")):
            response, answer = await a.call("PUT", f"/api/admin/users/{BOB.sub}/ban", bad)
            assert_problem(response, answer, 400, "invalid_request", field)

        response, body = await a.call("DELETE", f"/api/admin/users/{ALICE.sub}/ban", headers=AUTH)
        assert response.code == 204
        response, body = await a.call("DELETE", f"/api/admin/users/{ALICE.sub}/ban", headers=AUTH)
        assert_problem(response, body, 404, "not_found", "user_id")
        assert audit.of("user.banned")[0]["actor"] == ACTOR and audit.of("user.unbanned")[0]["actor"] == ACTOR
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_grants_sessions_and_consents(harness, audit):
    a = await started(harness)
    try:
        grant = await give_grant(harness, BOB.sub)
        await harness.store.save_consent(BOB.sub, "first", {"openid"}, harness.now())
        await harness.store.create_session(BrowserSession(token_hash("c"), "sid-b", BOB.sub, 0, harness.now(),
                                                          harness.now() + 3600))
        _, body = await a.call("GET", f"/api/admin/users/{BOB.login}/grants", headers=AUTH)
        assert [g["grant_id"] for g in body["grants"]] == [grant.grant_id] and body["sub"] == BOB.sub
        _, body = await a.call("GET", f"/api/admin/users/{BOB.sub}/sessions", headers=AUTH)
        assert [s["sid"] for s in body["sessions"]] == ["sid-b"] and "session_hash" not in body["sessions"][0]
        _, body = await a.call("GET", f"/api/admin/users/{BOB.sub}/consents", headers=AUTH)
        assert body["consents"] == [{"client_id": "first", "scope": ["openid"], "created_at": harness.now()}]

        _, body = await a.call("DELETE", f"/api/admin/users/{BOB.sub}/consents", headers=AUTH)
        assert body == {"sub": BOB.sub, "revoked": 1}
        _, body = await a.call("DELETE", f"/api/admin/users/{BOB.sub}/sessions", headers=AUTH)
        assert body == {"sub": BOB.sub, "ended": 1}
        await harness.store.enrol_totp(BOB.sub, b"sealed-secret", 1, harness.now())
        _, body = await a.call("DELETE", f"/api/admin/users/{BOB.sub}/factors", headers=AUTH)
        assert body == {"sub": BOB.sub, "removed": True}
        assert await harness.store.list_factors(BOB.sub) == []
        assert audit.of("mfa.reset")[-1]["actor"] == ACTOR
        _, body = await a.call("DELETE", f"/api/admin/users/{BOB.sub}/grants", headers=AUTH)
        assert body == {"sub": BOB.sub, "revoked": 1, "sessions_ended": 0}
        _, body = await a.call("GET", f"/api/admin/users/{BOB.sub}/grants", headers=AUTH)
        assert body["grants"] == []
        for kind in ("user.consents_revoked", "user.sessions_ended", "user.grants_revoked"):
            assert audit.of(kind)[0]["actor"] == ACTOR
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_users_of_the_writable_backend(harness, audit):
    a = await started(harness)
    try:
        response, body = await a.call("POST", "/api/admin/users", {"login": "carol", "password": "correct horse",
                                                                   "email": "carol@example.test"})
        assert response.code == 201, body
        sub = body["user"]["sub"]
        response, body = await a.call("POST", "/api/admin/users", {"login": "carol", "password": "another one"})
        assert_problem(response, body, 409, "conflict", "login")
        for bad, field in (({"login": "dave"}, "password"), ({"password": "x"}, "login"),
                           ({"login": "dave", "password": "x", "email": "nope"}, "email"),
                           ({"login": "dave", "password": "x", "picture": "data:image/png;base64,AAAA"}, "picture"),
                           ({"login": "dave", "password": "x", "picture": "https://cdn.example/" + "a" * 3000},
                            "picture"),
                           ({"login": "dave", "password": "x", "admin": True}, "admin")):
            response, answer = await a.call("POST", "/api/admin/users", bad)
            assert_problem(response, answer, 400, "invalid_request", field)

        response, _ = await a.call("PUT", f"/api/admin/users/{sub}/password", {"password": "battery staple"})
        assert response.code == 204
        response, body = await a.call("PUT", "/api/admin/users/carol/password", {"password": ""})
        assert_problem(response, body, 400, "invalid_request", "password")
        response, body = await a.call("POST", "/api/admin/users/carol/disable", {"reason": "left"})
        assert body == {"sub": sub, "disabled": True, "sessions_ended": 0}
        assert (await harness.identity.user_by_id(sub)).disabled
        response, body = await a.call("POST", "/api/admin/users/carol/enable", headers=AUTH)
        assert body == {"sub": sub, "disabled": False}
        response, _ = await a.call("DELETE", "/api/admin/users/carol", headers=AUTH)
        assert response.code == 204
        assert await harness.identity.user_by_id(sub) is None
        kinds = ["user.created", "user.password_set", "user.disabled", "user.enabled", "user.deleted"]
        assert [e["event"] for e in audit if e.get("event") in kinds] == kinds
        assert audit.of("user.deleted")[0]["actor"] == ACTOR
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_user_made_again_under_a_removed_ones_sub_inherits_no_consent_nor_factor(harness, audit):
    """
    A removed user's consents and second factors go with them, as a removed
    client's consents do: a user the operator makes again under that sub
    asks for consent again, and no passkey or authenticator of the removed
    one signs them in.
    """
    a = await started(harness)
    try:
        carol = {"login": "carol", "sub": "carol-1", "password": "correct horse"}
        response, body = await a.call("POST", "/api/admin/users", carol)
        assert response.code == 201, body
        store, now = harness.store, harness.now()
        await store.save_consent("carol-1", "partner", frozenset({"openid"}), now)
        await store.enrol_totp("carol-1", b"sealed", 30, now)
        await store.add_passkey(Passkey("cred-c", "carol-1", b"cose-key", 1, False, False, ("internal",), now))
        response, _ = await a.call("DELETE", "/api/admin/users/carol", headers=AUTH)
        assert response.code == 204
        response, body = await a.call("POST", "/api/admin/users", {**carol, "password": "battery staple"})
        assert response.code == 201, body
        assert await store.get_consent("carol-1", "partner") is None
        assert await store.list_factors("carol-1") == []
        assert await store.get_passkey("cred-c") is None
        assert [e["actor"] for e in audit.of("user.consents_revoked")] == [ACTOR]
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_disabling_a_user_ends_their_sessions_and_tells_their_clients(harness, audit):
    """
    A disabled user counts as banned (docs/design.md, Bans): as a ban, the
    disable ends their browser sessions at once and their clients hear of it
    by back-channel logout; the other users' sessions stay.
    """
    a = await started(harness)
    try:
        for cookie, sid, sub in (("b1", "sid-b1", BOB.sub), ("b2", "sid-b2", BOB.sub), ("a1", "sid-a1", ALICE.sub)):
            await harness.store.create_session(BrowserSession(token_hash(cookie), sid, sub, 0, harness.now(),
                                                              harness.now() + 3600))
        response, body = await a.call("POST", f"/api/admin/users/{BOB.sub}/disable", {"reason": "left"})
        assert response.code == 200, body
        assert body == {"sub": BOB.sub, "disabled": True, "sessions_ended": 2}
        assert sorted(s.sid for s in a.ended) == ["sid-b1", "sid-b2"]
        assert await harness.store.list_user_sessions(BOB.sub, harness.now()) == []
        assert [s.sid for s in await harness.store.list_user_sessions(ALICE.sub, harness.now())] == ["sid-a1"]
        assert sorted(e["session_id"] for e in audit.of("session.ended")) == ["sid-b1", "sid-b2"]
        assert audit.of("user.disabled")[0]["actor"] == ACTOR

        response, body = await a.call("POST", f"/api/admin/users/{BOB.sub}/enable", headers=AUTH)
        assert body == {"sub": BOB.sub, "disabled": False}
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_password_set_by_the_operator_ends_the_users_sessions_and_tells_their_clients(harness, audit):
    """
    A password the operator sets (a forgotten or stolen one) ends every
    browser session signed in with the old one, as a change on the account
    page ends the user's other sessions, and their clients hear of it by
    back-channel logout; the other users' sessions stay.
    """
    a = await started(harness)
    try:
        for cookie, sid, sub in (("b1", "sid-b1", BOB.sub), ("b2", "sid-b2", BOB.sub), ("a1", "sid-a1", ALICE.sub)):
            await harness.store.create_session(BrowserSession(token_hash(cookie), sid, sub, 0, harness.now(),
                                                              harness.now() + 3600))
        response, _ = await a.call("PUT", f"/api/admin/users/{BOB.sub}/password", {"password": "battery staple"})
        assert response.code == 204
        assert sorted(s.sid for s in a.ended) == ["sid-b1", "sid-b2"]
        assert await harness.store.list_user_sessions(BOB.sub, harness.now()) == []
        assert [s.sid for s in await harness.store.list_user_sessions(ALICE.sub, harness.now())] == ["sid-a1"]
        assert sorted(e["session_id"] for e in audit.of("session.ended")) == ["sid-b1", "sid-b2"]
        assert audit.of("user.password_set")[0]["actor"] == ACTOR
    finally:
        await harness.close()


async def _until(predicate, what: str) -> None:
    """Let real connections and the store's threads run until C{predicate()}."""
    for _ in range(3000):
        if predicate():
            return
        await deferLater(reactor, 0.001, lambda: None)
    raise AssertionError(f"never happened: {what}")


@pytest.mark.parametrize(("method", "path", "body"), [
    ("PUT", "/ban", {"reason": "spam"}),
    ("POST", "/disable", {"reason": "left"}),
    ("DELETE", "/sessions", None),
    ("DELETE", "/grants", None),
])
@pytest_twisted.ensureDeferred
async def test_a_hanging_relying_party_does_not_hold_the_answer(harness, audit, method, path, body):
    """
    The user's sessions end in the store before the answer, and their
    back-channel logouts go on after it, bounded as ever: a relying party
    that takes the connection and never answers (on 127.0.0.1, with time
    frozen on the harness's Clock) used to hold the operator's answer for
    every retry and timeout, up to ~21 s. The delivery still happens.
    """
    rp = FakeRelyingParty([HANG])
    port = reactor.listenTCP(0, Site(rp), interface="127.0.0.1")
    clock = harness.clock
    notifier = BackchannelNotifier(clock, lambda address: HTTPClient(
        Agent.usingEndpointFactory(reactor, PinnedEndpoints(reactor, address, clock=clock))))
    await harness.start()
    a = Admin(harness, lambda session: notifier.session_ended(harness.store, harness.keystore, ISSUER, session))
    try:
        await harness.store.put_client(Client(
            "rp", None, ["http://127.0.0.1:9/cb"],
            backchannel_logout_uri=f"http://127.0.0.1:{port.getHost().port}/backchannel",
        ))
        await start_grant(harness.store, "g-rp", BOB.sub, "rp", sid="sid-9")
        now = harness.now()
        session = BrowserSession(token_hash("cookie"), "sid-9", BOB.sub, now, now, now + 3600)
        await harness.store.create_session(session)

        response, answer = await a.call(method, f"/api/admin/users/{BOB.sub}{path}", body,
                                        headers=JSON if body is not None else AUTH)
        assert response.code == 200, answer
        assert await harness.store.get_session(session.session_hash, harness.now()) is None
        await _until(lambda: rp.held, "the delivery reaching the relying party")
        assert not audit.of("logout.backchannel")

        [held] = rp.held
        held.setResponseCode(200)
        held.finish()
        await _until(lambda: audit.of("logout.backchannel"), "the delivery ending")
        [delivered] = audit.of("logout.backchannel")
        assert (delivered["client_id"], delivered["session_id"]) == ("rp", "sid-9")
        assert delivered["outcome"] == "delivered (HTTP 200) at attempt 1"
        assert rp.tokens() and len(rp.received) == 1
    finally:
        await port.stopListening()
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_new_user_is_one_the_api_can_name_in_its_path(harness):
    """
    The admin API names a user by sub or login in one path segment, from
    which clients and proxies remove a '.' or '..': a user made with one
    could be neither shown, banned, disabled nor deleted here, so it is
    refused by name. What it accepts, a '/' too (sent as %2F), its
    Location finds.
    """
    a = await started(harness)
    try:
        for fields, field in (({"login": ".."}, "login"), ({"login": "."}, "login"),
                              ({"login": "carol", "sub": ".."}, "sub")):
            response, body = await a.call("POST", "/api/admin/users", {**fields, "password": "correct horse"})
            assert_problem(response, body, 400, "invalid_request", field)
        assert await harness.identity.user_by_login("carol") is None

        response, body = await a.call("POST", "/api/admin/users",
                                      {"login": "carol.o'neil+ops", "sub": "tenant:carol?x#y%2F", "password": "correct horse"})
        assert response.code == 201, body
        [location] = response.headers.getRawHeaders("location")
        response, body = await a.call("GET", location, headers=AUTH)
        assert response.code == 200 and body["user"]["login"] == "carol.o'neil+ops", body
        response, body = await a.call("DELETE", location, headers=AUTH)
        assert response.code == 204, body

        response, body = await a.call("POST", "/api/admin/users",
                                      {"login": "ops/dave", "sub": "tenant/dave", "password": "correct horse"})
        assert response.code == 201, body
        [location] = response.headers.getRawHeaders("location")
        assert location == "/api/admin/users/tenant%2Fdave"
        response, body = await a.call("GET", location, headers=AUTH)
        assert response.code == 200 and body["user"]["login"] == "ops/dave", body
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_user_whose_id_holds_a_slash_is_named_with_percent_2f(harness, tmp_path, audit):
    """
    LDAP, PostgreSQL and the users file may hold a user whose sub or login
    holds '/'. twisted.web decodes each path segment before Klein routes,
    so a %2F became a separator: such a user could not be reached, and a
    DELETE of user "<bob>/grants" revoked Bob's grants instead. Routes now
    match the segments as sent and decode their own; an encoded '/' or '..'
    never changes which route answers.
    """
    add_user(tmp_path / "users.toml", login="ops/carol", sub="tenant/carol",
             password_hash=hash_password("correct horse", CHEAP))
    add_user(tmp_path / "users.toml", login="bob-grants", sub=f"{BOB.sub}/grants",
             password_hash=hash_password("correct horse", CHEAP))
    await harness.users_reread()
    a = await started(harness)
    try:
        for name in ("tenant%2Fcarol", "tenant%2fcarol", "ops%2Fcarol"):
            response, body = await a.call("GET", f"/api/admin/users/{name}", headers=AUTH)
            assert response.code == 200 and body["user"]["sub"] == "tenant/carol", (name, body)
        response, body = await a.call("PUT", "/api/admin/users/tenant%2Fcarol/ban", {"reason": "spam"})
        assert response.code == 200 and body["sub"] == "tenant/carol", body
        assert (await harness.store.get_ban("tenant/carol", harness.now())).reason == "spam"
        response, body = await a.call("GET", "/api/admin/bans", headers=AUTH)
        assert [b["sub"] for b in body["bans"]] == ["tenant/carol"]

        grant = await give_grant(harness, BOB.sub)
        response, body = await a.call("DELETE", f"/api/admin/users/{BOB.sub}%2Fgrants", headers=AUTH)
        assert response.code == 204, body
        assert await harness.identity.user_by_id(f"{BOB.sub}/grants") is None
        assert [g.grant_id for g in await harness.store.list_user_grants(BOB.sub, harness.now())] == [grant.grant_id]
        assert [e["sub"] for e in audit.of("user.grants_revoked")] == [f"{BOB.sub}/grants"]

        for name in ("tenant%2F..%2F..%2Fclients", "%2E%2E", "tenant%2Fcarol%2Fban", "tenant/carol"):
            response, body = await a.call("GET", f"/api/admin/users/{name}", headers=AUTH)
            assert response.code == 404 and body["error"] == "not_found", (name, body)
        response, body = await a.call("GET", "/api/admin/users/tenant%2F..%2F..%2Fclients", headers=AUTH)
        assert_problem(response, body, 404, "not_found", "user_id")
    finally:
        await harness.close()


@pytest.mark.parametrize(("fields", "field"), [
    ({"login": "eve\u0000"}, "login"),
    ({"login": "eve\nroot"}, "login"),
    ({"login": "\u202eeve"}, "login"),
    ({"login": "e" * 257}, "login"),
    ({"name": "Eve\u202egnp.exe"}, "name"),
    ({"name": "E" * 257}, "name"),
    ({"email": "eve@example.com\r\nBcc: all@example.com"}, "email"),
    ({"email": "e" * 250 + "@example.com"}, "email"),
    ({"chat_user_id": "1759\n28847"}, "chat_user_id"),
    ({"chat_user_id": "1" * 257}, "chat_user_id"),
])
@pytest_twisted.ensureDeferred
async def test_a_new_users_text_with_control_characters_or_too_long_is_refused_by_name(harness, audit, fields,
                                                                                       field):
    """
    A login, name, email or chat id goes into the users file, every ID
    token and UserInfo answer, the operator's terminal (user list) and the
    consent page: a NUL (which PostgreSQL cannot hold), a line break or a
    bidi override, or 60,000 characters, were all taken. Refused by name,
    as a client's name and a ban's reason are.
    """
    a = await started(harness)
    try:
        response, body = await a.call("POST", "/api/admin/users",
                                      {"login": "eve", "password": "correct horse", **fields})
        assert_problem(response, body, 400, "invalid_request", field)
        assert await harness.identity.user_by_login("eve") is None and not audit.of("user.created")
        response, body = await a.call("POST", "/api/admin/users", {
            "login": "e" * 256, "name": "Zoë 👩\u200d💻 " + "E" * 240, "email": "eve@example.com",
            "chat_user_id": "175928847299117063", "password": "correct horse"})
        assert response.code == 201, body
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_new_login_in_compatibility_forms_is_refused_naming_its_plain_form(harness, audit):
    """
    Sign-in reads full-width and half-width forms as their plain ones (RFC
    8265 width mapping): a new 'ａｌｉｃｅ' would be a look-alike of alice,
    and a new 'ｃａｒｏｌ' one that sign-in never finds as given. Other
    compatibility forms (a ligature, a font or circled letter) a PRECIS
    username may not hold. Refused, saying what to give instead; the plain
    login is then taken.
    """
    a = await started(harness)
    try:
        for login, plain in (("ｃａｒｏｌ", "carol"), ("ｶﾞｸ", "ガク"), ("ﬁona", "fiona"),
                             ("ℌenry", "Henry"), ("ⓒarol", "carol")):
            response, body = await a.call("POST", "/api/admin/users", {"login": login, "password": "correct horse"})
            assert_problem(response, body, 400, "invalid_request", "login")
            assert f"give it as {plain!r}" in body["message"]
        assert not audit.of("user.created")
        response, body = await a.call("POST", "/api/admin/users", {"login": "carol", "password": "correct horse"})
        assert response.code == 201, body
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_new_login_that_looks_like_an_existing_one_is_a_conflict(harness, audit):
    """
    A new login the same as an existing user's once NFKC case-folded
    ('ａｌｉｃｅ' beside alice, 'ℬob' beside Bob, 'ⓞffice' beside office)
    was refused only as holding compatibility forms, as if 'alice' were
    free to give instead: it is a 409 naming the user it looks like. The
    users who have those logins keep them (signing in as before:
    flows/test_login_consent.py).
    """
    a = await started(harness)
    try:
        response, _ = await a.call("POST", "/api/admin/users", {"login": "office", "password": "correct horse"})
        office = await harness.identity.user_by_login("office")
        for login, existing in (("ａｌｉｃｅ", ALICE), ("ＡＬＩＣＥ", ALICE), ("ａlice", ALICE), ("ℬob", BOB),
                                ("ｂｏｂ", BOB), ("ⓞffice", office), ("ºffice", office)):
            response, body = await a.call("POST", "/api/admin/users", {"login": login, "password": "correct horse"})
            assert_problem(response, body, 409, "conflict", "login")
            assert f"looks like {existing.login!r}, the login of user {existing.sub}" in body["message"], body
            assert "NFKC case-folded" in body["message"]
        assert [e["login"] for e in audit.of("user.created")] == ["office"]
        for login in ("ALICE", "alice"):
            response, body = await a.call("POST", "/api/admin/users", {"login": login, "password": "correct horse"})
            assert_problem(response, body, 409, "conflict", "login")
            assert body["message"] == f"login 'alice' is already taken by user {ALICE.sub!r}"
        assert (await harness.identity.user_by_login("alice")).sub == ALICE.sub
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_new_user_may_not_take_a_name_that_finds_another(harness, audit):
    """
    The admin API and command find a user by id or, failing that, login: a
    new user whose sub is another's login would take that login's place
    (a ban of "bob" would ban the newcomer), and one whose login is
    another's sub could not be found by it. Both are refused.
    """
    a = await started(harness)
    try:
        for fields, field in (({"login": "carol", "sub": BOB.login.lower()}, "sub"),
                              ({"login": "carol", "sub": BOB.login.upper()}, "sub"),
                              ({"login": BOB.sub}, "login")):
            response, body = await a.call("POST", "/api/admin/users", {**fields, "password": "correct horse"})
            assert_problem(response, body, 409, "conflict", field)
        assert await harness.identity.user_by_login("carol") is None and not audit.of("user.created")
        response, body = await a.call("GET", f"/api/admin/users/{BOB.login.lower()}", headers=AUTH)
        assert body["user"]["sub"] == BOB.sub
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_field_a_user_change_does_not_know_is_refused_by_name(harness, audit):
    """
    As a ban refuses a field it does not know, so do disable, enable and a
    new password: a disable sent with an "until" must not disable for good
    in silence, nor a password with "temporary" set a lasting one.
    """
    a = await started(harness)
    try:
        for method, path, body, field in (
            ("POST", "disable", {"reason": "on leave", "until": "2099-01-01T00:00:00Z"}, "until"),
            ("POST", "enable", {"reason": "back"}, "reason"),
            ("PUT", "password", {"password": "battery staple", "temporary": True}, "temporary"),
        ):
            response, answer = await a.call(method, f"/api/admin/users/{BOB.sub}/{path}", body)
            assert_problem(response, answer, 400, "invalid_request", field)
        user = await harness.identity.user_by_id(BOB.sub)
        assert not user.disabled
        assert not audit.of("user.disabled") and not audit.of("user.enabled") and not audit.of("user.password_set")
    finally:
        await harness.close()


@pytest.mark.parametrize(("method", "path", "body", "write"), [
    ("DELETE", "", None, "remove_user"),
    ("PUT", "/password", {"password": "battery staple"}, "set_password_hash"),
    ("POST", "/disable", {"reason": "left"}, "set_disabled"),
    ("POST", "/enable", None, "set_disabled"),
])
@pytest_twisted.ensureDeferred
async def test_a_user_removed_while_a_change_is_made_is_not_found(harness, monkeypatch, method, path, body, write):
    """
    Two operators at once: the user is removed (by the other delete) between
    this request's lookup and its write. The write finds no user: a 404,
    never a 500.
    """
    a = await started(harness)
    try:
        response, created = await a.call("POST", "/api/admin/users", {"login": "carol", "password": "correct horse"})
        assert response.code == 201, created
        written = getattr(harness.identity, write)

        async def after_the_other_delete(login, *args):
            monkeypatch.setattr(harness.identity, write, written)
            response, _ = await a.call("DELETE", "/api/admin/users/carol", headers=AUTH)
            assert response.code == 204
            return await written(login, *args)

        monkeypatch.setattr(harness.identity, write, after_the_other_delete)
        response, answer = await a.call(method, f"/api/admin/users/carol{path}", body,
                                        headers=JSON if body is not None else AUTH)
        assert_problem(response, answer, 404, "not_found", "user_id")
        assert await harness.identity.user_by_login("carol") is None
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_new_user_may_not_claim_a_chat_account_linked_to_another(harness):
    """Two users whose chat_user_id names one chat account would confuse the services mapping chat users."""
    a = await started(harness)
    try:
        await harness.store.link_account(LinkedAccount(
            account_id="acct-bob", sub=BOB.sub, provider="discord", provider_user_id="175928847299117063",
            access_token_enc=b"sealed", refresh_token_enc=None, scope="identify", expires_at=0, updated_at=0,
        ))
        response, body = await a.call("POST", "/api/admin/users", {"login": "carol", "password": "correct horse",
                                                                   "chat_user_id": "175928847299117063"})
        assert_problem(response, body, 409, "conflict", "chat_user_id")
        assert "already linked to user" in body["message"] and "unlink it there first" in body["message"]
        assert await harness.identity.user_by_login("carol") is None
        response, body = await a.call("POST", "/api/admin/users", {"login": "carol", "password": "correct horse",
                                                                   "chat_user_id": "999"})
        assert response.code == 201 and body["user"]["chat_user_id"] == "999", body
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_a_removed_users_chat_account_may_be_linked_again(harness):
    """No one can unlink the link of a removed user: it goes with them, or its chat account stays refused to all."""
    a = await started(harness)
    try:
        response, body = await a.call("POST", "/api/admin/users", {"login": "carol", "password": "correct horse"})
        sub = body["user"]["sub"]
        await harness.store.link_account(LinkedAccount(
            account_id="acct-carol", sub=sub, provider="discord", provider_user_id="175928847299117063",
            access_token_enc=b"sealed", refresh_token_enc=None, scope="identify", expires_at=0, updated_at=0,
        ))
        response, _ = await a.call("DELETE", "/api/admin/users/carol", headers=AUTH)
        assert response.code == 204
        assert await harness.store.get_linked_account(sub, "discord") is None
        response, body = await a.call("POST", "/api/admin/users", {"login": "dave", "password": "correct horse",
                                                                   "chat_user_id": "175928847299117063"})
        assert response.code == 201, body
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_keys_list_and_rotate(harness, audit):
    a = await started(harness)
    try:
        _, body = await a.call("GET", "/api/admin/keys", headers=AUTH)
        states = {(k["alg"], k["state"]) for k in body["keys"]}
        assert ("RS256", "active") in states and ("RS256", "next") in states
        harness.clock.advance(JWKS_MAX_AGE)
        response, body = await a.call("POST", "/api/admin/keys/rotate", headers=AUTH)
        assert response.code == 200, body
        assert body["rotated"] is True and "note" not in body
        response, body = await a.call("POST", "/api/admin/keys/rotate", headers=AUTH)
        assert_problem(response, body, 409, "conflict")
        response, body = await a.call("POST", "/api/admin/keys/rotate", {"force": "yes"})
        assert_problem(response, body, 400, "invalid_request", "force")
        response, body = await a.call("POST", "/api/admin/keys/rotate", {"force": True})
        assert response.code == 200
        assert [e["actor"] for e in audit.of("key.rotated")] == [ACTOR, ACTOR]
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_keys_rotate_says_it_adopted_another_process_rotation(harness, tmp_path, audit):
    """
    The operator command rotated just before this server, not yet reloaded,
    was asked to: it adopts that rotation and says so, so the operator who
    wanted one more knows to ask again.
    """
    a = await started(harness)
    try:
        harness.clock.advance(JWKS_MAX_AGE)
        other = jwkfile.from_config(Section({"algorithms": list(harness.keystore.algorithms)}, "keystore", tmp_path),
                                    harness.context)
        await other.rotate(int(harness.clock.seconds()))
        response, body = await a.call("POST", "/api/admin/keys/rotate", {"force": True})
        assert response.code == 200, body
        assert body["rotated"] is False
        assert body["note"] == ADOPTED
        assert sorted(k["kid"] for k in body["keys"]) == sorted(k.kid for k in other.keys())
        response, body = await a.call("POST", "/api/admin/keys/rotate", {"force": True})
        assert body["rotated"] is True and "note" not in body
        assert [e["actor"] for e in audit.of("key.rotated")][-1] == ACTOR
    finally:
        await harness.close()


@pytest_twisted.ensureDeferred
async def test_mallory_disabled_in_the_file_shows_as_disabled(harness):
    a = await started(harness)
    try:
        _, body = await a.call("GET", f"/api/admin/users/{MALLORY.login}", headers=AUTH)
        assert body["user"]["disabled"] is True and body["user"]["disabled_reason"] == MALLORY.disabled_reason
    finally:
        await harness.close()


STRONG = "admin-config-secret-Lq8Vz3Kp6Wn2Xr9Ty5"


@pytest.mark.parametrize("section,key,problem", [
    ({"secret_env": "AUTHSRV_TEST_ADMIN"}, "admin.listen", "would be served nowhere"),
    ({"secret_env": "AUTHSRV_TEST_SAME", "serve_on_main": True}, "admin.secret_env", "must differ from the internal"),
    ({"secret_env": "AUTHSRV_TEST_ADMIN", "serve_on_main": True, "name": "a\tb"}, "admin.name", "printable"),
    ({"secret_env": "AUTHSRV_TEST_ADMIN", "serve_on_main": True, "port": 1}, "admin.port", ""),
])
def test_admin_config_is_checked(monkeypatch, section, key, problem):
    from authsrv.config import parse_config
    from authsrv.configsection import ConfigError

    monkeypatch.setenv("AUTHSRV_TEST_ADMIN", STRONG)
    monkeypatch.setenv("AUTHSRV_TEST_SAME", INTERNAL_SECRET)
    monkeypatch.setenv("AUTHSRV_TEST_INTERNAL", INTERNAL_SECRET)
    with pytest.raises(ConfigError) as raised:
        parse_config({"internal": {"secret_env": "AUTHSRV_TEST_INTERNAL"}, "admin": section}, None)
    assert key in str(raised.value) and problem in str(raised.value)


def test_every_admin_config_mistake_is_named_at_once(monkeypatch):
    """A secret that cannot be read leaves the section's other keys checked, as every other section does."""
    from authsrv.config import ConfigErrors, parse_config

    with pytest.raises(ConfigErrors) as raised:
        parse_config({"admin": {"secret_env": "AUTHSRV_TEST_UNSET_ADMIN", "name": "", "port": 1}}, None)
    assert [e.key for e in raised.value.errors] == ["admin.secret_env", "admin.name", "admin.port"]


def test_admin_config_defaults(monkeypatch):
    from authsrv.config import parse_config

    assert parse_config({}, None).admin.secret is None
    monkeypatch.setenv("AUTHSRV_TEST_ADMIN", STRONG)
    admin = parse_config({"internal": {"listen": ["tcp:0"]}, "admin": {"secret_env": "AUTHSRV_TEST_ADMIN"}}, None).admin
    assert (admin.secret, admin.name, admin.listen, admin.serve_on_main) == (STRONG, "admin-api", (), False)


@pytest_twisted.ensureDeferred
async def test_names_in_any_script_with_any_space_are_kept(harness):
    """Only control characters are refused in a name: no-break and ideographic spaces and joiners are text."""
    a = await started(harness)
    try:
        for n, name in enumerate(("Acme\u00a0Corp", "\u682a\u5f0f\u4f1a\u793e\u3000\u30c6\u30b9\u30c8",
                                  "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",
                                  "\U0001F468\u200d\U0001F469\u200d\U0001F467")):
            response, answer = await a.call("POST", "/api/admin/clients", {**NEW_CLIENT, "client_id": f"c{n}",
                                                                           "name": name})
            assert response.code == 201, answer
            assert (await harness.store.get_client(f"c{n}")).name == name
    finally:
        await harness.close()
