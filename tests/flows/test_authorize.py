"""
The authorization endpoint in memory: which mistakes stay on the service's
own error page and which go back to the client, what a code is bound to,
and when a user with a session is asked again (prompt, max_age).
"""

from __future__ import annotations

import json
from urllib.parse import quote_from_bytes, urlencode

import pytest_twisted
from hypothesis import given, settings
from hypothesis import strategies as st
from jwcrypto import jwk, jws

from flow_client import Browser, fuzz, hidden_fields, location, on_reactor, shows_login_form
from harness import CLIENTS, ISSUER, Harness, pkce_pair, query_of

from authsrv.flows.passkeys import PasskeyAccepted, Passkeys
from authsrv.records import Passkey
from authsrv.store.codes import CodeFound
from authsrv.testing.identity import ALICE, BOB, PASSWORDS
from authsrv.tokens import token_hash

FIRST_REDIRECT = "http://127.0.0.1:9000/callback"
PARTNER_REDIRECT = "http://127.0.0.1:9001/callback"
API = "https://api.example.test"


async def started(tmp_path, monkeypatch, config=None) -> Harness:
    return await Harness(tmp_path, monkeypatch, config).start()


def assert_error_page(response, body, words: str):
    assert response.code == 400, body
    assert not response.headers.hasHeader(b"location")
    assert response.headers.getRawHeaders(b"x-frame-options") == [b"DENY"]
    assert b"frame-ancestors 'none'" in response.headers.getRawHeaders(b"content-security-policy")[0]
    assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/html")
    assert words.encode() in body


def assert_error_redirect(response, error: str, redirect_uri=FIRST_REDIRECT, state="st4te", status=302) -> dict:
    assert response.code == status
    assert location(response).startswith(redirect_uri + "?")
    assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
    query = query_of(location(response))
    assert query["error"] == error
    assert query["error_description"]
    assert query["iss"] == ISSUER
    assert query.get("state") == state
    assert "code" not in query
    return query


