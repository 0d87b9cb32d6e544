"""
Pushed authorization requests (RFC 9126) in memory: a pushed request is
validated like the authorization endpoint's query, used once, only by its
own client and only for a minute; a client held to pushed requests cannot
send plain parameters; the endpoint authenticates clients like the token
endpoint, counts them against their rate, and exists only when offered.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlencode

import attrs
import pytest_twisted
from jwcrypto import jwk, jwt

from flow_client import Browser, location, shows_login_form
from harness import CLIENTS, ISSUER, SECRETS, Harness, pkce_pair, query_of
from token_helpers import INTROSPECT, REVOKE, TOKEN, basic, exchange, hmac_assertion, post_form, redirect_uri_of

from authsrv.protocol.pushed import REQUEST_URI_PREFIX
from authsrv.sealing import new_key_text
from authsrv.testing.identity import ALICE, PASSWORDS
from authsrv.tokens import token_hash

PAR = "/api/auth/oauth2/par"
STRICT = {
    "client_id": "strict",
    "name": "Strict App",
    "secret_env": "AUTHSRV_TEST_PARTNER_SECRET",
    "redirect_uris": ["http://127.0.0.1:9004/callback"],
    "require_pushed_authorization_requests": True,
}
OFFERED = {"par": {"enabled": True}, "clients": [*CLIENTS, STRICT]}


async def started(tmp_path, monkeypatch, config=OFFERED) -> Harness:
    return await Harness(tmp_path, monkeypatch, config).start()


def request_fields(client_id: str = "first", **changes) -> tuple[dict, str]:
    """An authorization request's fields as a client pushes them, and its PKCE verifier."""
    verifier, challenge = pkce_pair()
    redirect_uri = STRICT["redirect_uris"][0] if client_id == "strict" else redirect_uri_of(client_id)
    fields = {
        "response_type": "code", "redirect_uri": redirect_uri, "scope": "openid profile offline_access",
        "state": "st4te", "nonce": "n-1", "code_challenge": challenge, "code_challenge_method": "S256", **changes,
    }
    return {k: v for k, v in fields.items() if v is not None}, verifier


async def push(h, client_id: str = "first", method: str = "post", **changes) -> tuple[str, str]:
    """Push a valid request; (request_uri, verifier)."""
    fields, verifier = request_fields(client_id, **changes)
    auth = "basic" if method == "basic" else "post"
    response, body = await post_form(h, PAR, fields, "partner" if client_id == "strict" else client_id, auth)
    assert response.code == 201, body
    return body["request_uri"], verifier


async def push_as_strict(h) -> tuple[str, str]:
    fields, verifier = request_fields("strict")
    response, body = await h.json("POST", PAR, data={**fields, "client_id": "strict",
                                                      "client_secret": SECRETS["partner"]})
    assert response.code == 201, body
    return body["request_uri"], verifier


def by_reference(client_id: str, request_uri: str, **extra) -> str:
    return ISSUER + "/oauth2/authorize?" + urlencode({"client_id": client_id, "request_uri": request_uri, **extra})


def assert_unusable(response, body):
    """A request_uri that cannot be used: the service's own page, never a redirect."""
    assert response.code == 400, body
    assert not response.headers.hasHeader(b"location")
    assert b"invalid_request_uri" in body


async def sign_in_by_reference(h, browser: Browser, client_id: str, request_uri: str, **extra) -> dict[str, str]:
    """
    Sign in through a pushed request. Its request_uri is used up at once, so
    its login form is a page of its own that a reload shows again (RFC 9126
    section 4 lets a reload through; a second use of the request_uri is refused).
    """
    response, body = await browser.get(by_reference(client_id, request_uri, **extra))
    assert response.code == 303 and "/login?" in location(response), body
    page = location(response)
    assert shows_login_form(*await browser.get(page)), "a reload of the form's page shows it again"
    response, body = await browser.submit_login(page, ALICE.login, PASSWORDS[ALICE.sub])
    if response.code == 303 and "/consent?" in location(response):
        response, body = await browser.answer_consent(location(response), "approve")
    assert response.code in (302, 303), body
    return query_of(location(response))


