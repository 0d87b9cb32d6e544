"""
The HTTP surface of the foundation, in memory through StubTreq: discovery,
JWKS, the root redirect, health, and the error answers around them.
"""

from __future__ import annotations

import gc
import json
from types import SimpleNamespace

import pytest
import pytest_twisted
from treq.testing import StubTreq
from twisted.internet.defer import CancelledError, Deferred, fail
from twisted.internet.task import Clock
from twisted.logger import capturedLogs, formatEvent


from authsrv.config import parse_config
from authsrv.flows.readiness import Readiness
from authsrv.service import web_root

from fakes import FakeIdentity, FakeKeystore, FakeStore, no_password_hashes
from harness import BASE as BASE_OF_HARNESS, Harness

BASE = "https://auth.example.com"
ISSUER = BASE + "/api/auth"


@pytest.fixture
def server():
    class Server:
        clock = Clock()
        store = FakeStore()
        keystore = FakeKeystore()
        problem = None

    config = parse_config({"server": {"public_url": BASE}}, None)
    server = Server()
    root = web_root(config, server.clock, server.store, server.keystore, FakeIdentity(), lambda: server.problem,
                    hash_password=no_password_hashes)
    server.http = StubTreq(root)
    return server


def result(d):
    results = []
    d.addBoth(results.append)
    assert results, "the request did not finish"
    if hasattr(results[0], "raiseException"):
        results[0].raiseException()
    return results[0]


def get(server, path, method="GET", **kwargs):
    response = result(server.http.request(method, BASE + path, **kwargs))
    body = result(response.content())
    return response, body


