"""
A failure nothing foresaw (a bug, a plugin raising something of its own),
on every kind of route: answered 500 in the form its caller reads, with
nothing of the failure in the answer, and logged with its traceback, the
request's method and path, and nothing of its query or body.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred
from twisted.logger import formatEvent

from authsrv.config import ISSUER_PATH
from authsrv.flows.end_session import EndSessionFlow
from authsrv.flows.interaction import InteractionFlow
from authsrv.flows.revoke import RevocationFlow
from authsrv.flows.token import TokenFlow
from authsrv.operations.clients import ClientOperations
from authsrv.testing.identity import ALICE
from authsrv.web.failures import MESSAGE

from fakes import FakeKeystore
from harness import ISSUER, Harness
from token_helpers import SECRETS, exchange, save_code
from web.test_admin_api import Admin
from web.test_internal import AUTH as INTERNAL_AUTH
from web.test_internal import PATH as USER_ACCESS, call
from wire import Listener, parse, request_head

SECRET_IN_REQUEST = "do-not-log-this-value-3f9c"


class Broken(Exception):
    """What the broken part raises: its message must reach the log, never the client."""


def broken(*args, **kwargs):
    raise Broken("the part broke on purpose")


@pytest.fixture
def harness(tmp_path, monkeypatch):
    harness = Harness(tmp_path, monkeypatch)
    yield harness
    pytest_twisted.blockon(Deferred.fromCoroutine(harness.close()))


def logged_failures(events) -> list[dict]:
    return [e for e in events if "log_failure" in e and e["log_failure"].check(Broken)]


def assert_logged(events, method: str, path: str) -> None:
    (event,) = logged_failures(events)
    assert (event["method"], event["path"]) == (method, path)
    text = formatEvent(event) + event["log_failure"].getTraceback()
    assert "the part broke on purpose" in text
    assert SECRET_IN_REQUEST not in text


def assert_oauth_server_error(response, body: bytes) -> None:
    assert response.code == 500
    assert response.headers.getRawHeaders("content-type") == ["application/json"]
    assert response.headers.getRawHeaders("cache-control") == ["no-store"]
    assert json.loads(body) == {"error": "server_error", "error_description": MESSAGE}


def assert_api_server_error(response, body: dict) -> None:
    """The internal and admin APIs' own error shape."""
    assert response.code == 500
    assert response.headers.getRawHeaders("cache-control") == ["no-store"]
    assert body == {"error": "server_error", "message": MESSAGE}


def assert_page(response, body: bytes) -> None:
    assert response.code == 500
    assert response.headers.getRawHeaders("content-type")[0].startswith("text/html")
    assert b"Something went wrong" in body and b"Processing Failed" not in body
    assert b"broke on purpose" not in body


@pytest.mark.parametrize("flow, step, route, form", [
    (TokenFlow, "token", "/oauth2/token", {"grant_type": "authorization_code", "code": SECRET_IN_REQUEST,
                                           "redirect_uri": "http://127.0.0.1:9000/callback"}),
    (RevocationFlow, "revoke", "/oauth2/revoke", {"token": SECRET_IN_REQUEST}),
], ids=["token endpoint, below Klein", "revocation, a Klein route"])
@pytest_twisted.ensureDeferred
async def test_what_relying_parties_call_answers_an_oauth_server_error(harness, monkeypatch, audit,
                                                                        flow, step, route, form):
    h = await harness.start()
    monkeypatch.setattr(flow, step, broken)
    response, body = await h.post(ISSUER + route, {
        **form, "client_id": "first", "client_secret": SECRETS["first"],
    })
    assert_oauth_server_error(response, body)
    assert_logged(audit, "POST", ISSUER_PATH + route)


@pytest_twisted.ensureDeferred
async def test_pages_answer_an_error_page(harness, monkeypatch, audit):
    h = await harness.start()
    monkeypatch.setattr(InteractionFlow, "authorize", broken)
    response, body = await h.get(h.authorize_url(state=SECRET_IN_REQUEST))
    assert_page(response, body)
    assert_logged(audit, "GET", ISSUER_PATH + "/oauth2/authorize")

    audit.clear()
    monkeypatch.setattr(EndSessionFlow, "end", broken)
    response, body = await h.get(f"{ISSUER}/oauth2/end-session?state={SECRET_IN_REQUEST}")
    assert_page(response, body)
    assert_logged(audit, "GET", ISSUER_PATH + "/oauth2/end-session")


@pytest_twisted.ensureDeferred
async def test_the_internal_api_answers_its_own_error_shape(harness, monkeypatch, audit):
    h = await harness.start()
    monkeypatch.setattr(h.store, "access_state", broken)
    response, body = await call(h, {"userId": ALICE.sub, "note": SECRET_IN_REQUEST}, headers=INTERNAL_AUTH,
                                path=USER_ACCESS)
    assert_api_server_error(response, body)
    assert_logged(audit, "POST", USER_ACCESS)


@pytest_twisted.ensureDeferred
async def test_the_admin_api_answers_its_own_error_shape(harness, monkeypatch, audit):
    a = Admin(await harness.start())
    monkeypatch.setattr(ClientOperations, "list", broken)
    response, body = await a.call("GET", f"/api/admin/clients?cursor={SECRET_IN_REQUEST}")
    assert_api_server_error(response, body)
    assert_logged(audit, "GET", "/api/admin/clients")
    response, body = await a.call("GET", "/api/admin/nothing")
    assert (response.code, body["error"]) == (404, "not_found"), "routing's own answers stay Klein's"


@pytest_twisted.ensureDeferred
async def test_the_server_answers_normally_after_a_failure(harness, monkeypatch):
    h = await harness.start()
    code, verifier = await save_code(h)
    with monkeypatch.context() as patched:
        patched.setattr(TokenFlow, "token", broken)
        response, _ = await exchange(h, code, verifier)
        assert response.code == 500
    response, body = await exchange(h, code, verifier)
    assert response.code == 200, body


def test_a_failure_past_every_route_is_an_oauth_server_error(monkeypatch, audit):
    """A prepared document whose source raises (here the keystore's JWKS) reaches Twisted itself."""
    monkeypatch.setattr(FakeKeystore, "jwks_bytes", broken)
    listener = Listener()
    protocol, transport = listener.send(request_head("GET", ISSUER_PATH + f"/jwks?x={SECRET_IN_REQUEST}"))
    status, headers, body = parse(transport)
    assert (status, headers["content-type"]) == (500, "application/json")
    assert json.loads(body) == {"error": "server_error", "error_description": MESSAGE}
    assert_logged(audit, "GET", ISSUER_PATH + "/jwks")
    listener.close(protocol, transport)
    listener.assert_serves()