@pytest_twisted.ensureDeferred
async def test_a_pushed_request_signs_in_and_its_code_redeems(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        fields, verifier = request_fields()
        response, body = await post_form(h, PAR, fields, "first", "basic")
        assert response.code == 201, body
        assert set(body) == {"request_uri", "expires_in"} and body["expires_in"] == 60
        assert body["request_uri"].startswith(REQUEST_URI_PREFIX)
        assert len(body["request_uri"]) > len(REQUEST_URI_PREFIX) + 40
        assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
        returned = await sign_in_by_reference(
            h, Browser(h), "first", body["request_uri"],
            state="not-the-pushed-one", redirect_uri="http://127.0.0.1:9000/other",
        )
        assert returned["state"] == "st4te" and returned["iss"] == ISSUER
        response, tokens = await exchange(h, returned["code"], verifier)
        assert response.code == 200, tokens
        assert tokens["refresh_token"] and tokens["id_token"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_request_uri_works_once_for_a_minute_for_its_own_client(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        used, _ = await push(h)
        await sign_in_by_reference(h, Browser(h), "first", used)
        response, body = await Browser(h).get(by_reference("first", used))
        assert_unusable(response, body)

        stale, _ = await push(h)
        h.clock.advance(60)
        response, body = await Browser(h).get(by_reference("first", stale))
        assert_unusable(response, body)

        theirs, _ = await push(h)
        for intruder in ("partner", "spa"):
            response, body = await Browser(h).get(by_reference(intruder, theirs))
            assert_unusable(response, body)
        assert (await sign_in_by_reference(h, Browser(h), "first", theirs))["code"]

        for forged in (REQUEST_URI_PREFIX + "guessed", "https://evil.example/request.jwt"):
            response, body = await Browser(h).get(by_reference("first", forged))
            assert_unusable(response, body)
        response, body = await Browser(h).get(ISSUER + "/oauth2/authorize?client_id=first&request_uri=a&request_uri=b")
        assert_unusable(response, body)
        response, body = await Browser(h).get(by_reference("nobody", theirs))
        assert response.code == 400 and b"not known" in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_held_to_pushed_requests_cannot_send_plain_parameters(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        fields, _ = request_fields("strict")
        response, body = await Browser(h).get(
            ISSUER + "/oauth2/authorize?" + urlencode({**fields, "client_id": "strict"})
        )
        assert response.code == 302
        returned = query_of(location(response))
        assert location(response).startswith(STRICT["redirect_uris"][0] + "?")
        assert returned["error"] == "invalid_request" and "RFC 9126" in returned["error_description"]
        assert returned["state"] == "st4te" and returned["iss"] == ISSUER and "code" not in returned
        response, body = await Browser(h).get(
            ISSUER + "/oauth2/authorize?" + urlencode({**fields, "client_id": "strict", "redirect_uri": "https://evil.example/"})
        )
        assert response.code == 400 and not response.headers.hasHeader(b"location")

        request_uri, verifier = await push_as_strict(h)
        returned = await sign_in_by_reference(h, Browser(h), "strict", request_uri)
        response, tokens = await h.json("POST", "/api/auth/oauth2/token", data={
            "grant_type": "authorization_code", "code": returned["code"], "code_verifier": verifier,
            "redirect_uri": STRICT["redirect_uris"][0], "client_id": "strict", "client_secret": SECRETS["partner"],
        })
        assert response.code == 200, tokens

        fields, _ = request_fields("first")
        answer = await Browser(h).get(ISSUER + "/oauth2/authorize?" + urlencode({**fields, "client_id": "first"}))
        assert shows_login_form(*answer), "only the strict client is held to PAR"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_server_can_hold_every_client_to_pushed_requests(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch, {"par": {"require_pushed_authorization_requests": True}})
    try:
        _, document = await h.json("GET", "/api/auth/.well-known/openid-configuration")
        assert document["require_pushed_authorization_requests"] is True
        for client_id in ("first", "spa"):
            response, _ = await Browser(h).authorize(client_id)
            assert query_of(location(response))["error"] == "invalid_request"
        request_uri, _ = await push(h, "spa")
        assert (await sign_in_by_reference(h, Browser(h), "spa", request_uri))["code"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_pushing_needs_client_authentication(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        fields, _ = request_fields()
        for data, headers in [
            (fields, {}),
            ({**fields, "client_id": "first"}, {}),
            ({**fields, "client_id": "first", "client_secret": "wrong"}, {}),
            (fields, basic("first", "wrong")),
            ({**fields, "client_id": "nobody", "client_secret": "x"}, {}),
            ({**fields, "client_id": "spa", "client_secret": "made-up"}, {}),
        ]:
            response, body = await h.json("POST", PAR, data=data, headers=headers)
            assert response.code == 401 and body["error"] == "invalid_client", (data, body)
            assert response.headers.hasHeader(b"www-authenticate")
        response, body = await h.json("POST", PAR, data={**fields, "client_id": "first"},
                                      headers=basic("partner", SECRETS["partner"]))
        assert response.code == 400 and body["error"] == "invalid_request"
        assert await h.store.take_pushed_request(token_hash("x"), "first", h.now()) is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_push_is_validated_as_the_authorization_endpoint_validates(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        cases = [
            ({"redirect_uri": "https://evil.example/callback"}, "invalid_request"),
            ({"redirect_uri": None}, "invalid_request"),
            ({"request_uri": REQUEST_URI_PREFIX + "x"}, "invalid_request"),
            ({"request": "eyJhbGciOiJub25lIn0.e30."}, "request_not_supported"),
            ({"response_type": "token"}, "unsupported_response_type"),
            ({"code_challenge_method": "plain"}, "invalid_request"),
            ({"code_challenge": None}, "invalid_request"),
            ({"scope": "admin"}, "invalid_scope"),
            ({"resource": "https://other.example.test"}, "invalid_target"),
            ({"state": None}, "invalid_request"),
        ]
        for changes, error in cases:
            fields, _ = request_fields(**changes)
            response, body = await post_form(h, PAR, fields)
            assert response.code == 400 and body["error"] == error, (changes, body)
        fields, _ = request_fields()
        response, body = await h.json("POST", PAR + "?state=x", data={**fields, "client_id": "first",
                                                                     "client_secret": SECRETS["first"]})
        assert response.code == 400 and body["error"] == "invalid_request"
        response, body = await h.json("POST", PAR, data=[*fields.items(), ("state", "again"),
                                                         ("client_id", "first"), ("client_secret", SECRETS["first"])])
        assert response.code == 400 and body["error"] == "invalid_request"
        response, body = await h.json("POST", PAR, json={**fields, "client_id": "first"})
        assert response.code == 400 and body["error"] == "invalid_request"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_resources_repeat_and_the_secret_is_never_kept(tmp_path, monkeypatch):
    config = {"par": {"enabled": True},
              "clients": [{**CLIENTS[0], "resources": ["https://api.example.test", "urn:files"]}, *CLIENTS[1:]]}
    h = await started(tmp_path, monkeypatch, config)
    try:
        fields, verifier = request_fields()
        data = [*fields.items(), ("resource", "https://api.example.test"), ("resource", "urn:files"),
                ("client_id", "first"), ("client_secret", SECRETS["first"])]
        response, body = await h.json("POST", PAR, data=data)
        assert response.code == 201, body
        pushed = h.store  # the row as stored
        row = await pushed.take_pushed_request(token_hash(body["request_uri"]), "first", h.now())
        assert SECRETS["first"] not in row.query and "client_secret" not in row.query
        await pushed.save_pushed_request(row)
        returned = await sign_in_by_reference(h, Browser(h), "first", body["request_uri"])
        response, tokens = await exchange(h, returned["code"], verifier)
        assert response.code == 200, tokens
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_pushes_count_against_the_client_rate(tmp_path, monkeypatch):
    config = {"par": {"enabled": True}, "clients": [{**CLIENTS[0], "rate_limit": "2/m"}, *CLIENTS[1:]]}
    h = await started(tmp_path, monkeypatch, config)
    try:
        await push(h)
        await push(h)
        fields, _ = request_fields()
        response, body = await post_form(h, PAR, fields)
        assert response.code == 429 and body["error"] == "too_many_requests"
        assert response.headers.getRawHeaders(b"retry-after")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_not_offered_means_no_endpoint_and_nothing_in_discovery(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch, {})
    try:
        fields, _ = request_fields()
        response, body = await post_form(h, PAR, fields)
        assert response.code == 404
        response, body = await h.json("GET", PAR)
        assert (response.code, body["error"]) == (404, "not_found")
        for path in ("openid-configuration", "oauth-authorization-server"):
            _, document = await h.json("GET", f"/api/auth/.well-known/{path}")
            assert "pushed_authorization_request_endpoint" not in document
            assert "require_pushed_authorization_requests" not in document
        response, _ = await Browser(h).get(by_reference("first", REQUEST_URI_PREFIX + "x") + "&" + urlencode(
            {k: v for k, v in {**fields, "client_id": None}.items() if v is not None}))
        assert query_of(location(response))["error"] == "request_uri_not_supported"
    finally:
        await h.close()
    (tmp_path / "offered").mkdir()
    h = await started(tmp_path / "offered", monkeypatch)
    try:
        response, body = await h.json("GET", PAR)
        assert (response.code, body["error"]) == (405, "method_not_allowed")
        for path in ("openid-configuration", "oauth-authorization-server"):
            _, document = await h.json("GET", f"/api/auth/.well-known/{path}")
            assert document["pushed_authorization_request_endpoint"] == ISSUER + "/oauth2/par"
            assert document["require_pushed_authorization_requests"] is False
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_fapi2_client_pushes_and_its_codes_live_a_minute(tmp_path, monkeypatch):
    """
    A FAPI 2.0 client put in the store as a build with key-based client
    authentication will let it be made: held to pushed requests, and its
    codes live at most 60 s whatever [limits] code_ttl says.
    """
    h = await started(tmp_path, monkeypatch, {"par": {"enabled": True}, "limits": {"code_ttl": "5m"}})
    try:
        first = await h.store.get_client("first")
        await h.store.put_client(attrs.evolve(first, client_id="bank", profile="fapi2"))
        fields, _ = request_fields()
        response, _ = await Browser(h).get(ISSUER + "/oauth2/authorize?" + urlencode({**fields, "client_id": "bank"}))
        assert query_of(location(response))["error"] == "invalid_request"

        response, body = await h.json("POST", PAR, data=fields, headers=basic("bank", SECRETS["first"]))
        assert response.code == 201, body
        returned = await sign_in_by_reference(h, Browser(h), "bank", body["request_uri"])
        consumed = await h.store.find_code(token_hash(returned["code"]), h.now())
        assert consumed.code.client_id == "bank" and consumed.code.expires_at == h.now() + 60

        fields, _ = request_fields()
        response, body = await post_form(h, PAR, fields)
        returned = await sign_in_by_reference(h, Browser(h), "first", body["request_uri"])
        consumed = await h.store.find_code(token_hash(returned["code"]), h.now())
        assert consumed.code.expires_at == h.now() + 300
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_single_page_app_may_push_from_the_browser(tmp_path, monkeypatch):
    """
    CORS as at the token endpoint: a public client in a browser pushes its
    request (with a DPoP header, so the browser asks first) and reads the
    answer, refusals included; where PAR is not offered there is nothing to ask.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        exposed = ["WWW-Authenticate, DPoP-Nonce, Retry-After"]
        response, body = await h.request("OPTIONS", PAR, headers={
            "Origin": "http://127.0.0.1:9002", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "dpop"})
        assert response.code == 204, body
        assert response.headers.getRawHeaders("access-control-allow-origin") == ["*"]
        assert response.headers.getRawHeaders("access-control-allow-methods") == ["POST, OPTIONS"]
        assert response.headers.getRawHeaders("access-control-allow-headers") == ["Authorization, Content-Type, DPoP"]
        fields, _ = request_fields("spa")
        response, body = await h.json("POST", PAR, data={**fields, "client_id": "spa"},
                                      headers={"Origin": "http://127.0.0.1:9002"})
        assert response.code == 201, body
        assert response.headers.getRawHeaders("access-control-allow-origin") == ["*"]
        assert response.headers.getRawHeaders("access-control-expose-headers") == exposed
        response, body = await h.json("POST", PAR, data={**fields, "client_id": "spa", "redirect_uri": "https://x/"},
                                      headers={"Origin": "http://127.0.0.1:9002"})
        assert (response.code, body["error"]) == (400, "invalid_request")
        assert response.headers.getRawHeaders("access-control-allow-origin") == ["*"]
    finally:
        await h.close()
    (tmp_path / "off").mkdir()
    h = await started(tmp_path / "off", monkeypatch, {})
    try:
        response, _ = await h.request("OPTIONS", PAR)
        assert response.code == 404
        assert response.headers.getRawHeaders("access-control-allow-origin") is None
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_address_keeps_only_so_many_public_pushes_waiting(tmp_path, monkeypatch):
    """
    A pushed request stays in the store for its minute, with whatever the
    push carried (up to the body cap), and anyone may send a public client's
    id: an address once kept six thousand of them, hundreds of megabytes, at
    the default rate. Public pushes now count per address as waiting
    sign-ins do ([limits] pending_per_address per request_uri lifetime),
    whichever public client they name; confidential clients, and other
    addresses, are not held back.
    """
    config = {**OFFERED, "limits": {"pending_per_address": 3},
              "server": {"trusted_proxies": ["127.0.0.1"]}}
    h = await started(tmp_path, monkeypatch, config)
    try:
        here, there = {"X-Forwarded-For": "198.51.100.7"}, {"X-Forwarded-For": "203.0.113.8"}
        fields, _ = request_fields("spa")
        for _ in range(3):
            response, body = await h.json("POST", PAR, data={**fields, "client_id": "spa"}, headers=here)
            assert response.code == 201, body
        response, body = await h.json("POST", PAR, data={**fields, "client_id": "spa"}, headers=here)
        assert (response.code, body["error"]) == (429, "too_many_requests"), body
        assert response.headers.getRawHeaders(b"retry-after") == [b"20"]
        response, body = await h.json("POST", PAR, data={**fields, "client_id": "spa"}, headers=there)
        assert response.code == 201, "another address has its own count"
        first, _ = request_fields("first")
        for _ in range(4):
            response, body = await post_form(h, PAR, first, headers=here)
            assert response.code == 201, "an authenticated client's pushes count against its own rate only"
        h.clock.advance(20)
        response, body = await h.json("POST", PAR, data={**fields, "client_id": "spa"}, headers=here)
        assert response.code == 201, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_without_the_code_grant_cannot_push_a_request(tmp_path, monkeypatch):
    """RFC 6749 section 4.1.2.1, as at the authorization endpoint: unauthorized_client, nothing kept."""
    bot = {"client_id": "bot", "name": "Bot", "secret_env": "AUTHSRV_TEST_GATEWAY_SECRET",
           "grant_types": ["client_credentials"], "redirect_uris": ["http://127.0.0.1:9005/callback"]}
    h = await started(tmp_path, monkeypatch, {"par": {"enabled": True}, "clients": [*CLIENTS, bot]})
    try:
        fields, _ = request_fields("first", redirect_uri=bot["redirect_uris"][0])
        response, body = await h.json("POST", PAR, data={**fields, "client_id": "bot",
                                                          "client_secret": SECRETS["gateway"]})
        assert (response.code, body["error"]) == (400, "unauthorized_client"), body
    finally:
        await h.close()


SIGNING_KEY = jwk.JWK.generate(kty="EC", crv="P-256", kid="par-1")
HMAC_SECRET = "hmac-secret-Z8k2Lm5Qp9Rt3Wv7Xy1-Hq4Jd"
ASSERTING = [
    {"client_id": "signing", "token_endpoint_auth_method": "private_key_jwt",
     "jwks": json.dumps({"keys": [json.loads(SIGNING_KEY.export_public())]}),
     "redirect_uris": ["http://127.0.0.1:9011/callback"]},
    {"client_id": "hmac", "secret_env": "AUTHSRV_TEST_HMAC_SECRET", "token_endpoint_auth_method": "client_secret_jwt",
     "redirect_uris": ["http://127.0.0.1:9012/callback"]},
]


def client_assertion(client_id: str, aud, now: int) -> dict:
    """The assertion fields of C{client_id} (one of L{ASSERTING}) for C{aud}, with a fresh jti."""
    if client_id == "hmac":
        made = hmac_assertion(HMAC_SECRET, "hmac", aud, now)
    else:
        token = jwt.JWT(header={"alg": "ES256", "kid": "par-1"}, claims={
            "iss": client_id, "sub": client_id, "aud": aud, "iat": now, "exp": now + 60, "jti": uuid.uuid4().hex})
        token.make_signed_token(SIGNING_KEY)
        made = token.serialize()
    return {"client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            "client_assertion": made}


async def asserting_server(tmp_path, monkeypatch) -> Harness:
    monkeypatch.setenv("AUTHSRV_TEST_HMAC_SECRET", HMAC_SECRET)
    monkeypatch.setenv("AUTHSRV_TEST_CLIENT_SECRETS_KEY", new_key_text())
    return await started(tmp_path, monkeypatch, {
        "par": {"enabled": True}, "clients": [*CLIENTS, *ASSERTING],
        "client_secrets": {"encryption_key_env": "AUTHSRV_TEST_CLIENT_SECRETS_KEY"},
    })


@pytest_twisted.ensureDeferred
async def test_an_assertion_for_the_issuer_the_token_or_the_pushed_request_endpoint_pushes_once(
        tmp_path, monkeypatch):
    """
    RFC 9126 section 2: the pushed request endpoint takes a private_key_jwt or
    client_secret_jwt assertion whose aud is the issuer, the token endpoint
    or its own URL, each once; any other aud is refused and says what to name.
    """
    h = await asserting_server(tmp_path, monkeypatch)
    try:
        for spec in ASSERTING:
            client_id = spec["client_id"]
            fields, _ = request_fields(redirect_uri=spec["redirect_uris"][0])
            for aud in (ISSUER, ISSUER + "/oauth2/token", ISSUER + "/oauth2/par", [ISSUER + "/oauth2/par"]):
                data = {**fields, **client_assertion(client_id, aud, h.now())}
                response, body = await h.json("POST", PAR, data=data)
                assert response.code == 201, (client_id, aud, body)
                assert body["request_uri"].startswith(REQUEST_URI_PREFIX)
                response, body = await h.json("POST", PAR, data=data)
                assert (response.code, body["error"]) == (401, "invalid_client"), body
                assert "already used" in body["error_description"]
            for aud in (ISSUER + "/oauth2/introspect", ISSUER + "/oauth2/par/", "https://elsewhere.example"):
                response, body = await h.json("POST", PAR, data={**fields, **client_assertion(client_id, aud, h.now())})
                assert (response.code, body["error"]) == (401, "invalid_client"), body
                assert f"{ISSUER + '/oauth2/par'!r}" in body["error_description"], body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_fapi2_client_assertion_names_the_issuer_alone(tmp_path, monkeypatch):
    """
    FAPI 2.0 section 5.3.2.1: a fapi2 client's assertion names the issuer as
    one string; the token or pushed request endpoint, or a list, is refused
    at both (audience injection: another server the client trusts may have
    claimed one of those URLs as its own and had the client sign for it).
    """
    h = await asserting_server(tmp_path, monkeypatch)
    try:
        signing = await h.store.get_client("signing")
        await h.store.put_client(attrs.evolve(signing, client_id="bank", profile="fapi2"))
        fields, _ = request_fields(redirect_uri=signing.redirect_uris[0])
        fields = {**fields, "client_id": "bank"}
        response, body = await h.json("POST", PAR, data={**fields, **client_assertion("bank", ISSUER, h.now())})
        assert response.code == 201, body
        token_fields = {"grant_type": "authorization_code", "code": "unknown", "code_verifier": "v" * 43,
                        "redirect_uri": signing.redirect_uris[0]}
        for aud in (ISSUER + "/oauth2/token", ISSUER + "/oauth2/par", [ISSUER], [ISSUER, ISSUER + "/oauth2/par"]):
            for path, data in ((PAR, fields), (TOKEN, token_fields)):
                response, body = await h.json("POST", path, data={**data, **client_assertion("bank", aud, h.now())})
                assert (response.code, body["error"]) == (401, "invalid_client"), (path, aud, body)
                assert f"aud must be {ISSUER!r} (the issuer), as one string" in body["error_description"]
        response, body = await h.json("POST", TOKEN, data={**token_fields, **client_assertion("bank", ISSUER, h.now())})
        assert (response.code, body["error"]) == (400, "invalid_grant"), body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_assertion_for_the_pushed_request_endpoint_is_for_nothing_else(tmp_path, monkeypatch):
    """
    The token, introspection and revocation endpoints take the issuer or the
    token endpoint as aud (RFC 7523 section 3, OIDC Core section 9), not the
    pushed request endpoint's URL: an assertion is for the endpoint it names.
    """
    h = await asserting_server(tmp_path, monkeypatch)
    try:
        for client_id in ("signing", "hmac"):
            calls = (
                (TOKEN, {"grant_type": "authorization_code", "code": "unknown", "code_verifier": "v" * 43,
                         "redirect_uri": "http://127.0.0.1:9011/callback"}, 400),
                (INTROSPECT, {"token": "unknown"}, 200),
                (REVOKE, {"token": "unknown"}, 200),
            )
            for path, fields, authenticated in calls:
                response, body = await h.request("POST", path, data={
                    **fields, **client_assertion(client_id, ISSUER + "/oauth2/par", h.now())})
                assert response.code == 401 and b"invalid_client" in body, (path, body)
                assert b"/oauth2/par" not in body, "an endpoint names only the audiences it takes"
                for aud in (ISSUER, ISSUER + "/oauth2/token"):
                    response, body = await h.request("POST", path, data={
                        **fields, **client_assertion(client_id, aud, h.now())})
                    assert response.code == authenticated, (path, aud, body)
    finally:
        await h.close()