def test_discovery_lists_every_endpoint_and_what_is_supported(server):
    response, body = get(server, "/api/auth/.well-known/openid-configuration")
    assert response.code == 200
    assert response.headers.getRawHeaders("content-type") == ["application/json"]
    doc = json.loads(body)
    assert doc["issuer"] == ISSUER
    assert doc["authorization_endpoint"] == ISSUER + "/oauth2/authorize"
    assert doc["token_endpoint"] == ISSUER + "/oauth2/token"
    assert doc["userinfo_endpoint"] == ISSUER + "/oauth2/userinfo"
    assert doc["jwks_uri"] == ISSUER + "/jwks"
    assert doc["end_session_endpoint"] == ISSUER + "/oauth2/end-session"
    assert doc["revocation_endpoint"] == ISSUER + "/oauth2/revoke"
    assert doc["introspection_endpoint"] == ISSUER + "/oauth2/introspect"
    assert doc["response_types_supported"] == ["code"]
    assert doc["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert doc["code_challenge_methods_supported"] == ["S256"]
    assert doc["scopes_supported"] == ["openid", "profile", "email", "offline_access"]
    assert {"sub", "name", "picture", "email", "email_verified", "chat_user_id"} <= set(doc["claims_supported"])
    assert doc["token_endpoint_auth_methods_supported"] == ["client_secret_basic", "client_secret_post", "none"]
    assert doc["id_token_signing_alg_values_supported"] == ["RS256", "ES256"]
    assert doc["subject_types_supported"] == ["public"]
    assert doc["authorization_response_iss_parameter_supported"] is True


def test_oauth_metadata_matches_discovery(server):
    _, oidc = get(server, "/api/auth/.well-known/openid-configuration")
    response, body = get(server, "/api/auth/.well-known/oauth-authorization-server")
    assert response.code == 200
    oauth = json.loads(body)
    assert oauth["issuer"] == ISSUER
    assert {k: v for k, v in json.loads(oidc).items() if k in oauth} == oauth
    assert "subject_types_supported" not in oauth


@pytest.mark.parametrize(
    "path, cache",
    [
        ("/api/auth/.well-known/openid-configuration", "public, max-age=3600"),
        ("/api/auth/.well-known/oauth-authorization-server", "public, max-age=3600"),
        ("/api/auth/jwks", "public, max-age=600"),
    ],
)
def test_documents_allow_any_origin_and_cache(server, path, cache):
    response, _ = get(server, path, headers={"Origin": "https://rp.example"})
    assert response.headers.getRawHeaders("access-control-allow-origin") == ["*"]
    assert response.headers.getRawHeaders("cache-control") == [cache]
    etag = response.headers.getRawHeaders("etag")[0]
    for tags in (etag, f'"other", W/{etag}', "*"):  # RFC 9110 section 13.1.2: weak comparison, and any
        again, body = get(server, path, headers={"If-None-Match": tags})
        assert (again.code, body) == (304, b""), tags
        assert again.headers.getRawHeaders("content-length") is None, "RFC 9110 section 8.6: never 0 on a 304"
        assert again.headers.getRawHeaders("etag") == [etag]
    head, _ = get(server, path, method="HEAD", headers={"If-None-Match": etag})
    assert head.code == 304
    assert head.headers.getRawHeaders("content-length") is None
    preflight, _ = get(server, path, method="OPTIONS", headers={"Origin": "https://rp.example"})
    assert preflight.code == 204
    assert preflight.headers.getRawHeaders("access-control-allow-origin") == ["*"]
    with capturedLogs() as events:
        head, body = get(server, path + "?code=s3cret", method="HEAD")
    assert (head.code, body) == (200, b"")
    assert int(head.headers.getRawHeaders("content-length")[0]) == len(get(server, path)[1])
    assert not [e for e in events if "s3cret" in formatEvent(e)], "no line with the query, nor any line"
    post, body = get(server, path, method="POST")
    assert post.code == 405
    assert post.headers.getRawHeaders("allow") == ["GET, HEAD, OPTIONS"]
    assert json.loads(body)["error"] == "method_not_allowed"


def test_jwks_follows_the_keystore(server):
    response, body = get(server, "/api/auth/jwks")
    assert response.headers.getRawHeaders("content-type") == ["application/jwk-set+json"]
    assert body == server.keystore.jwks
    etag = response.headers.getRawHeaders("etag")[0]
    server.keystore.jwks = b'{"keys":[{"kty":"RSA","kid":"two"}]}'
    response, body = get(server, "/api/auth/jwks", headers={"If-None-Match": etag})
    assert (response.code, body) == (200, server.keystore.jwks)


def test_root_discovery_redirects_to_the_issuer(server):
    response, _ = get(server, "/.well-known/openid-configuration", allow_redirects=False)
    assert response.code == 301
    assert response.headers.getRawHeaders("location") == [ISSUER + "/.well-known/openid-configuration"]


def test_health(server):
    response, body = get(server, "/healthz")
    assert (response.code, json.loads(body)) == (200, {"status": "ok"})
    response, body = get(server, "/readyz")
    assert (response.code, json.loads(body)) == (200, {"status": "ready"})


def test_not_ready_while_starting(server):
    server.problem = "starting"
    response, body = get(server, "/readyz")
    assert (response.code, json.loads(body)["reason"]) == (503, "starting")


def test_not_ready_while_the_store_fails(server):
    server.store.answer = lambda: fail(ConnectionError("down"))
    response, body = get(server, "/readyz")
    assert (response.code, json.loads(body)["reason"]) == (503, "store unreachable")


def test_not_ready_while_the_store_hangs(server):
    server.store.answer = Deferred
    with capturedLogs() as events:
        d = server.http.get(BASE + "/readyz")
        server.clock.advance(2.0)
        server.http.flush()
        response = result(d)
    assert response.code == 503
    assert "readiness: store unreachable: no answer within 2 s" in [formatEvent(e) for e in events]


def test_the_metadata_is_where_rfc_8414_inserts_it_too(server):
    """RFC 8414 section 3.1: between the host and the issuer's path, as strict clients look for it."""
    for name in ("oauth-authorization-server", "openid-configuration"):
        appended, inserted = (get(server, path)[1] for path in (
            f"/api/auth/.well-known/{name}", f"/.well-known/{name}/api/auth"))
        assert inserted == appended and json.loads(inserted)["issuer"] == ISSUER


def test_a_readiness_check_given_up_by_its_caller_logs_no_outage():
    """A load balancer that drops /readyz before the answer made every part read as unreachable in the log."""
    clock = Clock()
    parts = SimpleNamespace(ping=Deferred, reload=Deferred, names=(), backends=())
    readiness = Readiness(clock=clock, startup=lambda: None, store=parts, keystore=parts, identity=parts)
    with capturedLogs() as events:
        d = Deferred.fromCoroutine(readiness.check())
        d.cancel()
        clock.advance(2.0)
        failed = []
        d.addErrback(failed.append)
        del d
        gc.collect()  # a failure no one handled is logged as the Deferred holding it goes
    assert [f.type for f in failed] == [CancelledError]
    assert not [e for e in events if "unreachable" in formatEvent(e) or "Unhandled" in formatEvent(e)]


def test_unknown_path_and_method(server):
    for path in ("/nope", "/api/auth/oauth2/nope"):
        response, body = get(server, path)
        assert (response.code, json.loads(body)["error"]) == (404, "not_found")
    response, body = get(server, "/healthz", method="DELETE")
    assert response.code == 405
    assert json.loads(body)["error"] == "method_not_allowed"


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/auth/account/nope"), ("GET", "/api/auth/login/nope"), ("POST", "/api/auth/consent/nope"),
    ("GET", "/api/auth/oauth2/authorize/nope"), ("HEAD", "/api/auth/mfa/nope"), ("GET", "/api/auth/link/nope"),
    ("GET", "/api/auth/oauth2/end-session/"), ("GET", "/api/auth/account/"),
])
def test_an_unknown_address_under_a_page_gets_a_page(server, method, path):
    """A person reads what an address under the browser pages answers, a 404 too."""
    response, body = get(server, path, method=method)
    assert response.code == 404
    assert response.headers.getRawHeaders("content-type") == ["text/html; charset=utf-8"]
    assert response.headers.getRawHeaders("x-frame-options") == ["DENY"]
    assert method == "HEAD" or (b"<!DOCTYPE html>" in body and b"There is no page at this address" in body)


