"""
The hottest routes (token, introspection, UserInfo, user-access, and a
sign-in's authorize and login page) are plain twisted.web leaves below
Klein's router: the root finds them by their whole path, their answers are
the contract's (status, headers, body) for success, each kind of refusal
and a wrong method, they reach the wire exactly as a Klein route's would,
and a client that goes away or a route that fails unexpectedly raises
nothing and leaks no traceback.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from klein import Klein
from klein.resource import KleinResource
from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone
from twisted.internet.testing import StringTransport
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.resource import getChildForRequest
from twisted.web.server import Request, Site
from twisted.web.test.requesthelper import DummyChannel, DummyRequest

from authsrv.testing.identity import ALICE
from authsrv.web.headers import json_body, method_not_allowed
from authsrv.web.internal import InternalAPI
from authsrv.web.public import PublicSite
from authsrv.web.root import Root
from authsrv.web.routes import Endpoint, ExactPaths, RoutedKlein, SegmentsAsSent
from flow_client import hidden_fields
from harness import INTERNAL_SECRET, Harness
from token_helpers import INTROSPECT, TOKEN, USERINFO, client_auth, header, post_form, tokens

USER_ACCESS = "/api/internal/user-access"
AUTHORIZE = "/api/auth/oauth2/authorize"
LOGIN = "/api/auth/login"
HOT = {TOKEN: TOKEN, INTROSPECT: INTROSPECT, USERINFO: USERINFO, USER_ACCESS: USER_ACCESS, AUTHORIZE: AUTHORIZE,
       LOGIN: LOGIN}
"""Each hot path and the route label its requests carry (the pattern Klein's rule had)."""
INTERNAL = {"Authorization": f"Bearer {INTERNAL_SECRET}", "Content-Type": "application/json"}
JSON_NO_STORE = {"content-type": ["application/json"], "cache-control": ["no-store"], "pragma": ["no-cache"]}


@pytest.fixture
def harness(tmp_path, monkeypatch):
    return Harness(tmp_path, monkeypatch)


def traverse(root, path: str):
    request = DummyRequest(path.encode().split(b"/")[1:])
    request.path = path.encode()
    return getChildForRequest(root, request)


def has_headers(response, expected: dict) -> None:
    for name, values in expected.items():
        assert header(response, name) == values, name


def test_the_root_answers_the_hottest_routes_below_klein(harness):
    for path, route in HOT.items():
        leaf = traverse(harness.root, path)
        assert isinstance(leaf, Endpoint) and leaf.route == route, path
    assert isinstance(traverse(harness.root, "/api/auth/oauth2/revoke"), SegmentsAsSent)
    assert isinstance(traverse(harness.root, "/api/internal/chat-token"), SegmentsAsSent)
    internal = harness.internal.resource()
    listener = Root({}, internal, internal, harness.config.input_limits)
    assert isinstance(traverse(listener, USER_ACCESS), Endpoint)
    assert isinstance(traverse(internal, USER_ACCESS), Endpoint)
    assert isinstance(traverse(internal, "/api/internal/chat-token"), SegmentsAsSent)


def test_no_klein_route_is_left_behind_for_them():
    rules = {rule.rule for app in (PublicSite.app, InternalAPI.app) for rule in app.url_map.iter_rules()}
    assert rules & set(HOT) == set()


@pytest_twisted.ensureDeferred
async def test_introspection_answers(harness):
    h = await harness.start()
    try:
        token = (await tokens(h))["access_token"]
        response, body = await post_form(h, INTROSPECT, {"token": token}, client_id="gateway")
        assert (response.code, body["active"], body["sub"]) == (200, True, ALICE.sub)
        has_headers(response, {**JSON_NO_STORE, "access-control-allow-origin": None})

        response, body = await post_form(h, INTROSPECT, {}, client_id="gateway")
        assert (response.code, body["error"]) == (400, "invalid_request")
        has_headers(response, JSON_NO_STORE)

        response, body = await post_form(h, INTROSPECT, {"token": token, "client_id": "gateway",
                                                         "client_secret": "wrong"}, client_id=None)
        assert (response.code, body["error"]) == (401, "invalid_client")
        has_headers(response, {**JSON_NO_STORE, "www-authenticate": ['Basic realm="authsrv"']})

        for method in ("GET", "HEAD", "OPTIONS", "PUT"):
            response, body = await h.request(method, INTROSPECT)
            assert response.code == 405, method
            has_headers(response, {"allow": ["POST"], "content-type": ["application/json"],
                                   "access-control-allow-origin": None})
            if method != "HEAD":
                assert json.loads(body) == {"error": "method_not_allowed", "error_description": "use POST"}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_userinfo_answers(harness):
    h = await harness.start()
    try:
        token = (await tokens(h))["access_token"]
        cors = {"access-control-allow-origin": ["*"],
                "access-control-expose-headers": ["WWW-Authenticate, DPoP-Nonce, Retry-After"]}
        for method in ("GET", "POST"):
            response, body = await h.json(method, USERINFO, headers={"Authorization": f"Bearer {token}"})
            assert (response.code, body["sub"]) == (200, ALICE.sub), method
            has_headers(response, {**JSON_NO_STORE, **cors})
        response, body = await h.request("HEAD", USERINFO, headers={"Authorization": f"Bearer {token}"})
        assert (response.code, body) == (200, b"")

        response, body = await h.json("GET", USERINFO, headers={"Authorization": "Bearer nope"})
        assert (response.code, body["error"]) == (401, "invalid_token")
        has_headers(response, {**JSON_NO_STORE, **cors, "www-authenticate": [
            f'Bearer realm="authsrv", error="invalid_token", error_description="{body["error_description"]}"']})

        response, body = await h.json("POST", USERINFO, headers={"Authorization": f"Bearer {token}"},
                                      data={"access_token": token})
        assert (response.code, body["error"]) == (400, "invalid_request")
        has_headers(response, {**JSON_NO_STORE, **cors})

        response, body = await h.request("OPTIONS", USERINFO, headers={
            "Origin": "https://spa.example", "Access-Control-Request-Method": "GET"})
        assert (response.code, body) == (204, b"")
        has_headers(response, {**cors, "access-control-allow-methods": ["GET, POST, OPTIONS"],
                               "access-control-allow-headers": ["Authorization, Content-Type, DPoP"],
                               "access-control-max-age": ["86400"]})

        response, body = await h.request("DELETE", USERINFO)
        assert response.code == 405
        has_headers(response, {"allow": ["GET, HEAD, POST, OPTIONS"], **cors})
        assert json.loads(body)["error"] == "method_not_allowed"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_user_access_answers(harness):
    h = await harness.start()
    try:
        response, body = await h.request("POST", USER_ACCESS, headers=INTERNAL,
                                         data=json.dumps({"userId": ALICE.sub}).encode())
        assert response.code == 200
        assert json.loads(body) == {"allowed": False, "banned": False, "banReason": None, "hasActiveGrant": False}
        has_headers(response, JSON_NO_STORE)

        response, body = await h.request("POST", USER_ACCESS, headers={**INTERNAL, "Authorization": "Bearer no"},
                                         data=b"{}")
        assert response.code == 401
        assert json.loads(body) == {"error": "unauthorized",
                                    "message": "a valid Authorization: Bearer <internal API secret> is required"}
        has_headers(response, {**JSON_NO_STORE, "www-authenticate": ['Bearer realm="authsrv-internal"']})

        response, body = await h.request("POST", USER_ACCESS, headers=INTERNAL, data=b"{}")
        assert (response.code, json.loads(body)) == (400, {"error": "invalid_request", "message": "userId is missing"})

        response, body = await h.request("GET", USER_ACCESS, headers=INTERNAL)
        assert (response.code, json.loads(body)) == (405, {"error": "method_not_allowed", "message": "use POST"})
        has_headers(response, {**JSON_NO_STORE, "allow": ["POST"]})
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_token_endpoint_answers(harness):
    h = await harness.start()
    try:
        response, body = await post_form(h, TOKEN, {})
        assert (response.code, body["error"]) == (400, "invalid_request")
        has_headers(response, {**JSON_NO_STORE, "access-control-allow-origin": ["*"]})

        fields, _ = client_auth("first")
        response, body = await post_form(h, TOKEN, {**fields, "client_secret": "wrong",
                                                    "grant_type": "refresh_token", "refresh_token": "x"}, None)
        assert (response.code, body["error"]) == (401, "invalid_client")
        has_headers(response, {"www-authenticate": ['Basic realm="authsrv"']})

        response, body = await h.request("OPTIONS", TOKEN)
        assert (response.code, body) == (204, b"")
        has_headers(response, {"access-control-allow-methods": ["POST, OPTIONS"]})

        response, body = await h.request("GET", TOKEN)
        assert (response.code, json.loads(body)["error"]) == (405, "method_not_allowed")
        has_headers(response, {"allow": ["POST, OPTIONS"], "access-control-allow-origin": ["*"]})
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_sign_in_routes_answer(harness):
    """HEAD as GET without a body, a refusal as a page, any other method 405, as their Klein routes answered."""
    h = await harness.start()
    try:
        for method in ("GET", "HEAD"):
            response, body = await h.request(method, h.authorize_url())
            assert response.code == 200, method
            has_headers(response, {"content-type": ["text/html; charset=utf-8"]})
            assert (b'name="password"' in body, body == b"") == (method == "GET", method == "HEAD")
        response, body = await h.request("GET", h.authorize_url())
        shown_again = LOGIN + "?request=" + hidden_fields(body)["request"]
        for method in ("GET", "HEAD"):
            response, again = await h.request(method, shown_again)
            assert response.code == 200, method
            assert (b'name="password"' in again, again == b"") == (method == "GET", method == "HEAD")
        unknown = h.authorize_url(client_id="nobody", redirect_uri="https://nowhere.test/cb")
        response, body = await h.request("GET", unknown)
        assert response.code == 400 and b"<html" in body.lower()
        has_headers(response, {"content-type": ["text/html; charset=utf-8"]})
        response, head = await h.request("HEAD", unknown)
        assert (response.code, head) == (400, b"")

        for method in ("GET", "HEAD"):
            response, body = await h.request(method, LOGIN + "?interaction=gone")
            assert response.code == 400, method
            assert (body == b"") == (method == "HEAD")
        response, body = await h.request("POST", LOGIN, data={"interaction": "gone", "username": "alice",
                                                             "password": "x", "csrf": "x"})
        assert response.code == 400 and b"<html" in body.lower()

        for path in (AUTHORIZE, LOGIN):
            for method in ("PUT", "DELETE", "OPTIONS"):
                response, body = await h.request(method, path)
                assert response.code == 405, (path, method)
                has_headers(response, {"allow": ["GET, HEAD, POST"], "content-type": ["text/html; charset=utf-8"],
                                       "x-frame-options": ["DENY"]})
                assert b"cannot be opened this way" in body
    finally:
        await h.close()


# --- Endpoint itself ------------------------------------------------------------


def server_error(request) -> bytes:
    return json_body(request, 500, {"error": "server_error"})


def wire(resource, request: bytes) -> bytes:
    """The bytes a site serving C{resource} answers to C{request}, its Date header left out."""
    transport = StringTransport()
    channel = Site(resource).buildProtocol(None)
    channel.makeConnection(transport)
    channel.dataReceived(request)
    return b"\r\n".join(line for line in transport.value().split(b"\r\n") if not line.lower().startswith(b"date:"))


@pytest.mark.parametrize("method, path", [
    ("POST", TOKEN + "/"), ("POST", INTROSPECT + "/"), ("GET", USERINFO + "/"), ("POST", "/api/auth/oauth2/revoke/"),
    ("GET", "/healthz/"), ("GET", "/readyz/"),
    ("GET", "/.well-known/openid-configuration/"), ("GET", "/api/auth/.well-known/openid-configuration/"),
    ("GET", "/api/auth/jwks/"), ("POST", "/api/auth/oauth2/revoke%2F"), ("POST", "/api/auth/oauth2/rev%6Fke"),
    ("POST", "/api/auth/oauth2/t%6Fken"), ("GET", "/health%7A"),
])
@pytest_twisted.ensureDeferred
async def test_a_near_miss_of_a_public_path_is_not_found(harness, method, path):
    """
    Paths are exact, as the contract's are: a trailing slash (or an escaped
    one), or an escaped letter, is no other spelling of an endpoint, never
    served as it nor redirected to it, but a 404 in the OAuth endpoints'
    JSON shape, for the routes below Klein as for the exact ones (a near
    miss of a browser's page is a page: tests/web/test_web.py). The
    contract's redirect from the host root's discovery path is kept.
    """
    h = await harness.start()
    try:
        response, body = await h.request(method, path)
        assert response.code == 404, (path, body)
        assert json.loads(body) == {"error": "not_found", "error_description": "no such endpoint"}
        response, _ = await h.request("GET", "/.well-known/openid-configuration")
        assert response.code == 301
        assert response.headers.getRawHeaders("location") == [h.config.issuer + "/.well-known/openid-configuration"]
    finally:
        await h.close()


def test_no_route_may_end_with_a_slash():
    """With strict slashes werkzeug would redirect the path without it, its Location built from the Host header."""
    with pytest.raises(ValueError, match="a route ending with '/' would redirect the path without it"):
        RoutedKlein().route("/api/things/")


def test_an_endpoint_writes_what_a_klein_route_writes():
    class App:
        app = Klein()

        @app.route("/x", methods=["POST"])
        async def answer(self, request):
            return json_body(request, 201, {"a": 1}, no_store=True)

        @app.handle_errors(Exception)
        def wrong(self, request, failure):
            return method_not_allowed(request, b"POST")

    async def answer(request):
        return json_body(request, 201, {"a": 1}, no_store=True)

    klein = ExactPaths({}, App().app.resource())
    endpoint = ExactPaths({b"/x": Endpoint("/x", {b"POST": answer},
                                            lambda request: method_not_allowed(request, b"POST"), server_error)},
                          klein)
    for request in (b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
                    b"POST /x HTTP/1.0\r\nContent-Length: 0\r\n\r\n",
                    b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"):
        assert wire(endpoint, request) == wire(klein, request), request
    assert b"transfer-encoding: chunked" in wire(endpoint, b"POST /x HTTP/1.1\r\nHost: a\r\n\r\n").lower()


def test_an_unexpected_failure_is_the_sites_500_without_a_traceback():
    async def failing(request):
        raise RuntimeError("a bug")

    answer = wire(ExactPaths({b"/x": Endpoint("/x", {b"POST": failing}, lambda r: b"", server_error)},
                             KleinResource(Klein())),
                  b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert b'{"error":"server_error"}' in answer
    assert b"a bug" not in answer and b"Traceback" not in answer


def request_to(endpoint: Endpoint) -> tuple[Request, DummyChannel]:
    channel = DummyChannel()
    request = Request(channel)
    request.method = b"POST"
    request.clientproto = b"HTTP/1.1"
    endpoint.render(request)
    return request, channel


@pytest.mark.parametrize("then", ["cancelled", "fails"])
def test_a_client_that_goes_away_mid_request(then):
    """The work in flight is cancelled; nothing is written and nothing raised; only a real failure is logged."""
    cancelled = []
    waiting: Deferred = Deferred(cancelled.append)

    async def slow(request):
        try:
            await waiting
        except Exception:
            if then == "fails":
                raise RuntimeError("failed while cancelled") from None
            raise
        return b"too late"

    events: list = []
    endpoint = Endpoint("/x", {b"POST": slow}, lambda r: b"", server_error)
    endpoint.log = Logger(observer=events.append)
    request, channel = request_to(endpoint)
    request.connectionLost(Failure(ConnectionDone()))
    assert cancelled == [waiting]
    assert channel.transport.written.getvalue() == b""
    assert [e.get("log_failure") is not None for e in events] == ([True] if then == "fails" else [])


def test_a_route_that_answers_after_its_client_went_away_writes_nothing():
    async def stubborn(request):
        try:
            await Deferred()
        except Exception:
            pass
        return b"too late"

    request, channel = request_to(Endpoint("/x", {b"POST": stubborn}, lambda r: b"", server_error))
    request.connectionLost(Failure(ConnectionDone()))
    assert channel.transport.written.getvalue() == b""