@pytest_twisted.ensureDeferred
async def test_unknown_client_or_unregistered_redirect_uri_is_a_page_never_a_redirect(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        valid = {
            "response_type": "code", "scope": "openid", "state": "s",
            "code_challenge": pkce_pair()[1], "code_challenge_method": "S256",
        }
        cases = [
            ({"client_id": "nobody", "redirect_uri": FIRST_REDIRECT}, "not known"),
            ({"redirect_uri": FIRST_REDIRECT}, "client_id is missing"),
            ({"client_id": "x" * 500, "redirect_uri": FIRST_REDIRECT}, "client_id is too long"),
            ({"client_id": "first"}, "redirect_uri is missing"),
            ({"client_id": "first", "redirect_uri": "https://evil.example/callback"}, "has not registered"),
            ({"client_id": "first", "redirect_uri": FIRST_REDIRECT + "/"}, "has not registered"),
            ({"client_id": "first", "redirect_uri": FIRST_REDIRECT + "?x=1"}, "has not registered"),
            ({"client_id": "first", "redirect_uri": PARTNER_REDIRECT.replace("/callback", "/elsewhere")},
             "has not registered"),
            ({"client_id": "first", "redirect_uri": FIRST_REDIRECT.replace("127.0.0.1", "127.0.0.2")},
             "has not registered"),
        ]
        for params, words in cases:
            response, body = await Browser(h).get(ISSUER + "/oauth2/authorize?" + urlencode({**valid, **params}))
            assert_error_page(response, body, words)
        redirect = quote_from_bytes(FIRST_REDIRECT.encode(), safe="")
        malformed = [
            ("client_id=first&client_id=first&redirect_uri=" + redirect, "client_id is repeated"),
            ("client_id=first&redirect_uri=a&redirect_uri=" + redirect, "redirect_uri is repeated"),
            ("client_id=%ff&redirect_uri=" + redirect, "client_id is not UTF-8 text"),
            ("client_id=first&redirect_uri=%ff", "redirect_uri is not UTF-8 text"),
            ("client_id=a%00b&redirect_uri=" + redirect, "client_id holds a NUL character"),
        ]
        for query, words in malformed:
            response, body = await Browser(h).get(ISSUER + "/oauth2/authorize?" + query + "&" + urlencode(valid))
            assert_error_page(response, body, words)
    finally:
        await h.close()


REDIRECTED_ERRORS = [
    ({"response_type": "token"}, "unsupported_response_type"),
    ({"response_type": "code id_token"}, "unsupported_response_type"),
    ({"response_type": None}, "invalid_request"),
    ({"code_challenge": None}, "invalid_request"),
    ({"code_challenge": "too-short"}, "invalid_request"),
    ({"code_challenge": "!" * 43}, "invalid_request"),
    ({"code_challenge": "A" * 43 + "\n"}, "invalid_request"),
    ({"code_challenge_method": "plain"}, "invalid_request"),
    ({"code_challenge_method": None}, "invalid_request"),
    ({"scope": None}, "invalid_request"),
    ({"scope": "OPENID"}, "invalid_scope"),
    ({"scope": "address phone"}, "invalid_scope"),
    ({"scope": " "}, "invalid_scope"),
    ({"resource": "https://other.example.test"}, "invalid_target"),
    ({"resource": "/relative"}, "invalid_target"),
    ({"resource": API + "#frag"}, "invalid_target"),
    ({"prompt": "none login"}, "invalid_request"),
    ({"prompt": "select_account"}, "invalid_request"),
    ({"max_age": "-1"}, "invalid_request"),
    ({"max_age": "ten"}, "invalid_request"),
    ({"max_age": "1" * 30}, "invalid_request"),
    ({"request": "eyJhbGciOiJub25lIn0.e30."}, "request_not_supported"),
    ({"request_uri": "https://client.example/request.jwt"}, "request_uri_not_supported"),
    ({"response_mode": "fragment"}, "invalid_request"),
    ({"response_mode": "form_post"}, "invalid_request"),
    ({"claims": "[]"}, "invalid_request"),
    ({"claims": '{"userinfo": "name"}'}, "invalid_request"),
    ({"claims": '{"id_token": {"acr": "urn:authsrv:acr:mfa"}}'}, "invalid_request"),
]


@pytest_twisted.ensureDeferred
async def test_every_error_after_the_client_is_known_goes_back_with_state_and_iss(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        for params, error in REDIRECTED_ERRORS:
            response, _ = await Browser(h).get(h.authorize_url("first", **params))
            assert_error_redirect(response, error)
        response, _ = await Browser(h).get(h.authorize_url("first", state=None))
        assert_error_redirect(response, "invalid_request", state=None)
        response, _ = await Browser(h).get(h.authorize_url("first") + "&scope=openid")
        assert_error_redirect(response, "invalid_request")
        response, _ = await Browser(h).get(h.authorize_url("first") + "&nonce=%ff")
        assert_error_redirect(response, "invalid_request")
        response, _ = await Browser(h).get(h.authorize_url("first", state=None) + "&state=a&state=b")
        assert_error_redirect(response, "invalid_request", state=None)
        response, _ = await Browser(h).get(h.authorize_url("first", resource=API) + "&resource=https://other.example.test")
        assert_error_redirect(response, "invalid_target")
        response, _ = await Browser(h).get(h.authorize_url("partner", resource=API))
        assert_error_redirect(response, "invalid_target", redirect_uri=PARTNER_REDIRECT)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_without_the_code_grant_is_unauthorized_at_authorize(tmp_path, monkeypatch):
    """
    RFC 6749 section 4.1.2.1: a client registered without the
    authorization_code grant (a machine client that kept a redirect URI)
    hears unauthorized_client at once, rather than have its user sign in and
    consent for a code the token endpoint would never redeem.
    """
    bot_redirect = "http://127.0.0.1:9004/callback"
    bot = {"client_id": "bot", "name": "Bot", "secret_env": "AUTHSRV_TEST_GATEWAY_SECRET",
           "grant_types": ["client_credentials"], "redirect_uris": [bot_redirect]}
    h = await started(tmp_path, monkeypatch, {"clients": [*CLIENTS, bot]})
    try:
        browser = Browser(h)
        response, body = await browser.get(h.authorize_url("bot", redirect_uri=bot_redirect))
        assert_error_redirect(response, "unauthorized_client", redirect_uri=bot_redirect)
        response, body = await browser.get(h.authorize_url("bot", redirect_uri=bot_redirect, prompt="none"))
        assert_error_redirect(response, "unauthorized_client", redirect_uri=bot_redirect)
        response, body = await browser.get(h.authorize_url("bot", redirect_uri="http://127.0.0.1:9004/other"))
        assert response.code == 400 and not response.headers.hasHeader(b"location")
    finally:
        await h.close()


ATTACKER_TEXT = '<script>alert("x")</script>\u202e\u00e9'


@pytest_twisted.ensureDeferred
async def test_error_descriptions_never_echo_the_request(tmp_path, monkeypatch):
    """Only the server's own text goes back, in the characters RFC 6749 section 4.1.2.1 allows."""
    allowed = set(chr(c) for c in range(0x20, 0x7F)) - {'"', "\\"}
    h = await started(tmp_path, monkeypatch)
    try:
        for params in ({"scope": "openid " + ATTACKER_TEXT}, {"prompt": ATTACKER_TEXT},
                       {"resource": "https://x.example/" + ATTACKER_TEXT},
                       {"claims": json.dumps({"userinfo": {"https://x.example/ " + ATTACKER_TEXT: 1}})}):
            response, _ = await Browser(h).get(h.authorize_url("first", **params))
            query = query_of(location(response))
            assert "script" not in query["error_description"] and "x.example" not in query["error_description"]
            assert set(query["error_description"]) <= allowed
        repeated = h.authorize_url("first") + "&" + "&".join(["nonce=%3Cscript%3E"] * 2)
        response, _ = await Browser(h).get(repeated)
        query = assert_error_redirect(response, "invalid_request")
        assert "script" not in query["error_description"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_valid_requests_with_unknown_extras_go_on_to_the_login(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        claims = json.dumps({"userinfo": {"name": {"essential": True}, "email": None}, "id_token": {"auth_time": None}})
        for extra in ({}, {"ui_locales": "fr", "foo": "bar", "claims": "{}"}, {"scope": "email openid email"},
                      {"claims": claims},
                      {"resource": API}, {"prompt": "login consent"}, {"max_age": "0"}, {"nonce": ""}):
            response, body = await Browser(h).get(h.authorize_url("first", **extra))
            assert shows_login_form(response, body), (extra, body)
            assert f'action="{ISSUER}/login"'.encode() in body
            assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
        answer = await Browser(h).post(ISSUER + "/oauth2/authorize", query_of(h.authorize_url("first")))
        assert shows_login_form(*answer)
        # RFC 6749 section 3.1: a parameter the server does not know is ignored, even repeated or not UTF-8.
        response, body = await Browser(h).get(h.authorize_url("first") + "&foo=1&foo=2&bar=%ff")
        assert shows_login_form(response, body), body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_scope_values_the_server_does_not_offer_are_ignored(tmp_path, monkeypatch):
    """
    OIDC Core 3.1.2.1 (the conformance suite's oidcc-scope-address, -phone
    and -all): a value not understood is ignored, not an error, and the code
    carries only the values offered; the consent page names only those.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        query = await browser.sign_in(ALICE, "first", scope="openid address email phone admin")
        result = await h.store.find_code(token_hash(query["code"]), h.now())
        assert result.code.scope == {"openid", "email"}
        response, _ = await browser.authorize("partner", scope="phone openid address")
        consent, body = await browser.get(location(response))
        assert consent.code == 200 and b"address" not in body and b"phone" not in body
        query = query_of(location((await browser.answer_consent(location(response), "approve"))[0]))
        result = await h.store.find_code(token_hash(query["code"]), h.now())
        assert result.code.scope == {"openid"}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_loopback_redirect_uri_may_name_any_port(tmp_path, monkeypatch):
    """RFC 8252 section 7.3: a native app listens on whichever port the system gave it for this request."""
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        elsewhere = FIRST_REDIRECT.replace(":9000/", ":51234/")
        response, body = await browser.authorize("first", redirect_uri=elsewhere)
        assert response.code == 200, body
        [csp] = response.headers.getRawHeaders(b"content-security-policy")
        assert csp.endswith(b"form-action 'self' http://127.0.0.1:51234"), csp
        response, _ = await browser.submit_login(response, ALICE.login, PASSWORDS[ALICE.sub])
        assert location(response).startswith(elsewhere + "?")
        code = await h.store.find_code(token_hash(query_of(location(response))["code"]), h.now())
        assert code.code.redirect_uri == elsewhere
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_code_is_stored_bound_to_everything_the_request_said(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        _, challenge = pkce_pair()
        query = await browser.sign_in(ALICE, "first", scope="openid email offline_access", challenge=challenge,
                                      nonce="n-0S6", resource=API, state="xyz")
        assert set(query) == {"code", "state", "iss"}
        assert query["state"] == "xyz" and query["iss"] == ISSUER
        session = await h.store.get_session(browser.session_hash, h.now())
        result = await h.store.find_code(token_hash(query["code"]), h.now())
        assert isinstance(result, CodeFound)
        code = result.code
        assert (code.client_id, code.sub, code.redirect_uri) == ("first", ALICE.sub, FIRST_REDIRECT)
        assert code.scope == {"openid", "email", "offline_access"}
        assert (code.code_challenge, code.code_challenge_method) == (challenge, "S256")
        assert code.nonce == "n-0S6" and code.resource == (API,)
        assert (code.auth_time, code.sid) == (session.auth_time, session.sid)
        assert code.issued_at == h.now() and code.expires_at == h.now() + h.config.limits.code_ttl
        grant = await h.store.get_grant(code.grant_id)
        assert (grant.client_id, grant.sub, grant.scope, grant.resource) == ("first", ALICE.sub, code.scope, (API,))
        assert (grant.auth_time, grant.sid) == (session.auth_time, session.sid)
        assert grant.expires_at == h.now() + h.config.limits.refresh_token_absolute_ttl
        assert code.code_hash == token_hash(query["code"])
        assert query["code"] not in repr(code)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_live_session_skips_the_login_and_prompt_login_or_max_age_ask_again(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE, "first")
        first = await h.store.get_session(browser.session_hash, h.now())
        h.clock.advance(100)
        response, _ = await browser.authorize("first")
        assert response.code == 302 and "code" in query_of(location(response))
        again = await h.store.find_code(token_hash(query_of(location(response))["code"]), h.now())
        assert (again.code.sid, again.code.auth_time) == (first.sid, first.auth_time)
        response, _ = await browser.authorize("first", max_age="500")
        assert response.code == 302 and "code" in query_of(location(response))
        for asking in ({"max_age": "50"}, {"max_age": "0"}, {"prompt": "login"}):
            assert shows_login_form(*await browser.authorize("first", **asking)), asking
        query = await browser.sign_in(ALICE, "first", prompt="login")
        relogged = await h.store.find_code(token_hash(query["code"]), h.now())
        # The same user signed in again: a new cookie, the session carried on under its sid.
        assert relogged.code.auth_time == h.now() and relogged.code.sid == first.sid
        assert await h.store.get_session(first.session_hash, h.now()) is None
        assert browser.session_hash != first.session_hash
        response, _ = await browser.authorize("first", max_age="50")
        assert response.code == 302
    finally:
        await h.close()


def id_token_of(h: Harness, sub: str, key=None, aud="first") -> str:
    now = h.now()
    claims = {"iss": ISSUER, "sub": sub, "aud": aud, "iat": now - 7200, "exp": now - 3600, "auth_time": now}
    if key is None:
        return h.keystore.sign(claims, "RS256", "JWT")
    token = jws.JWS(json.dumps(claims).encode())
    token.add_signature(key, "RS256", protected=json.dumps({"alg": "RS256", "kid": key.get("kid")}))
    return token.serialize(compact=True)


@pytest_twisted.ensureDeferred
async def test_an_id_token_hint_for_another_user_asks_for_a_sign_in(tmp_path, monkeypatch):
    """
    OIDC Core section 3.1.2.1: the client expects the user its (perhaps
    expired) ID token names; another user signed in here is asked to sign
    in again, or with prompt=none the client hears login_required.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE, "first")
        response, _ = await browser.authorize("first", id_token_hint=id_token_of(h, ALICE.sub), prompt="none")
        assert "code" in query_of(location(response))
        response, _ = await browser.authorize("first", id_token_hint=id_token_of(h, BOB.sub), prompt="none")
        assert_error_redirect(response, "login_required", state="st4te")
        response, body = await browser.authorize("first", id_token_hint=id_token_of(h, BOB.sub))
        assert shows_login_form(response, body)
        assert f'value="{BOB.login}"'.encode() in body, "the form shows the user the client expects"
        stranger = jwk.JWK.generate(kty="RSA", size=2048, kid="stranger")
        for hint in (id_token_of(h, ALICE.sub, key=stranger), "not-a-token"):
            response, _ = await browser.authorize("first", id_token_hint=hint)
            assert_error_redirect(response, "invalid_request", state="st4te")
    finally:
        await h.close()


async def signed_in_on_hint(browser: Browser, hinted, user, client_id="first", **params):
    """The answer when C{user} signs in with a password on the sign-in an id_token_hint for C{hinted} asks for."""
    response, body = await browser.authorize(client_id, id_token_hint=id_token_of(browser.h, hinted.sub, aud=client_id),
                                             **params)
    assert shows_login_form(response, body)
    return await browser.submit_login(response, user.login, PASSWORDS[user.sub])


@pytest_twisted.ensureDeferred
async def test_the_sign_in_an_id_token_hint_asks_for_gives_a_code_only_to_its_user(tmp_path, monkeypatch, audit):
    """
    OIDC Core section 3.1.2.1: the hinted user signing in gets a code;
    another user who signs in on that form (before any consent page, and
    also when the hinted user was signed in and asked to sign in again) gets
    login_required, audited, and neither code, grant nor session here; the
    hinted user's earlier session stays.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, _ = await signed_in_on_hint(browser, BOB, BOB)
        found = await h.store.find_code(token_hash(query_of(location(response))["code"]), h.now())
        assert found.code.sub == BOB.sub
        for client_id, redirect_uri in (("first", FIRST_REDIRECT), ("partner", PARTNER_REDIRECT)):
            other = Browser(h)
            response, _ = await signed_in_on_hint(other, BOB, ALICE, client_id)
            query = assert_error_redirect(response, "login_required", redirect_uri, status=303)
            assert "sign in as that user" in query["error_description"]
            assert other.session_hash is None
        response, _ = await signed_in_on_hint(browser, BOB, ALICE, prompt="login")
        assert_error_redirect(response, "login_required", status=303)
        assert (await h.store.get_session(browser.session_hash, h.now())).sub == BOB.sub
        assert await h.store.list_user_grants(ALICE.sub, h.now()) == []
        assert [event["sub"] for event in audit.of("code.issued")] == [BOB.sub]
        mismatches = [(e["sub"], e["hinted_sub"], e["client_id"]) for e in audit.of("login.hint_mismatch")]
        assert mismatches == [(ALICE.sub, BOB.sub, client_id) for client_id in ("first", "partner", "first")]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_passkey_sign_in_on_an_id_token_hint_gives_a_code_only_to_its_user(tmp_path, monkeypatch, audit):
    """A passkey of another user than the hinted one ends in login_required, audited, as a password does."""
    h = await started(tmp_path, monkeypatch)
    passkey = Passkey("cred-1", ALICE.sub, b"key", 1, False, False, (), h.now())

    async def accepted(self, interaction_id, credential_json, address, now, sub=None):
        return PasskeyAccepted(passkey)

    async def with_passkey_on_hint(hinted):
        browser = Browser(h)
        response, body = await browser.authorize("first", id_token_hint=id_token_of(h, hinted.sub))
        assert shows_login_form(response, body)
        response, _ = await browser.post(ISSUER + "/login/passkey", {**hidden_fields(body), "credential": "{}"})
        return response

    monkeypatch.setattr(Passkeys, "authenticate", accepted)
    try:
        assert "code" in query_of(location(await with_passkey_on_hint(ALICE)))
        assert_error_redirect(await with_passkey_on_hint(BOB), "login_required", status=303)
        assert [(e["sub"], e["hinted_sub"]) for e in audit.of("login.hint_mismatch")] == [(ALICE.sub, BOB.sub)]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_id_token_hint_issued_to_another_client_is_invalid_request(tmp_path, monkeypatch, audit):
    """
    OIDC Core section 3.1.2.1: the hint is an ID token of the user's session
    with the client that sends it; one issued to another client (leaked to,
    or passed along by, this one) is refused, as node-oidc-provider does,
    with nothing shown to the user and no code.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE, "first")
        for hint in (id_token_of(h, ALICE.sub, aud="partner"), id_token_of(h, ALICE.sub, aud=["partner", "other"]),
                     id_token_of(h, ALICE.sub, aud=None)):
            for prompt in (None, "none"):
                response, _ = await browser.authorize("first", id_token_hint=hint, prompt=prompt)
                query = assert_error_redirect(response, "invalid_request", state="st4te")
                assert "issued to another client" in query["error_description"]
        assert len(audit.of("code.issued")) == 1
        for aud in (["first", "partner"], "first"):
            response, _ = await browser.authorize("first", id_token_hint=id_token_of(h, ALICE.sub, aud=aud),
                                                  prompt="none")
            assert "code" in query_of(location(response)), aud
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_token_of_ours_that_is_no_id_token_is_no_id_token_hint(tmp_path, monkeypatch):
    """
    Our signature is not enough: a JWT access token (typ at+jwt), a logout
    token (logout+jwt) and a signed UserInfo answer (typ JWT, iss, aud and
    sub, but no iat or exp: OIDC Core sections 2 and 5.3.2) name the user
    for this client too, and are invalid_request all the same.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        await browser.sign_in(ALICE, "first")
        now = h.now()
        claims = {"iss": ISSUER, "sub": ALICE.sub, "aud": "first", "iat": now, "exp": now + 60}
        for hint in (h.keystore.sign(claims, "RS256", "at+jwt"), h.keystore.sign(claims, "RS256", "logout+jwt"),
                     h.keystore.sign({"iss": ISSUER, "aud": "first", "sub": ALICE.sub}, "RS256", "JWT")):
            response, _ = await browser.authorize("first", id_token_hint=hint, prompt="none")
            query = assert_error_redirect(response, "invalid_request", state="st4te")
            assert "not an ID token this server issued" in query["error_description"]
        response, _ = await browser.authorize("first", id_token_hint=h.keystore.sign(claims, "RS256", "JWT"),
                                              prompt="none")
        assert "code" in query_of(location(response))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_id_token_hint_signed_by_a_key_no_longer_published_is_accepted(tmp_path, monkeypatch):
    """
    The client's session outlived a rotation and the pruning of the key
    that signed its ID token: the hint still names its user, for a browser
    session's lifetime after the rotation.
    """
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        hint = id_token_of(h, ALICE.sub)
        kid = jws.JWS.from_jose_token(hint).jose_header["kid"]
        await h.keystore.rotate(h.now())
        h.clock.advance(2 * 86400)
        await h.keystore.maintain(h.now())
        assert kid.encode() not in h.keystore.jwks_bytes()
        await browser.sign_in(ALICE, "first")
        response, _ = await browser.authorize("first", id_token_hint=hint, prompt="none")
        assert "code" in query_of(location(response))
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_prompt_none_never_shows_a_page(tmp_path, monkeypatch):
    h = await started(tmp_path, monkeypatch)
    try:
        browser = Browser(h)
        response, _ = await browser.authorize("first", prompt="none")
        assert_error_redirect(response, "login_required")
        await browser.sign_in(BOB, "first")
        response, _ = await browser.authorize("first", prompt="none", state="again")
        query = query_of(location(response))
        assert response.code == 302 and query["state"] == "again" and query["iss"] == ISSUER and "code" in query
        response, _ = await browser.authorize("first", prompt="none", max_age="0")
        assert_error_redirect(response, "login_required")
        response, _ = await browser.authorize("partner", prompt="none")
        assert_error_redirect(response, "consent_required", redirect_uri=PARTNER_REDIRECT)
        await browser.sign_in(BOB, "partner", scope="openid profile")
        response, _ = await browser.authorize("partner", prompt="none", scope="openid")
        assert response.code == 302 and "code" in query_of(location(response))
        response, _ = await browser.authorize("partner", prompt="none", scope="openid email")
        assert_error_redirect(response, "consent_required", redirect_uri=PARTNER_REDIRECT)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_redirects_keep_the_query_the_registered_uri_has(tmp_path, monkeypatch):
    tenant = "http://127.0.0.1:9004/cb?tenant=a%20b"
    clients = [*CLIENTS, {"client_id": "tenant", "first_party": True, "redirect_uris": [tenant]}]
    h = await started(tmp_path, monkeypatch, {"clients": clients})
    try:
        browser = Browser(h)
        query = await browser.sign_in(ALICE, "tenant", redirect_uri=tenant)
        assert query["tenant"] == "a b" and "code" in query and query["iss"] == ISSUER
        response, _ = await browser.authorize("tenant", redirect_uri=tenant, scope="nope")
        assert location(response).startswith(tenant + "&")
        assert query_of(location(response))["error"] == "invalid_scope"
    finally:
        await h.close()


AUTHORIZE_NAMES = [
    "response_type", "client_id", "redirect_uri", "scope", "state", "nonce", "code_challenge",
    "code_challenge_method", "resource", "prompt", "max_age", "login_hint", "request", "request_uri",
    "response_mode",
]
VALID = {
    "response_type": "code", "client_id": "first", "redirect_uri": FIRST_REDIRECT, "scope": "openid",
    "state": "s", "code_challenge": pkce_pair()[1], "code_challenge_method": "S256",
}
_values = st.one_of(
    st.text(max_size=40).map(str.encode),
    st.binary(max_size=20),
    st.sampled_from([v.encode() for v in VALID.values()] + [b"none", b"login", b"0", API.encode(), b""]),
)
_names = st.sampled_from(AUTHORIZE_NAMES).map(str.encode)
_pairs = st.lists(st.tuples(_names | st.text(max_size=8).map(str.encode), _values), max_size=4)


@pytest_twisted.ensureDeferred
async def test_no_authorize_query_gets_a_server_error(tmp_path, monkeypatch):
    """
    Hypothesis: a valid request (or none) with some parameters replaced by
    arbitrary text or bytes, plus repeated and unknown keys, by GET and POST.
    """
    h = await started(tmp_path, monkeypatch)

    @settings(max_examples=200, deadline=None)
    @given(base=st.booleans(), replaced=st.dictionaries(_names, _values, max_size=3), extra=_pairs,
           method=st.sampled_from(["GET", "POST"]))
    def check(base, replaced, extra, method):
        items = {k.encode(): v.encode() for k, v in VALID.items()} if base else {}
        items.update(replaced)
        query = "&".join(quote_from_bytes(k) + "=" + quote_from_bytes(v) for k, v in [*items.items(), *extra])
        if method == "GET":
            response, body = on_reactor(lambda: Browser(h).get(ISSUER + "/oauth2/authorize?" + query))
        else:
            response, body = on_reactor(lambda: Browser(h).request(
                "POST", ISSUER + "/oauth2/authorize", data=query.encode(),
                headers={"content-type": ["application/x-www-form-urlencoded"]}))
        assert response.code in (200, 302, 400), body
        if response.code == 200:
            assert shows_login_form(response, body)
        if response.code == 302:
            assert "error" in query_of(location(response))

    try:
        await fuzz(check)
    finally:
        await h.close()