@pytest.mark.parametrize("method, path, allow", [
    ("GET", "/api/auth/login/passkey", "POST"),
    ("GET", "/api/auth/account/sessions/end", "POST"),
    ("POST", "/api/auth/account", "HEAD, GET"),
    ("PUT", "/api/auth/consent", "POST, HEAD, GET"),
])
def test_a_method_a_page_does_not_serve_gets_a_page(server, method, path, allow):
    """
    A browser opens a page's address again with a GET after a form
    answered there (the login page after a passkey, the account page after
    an action): a person reads the answer, which was JSON.
    """
    response, body = get(server, path, method=method)
    assert response.code == 405
    assert sorted(response.headers.getRawHeaders("allow")[0].split(", ")) == sorted(allow.split(", "))
    assert response.headers.getRawHeaders("content-type") == ["text/html; charset=utf-8"]
    assert response.headers.getRawHeaders("x-frame-options") == ["DENY"]
    assert b"<!DOCTYPE html>" in body and b"cannot be opened this way" in body


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/auth/oauth2/token"), ("PUT", "/api/auth/oauth2/userinfo"), ("GET", "/api/auth/oauth2/revoke"),
    ("GET", "/api/auth/oauth2/par"), ("GET", "/api/auth/oauth2/register"),
    ("POST", "/api/auth/oauth2/register/some-client"), ("POST", "/api/auth/.well-known/openid-configuration"),
    ("POST", "/api/auth/.well-known/oauth-authorization-server"), ("POST", "/.well-known/openid-configuration"),
    ("DELETE", "/api/auth/jwks"),
])
def test_a_method_an_endpoint_browsers_call_does_not_serve_can_be_read_by_any_origin(method, path):
    """A browser-based client reads the 405 from any origin, as it reads the answers (PAR, registration on here)."""
    config = parse_config({"server": {"public_url": BASE}, "par": {"enabled": True},
                           "registration": {"enabled": True, "allowed_redirect_hosts": ["rp.example"]}}, None)
    server = SimpleNamespace(http=StubTreq(web_root(config, Clock(), FakeStore(), FakeKeystore(), FakeIdentity(),
                                                    lambda: None, hash_password=no_password_hashes)))
    response, body = get(server, path, method=method, headers={"Origin": "https://rp.example"})
    assert (response.code, json.loads(body)["error"]) == (405, "method_not_allowed")
    assert response.headers.getRawHeaders("access-control-allow-origin") == ["*"]


@pytest.mark.parametrize("method, path", [
    ("GET", "/api/auth/oauth2/introspect"), ("DELETE", "/healthz"), ("GET", "/api/auth/account/sessions/end"),
])
def test_a_method_another_endpoint_does_not_serve_allows_no_origin(server, method, path):
    response, _ = get(server, path, method=method, headers={"Origin": "https://rp.example"})
    assert response.code == 405
    assert not response.headers.hasHeader("access-control-allow-origin")


@pytest.mark.parametrize("path, method", [
    ("/api/auth/oauth2/par", "GET"), ("/api/auth/oauth2/par", "PUT"),
    ("/api/auth/oauth2/device-authorization", "GET"), ("/api/auth/oauth2/register", "GET"),
    ("/api/auth/oauth2/register/some-client", "POST"),
])
def test_an_optional_endpoint_that_is_off_is_not_found_by_any_method(server, path, method):
    """Not a 405 naming the methods of an endpoint that is not there (PAR, device, registration are off here)."""
    response, body = get(server, path, method=method)
    assert (response.code, json.loads(body)["error"]) == (404, "not_found")
    assert not response.headers.hasHeader("allow")


def test_the_device_page_that_is_off_is_a_404_page_by_any_method(server):
    response, body = get(server, "/api/auth/device", method="PUT")
    assert response.code == 404 and b"does not connect devices" in body


@pytest_twisted.ensureDeferred
async def test_no_path_is_redirected_to_a_host_the_request_named(tmp_path, monkeypatch):
    """
    werkzeug redirected a doubled slash to an absolute URL built from the
    Host header; a redirect now (the account page's sign-in) names the
    configured issuer's host, whatever the request's Host.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        for path in ("/api/auth//account", "/api/auth//consent", "/api/auth/account/", "/api/admin//clients"):
            response, _ = await h.get(BASE_OF_HARNESS + path, headers={"Host": "evil.example"})
            location = (response.headers.getRawHeaders("location") or [BASE_OF_HARNESS + "/"])[0]
            assert location.startswith(BASE_OF_HARNESS + "/"), (path, location)
    finally:
        await h.close()
