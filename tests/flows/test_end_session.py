"""
RP-initiated logout at {issuer}/oauth2/end-session, in memory through the
harness: the browser session ends and its cookie is cleared, the browser
goes back to a registered URI with its state, and every request that cannot
prove it comes from a client we issued an ID token to gets an error page,
never a redirect and never a 500.
"""

from __future__ import annotations

import base64
import json
import re
from contextlib import asynccontextmanager
from urllib.parse import quote_from_bytes, urlencode

import pytest
import pytest_twisted
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jwcrypto.jwk import JWK
from jwcrypto.jwt import JWT
from twisted.internet.defer import Deferred

from authsrv.protocol.errors import PageError
from authsrv.protocol.logout import hint_claims
from authsrv.records import BrowserSession
from authsrv.testing.identity import ALICE, BOB
from authsrv.tokens import new_token, token_hash

from harness import ISSUER, SPOOF, Harness

END_SESSION = ISSUER + "/oauth2/end-session"
FIRST_LOGOUT_URI = "http://127.0.0.1:9000/"
DAY = 86400


@asynccontextmanager
async def running(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        yield h
    finally:
        await h.close()


def id_token(h: Harness, sub: str = ALICE.sub, aud="first", sid: str = "sid-1", **changes) -> str:
    """An ID token signed the way the token endpoint signs one."""
    now = h.now()
    claims = {"iss": ISSUER, "sub": sub, "aud": aud, "iat": now, "exp": now + 3600, "auth_time": now, "sid": sid}
    claims.update(changes)
    return h.keystore.sign({k: v for k, v in claims.items() if v is not None}, "RS256", "JWT")


async def browser_session(h: Harness, sub: str = ALICE.sub, sid: str = "sid-1") -> str:
    """Log a browser in directly in the store; returns its cookie value."""
    value = new_token()
    now = h.now()
    await h.store.create_session(BrowserSession(token_hash(value), sid, sub, now, now, now + 14 * DAY))
    return value


async def session_alive(h: Harness, value: str) -> bool:
    return await h.store.get_session(token_hash(value), h.now()) is not None


def cleared_cookie(response) -> str:
    cookies = [c.decode() for c in response.headers.getRawHeaders(b"set-cookie", [])]
    [cookie] = [c for c in cookies if c.startswith("authsrv_session=")]
    return cookie


def assert_page_headers(response) -> None:
    assert response.headers.getRawHeaders(b"content-type") == [b"text/html; charset=utf-8"]
    assert response.headers.getRawHeaders(b"x-frame-options") == [b"DENY"]
    [csp] = response.headers.getRawHeaders(b"content-security-policy")
    assert b"frame-ancestors 'none'" in csp
    assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]


def assert_refused(response, body: bytes, words: str) -> None:
    """A 400 error page, no redirect, the session cookie left alone."""
    assert response.code == 400, body
    assert not response.headers.hasHeader(b"location")
    assert not response.headers.hasHeader(b"set-cookie")
    assert_page_headers(response)
    assert words in body.decode()


async def assert_hints_refused(h: Harness, cookie: str, hints: dict[str, str]) -> None:
    """Each hint gets the error page and the browser's session lives on."""
    for name, hint in hints.items():
        response, body = await h.get(
            END_SESSION,
            params={"id_token_hint": hint, "post_logout_redirect_uri": FIRST_LOGOUT_URI, "state": "s"},
            cookies={"authsrv_session": cookie},
        )
        assert response.code == 400, name
        assert_refused(response, body, "Sign-out failed")
    assert await session_alive(h, cookie)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# --- success ------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_redirect_with_state_ends_the_session_and_clears_the_cookie(tmp_path, monkeypatch, audit):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        other = await browser_session(h, sub=BOB.sub, sid="sid-bob")
        response, body = await h.get(
            END_SESSION,
            params={"id_token_hint": id_token(h), "post_logout_redirect_uri": FIRST_LOGOUT_URI, "state": "a b&c=d"},
            cookies={"authsrv_session": cookie},
        )
        assert response.code == 302, body
        assert response.headers.getRawHeaders(b"location") == [b"http://127.0.0.1:9000/?state=a+b%26c%3Dd"]
        assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
        set_cookie = cleared_cookie(response)
        assert set_cookie.startswith("authsrv_session=;")
        assert "Max-Age=0" in set_cookie and "Path=/api/auth" in set_cookie and "HttpOnly" in set_cookie
        assert not await session_alive(h, cookie)
        assert await session_alive(h, other)
        [ended] = audit.of("session.ended")
        assert (ended["sub"], ended["session_id"]) == (ALICE.sub, "sid-1")
        assert "first" in ended["reason"]
        assert cookie not in repr(audit)


@pytest_twisted.ensureDeferred
async def test_redirect_keeps_the_registered_query(tmp_path, monkeypatch):
    clients = [
        {
            "client_id": "first",
            "redirect_uris": ["http://127.0.0.1:9000/callback"],
            "post_logout_redirect_uris": ["http://127.0.0.1:9000/bye?from=idp"],
            "end_session_enabled": True,
        }
    ]
    h = await Harness(tmp_path, monkeypatch, {"clients": clients}).start()
    try:
        response, _ = await h.get(
            END_SESSION,
            params={"id_token_hint": id_token(h), "post_logout_redirect_uri": "http://127.0.0.1:9000/bye?from=idp",
                    "state": "s1"},
        )
        assert response.headers.getRawHeaders(b"location") == [b"http://127.0.0.1:9000/bye?from=idp&state=s1"]
        response, _ = await h.get(
            END_SESSION,
            params={"id_token_hint": id_token(h), "post_logout_redirect_uri": "http://127.0.0.1:9000/bye?from=idp"},
        )
        assert response.headers.getRawHeaders(b"location") == [b"http://127.0.0.1:9000/bye?from=idp"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_without_redirect_uri_a_signed_out_page(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        response, body = await h.get(
            END_SESSION, params={"id_token_hint": id_token(h), "state": "ignored"}, cookies={"authsrv_session": cookie}
        )
        assert response.code == 200
        assert not response.headers.hasHeader(b"location")
        assert_page_headers(response)
        assert "You are signed out" in body.decode()
        assert "Max-Age=0" in cleared_cookie(response)
        assert not await session_alive(h, cookie)


@pytest_twisted.ensureDeferred
async def test_post_form(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        response, _ = await h.post(
            END_SESSION,
            data={"id_token_hint": id_token(h), "client_id": "first", "post_logout_redirect_uri": FIRST_LOGOUT_URI,
                  "state": "xyz"},
            cookies={"authsrv_session": cookie},
        )
        assert response.code == 302
        assert response.headers.getRawHeaders(b"location") == [b"http://127.0.0.1:9000/?state=xyz"]
        assert not await session_alive(h, cookie)


@pytest_twisted.ensureDeferred
async def test_a_form_posted_without_the_session_cookie_is_made_again_as_a_get(tmp_path, monkeypatch, audit):
    """
    A client's sign-out form posted from its own site reaches us without
    the SameSite=Lax session cookie: the session cannot be known, so the
    checked request is sent back as a GET (303), a top-level navigation
    that carries the cookie, instead of a redirect to the client that would
    leave the session, and every other client's, signed in here.
    """
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        form = {"id_token_hint": id_token(h), "client_id": "first", "post_logout_redirect_uri": FIRST_LOGOUT_URI,
                "state": "xyz", "ui_locales": "en", "confirm": "yes", "csrf": "0" * 64}
        response, _ = await h.post(END_SESSION, data=form)
        assert response.code == 303
        assert not response.headers.hasHeader(b"set-cookie")
        assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
        [location] = response.headers.getRawHeaders(b"location")
        kept = ("id_token_hint", "client_id", "post_logout_redirect_uri", "state")
        assert location.decode() == END_SESSION + "?" + urlencode({name: form[name] for name in kept})
        assert await session_alive(h, cookie) and not audit.of("session.ended")

        response, _ = await h.get(location.decode(), cookies={"authsrv_session": cookie})
        assert response.code == 302
        assert response.headers.getRawHeaders(b"location") == [b"http://127.0.0.1:9000/?state=xyz"]
        assert not await session_alive(h, cookie)

        for refused in ({**form, "id_token_hint": id_token(h)[:-4] + "AAAA"},
                        {**form, "post_logout_redirect_uri": "https://elsewhere.example/"}):
            response, body = await h.post(END_SESSION, data=refused)
            assert_refused(response, body, "Sign-out failed")


@pytest_twisted.ensureDeferred
async def test_expired_hint_is_accepted(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        hint = id_token(h)
        h.clock.advance(30 * DAY)
        cookie = await browser_session(h)
        response, body = await h.get(
            END_SESSION,
            params={"id_token_hint": hint, "post_logout_redirect_uri": FIRST_LOGOUT_URI},
            cookies={"authsrv_session": cookie},
        )
        assert response.code == 302, body
        assert not await session_alive(h, cookie)


async def rotated_away(h: Harness, hint: str, days: int) -> None:
    """Rotate the keys, let C{days} pass and prune: the hint's key is no longer published."""
    kid = JWT(jwt=hint).token.jose_header["kid"]
    await h.keystore.rotate(h.now())
    h.clock.advance(days * DAY)
    await h.keystore.maintain(h.now())
    assert kid not in {info.kid for info in h.keystore.keys()}
    assert kid.encode() not in h.keystore.jwks_bytes()


@pytest_twisted.ensureDeferred
async def test_hint_signed_by_a_key_no_longer_published_is_accepted(tmp_path, monkeypatch):
    """
    A relying party whose own session outlives a rotation sends the ID
    token of its sign-in: its key, pruned from the JWKS, still verifies it
    for a browser session's lifetime after the rotation, then no more.
    """
    async with running(tmp_path, monkeypatch) as h:
        hint = id_token(h)
        await rotated_away(h, hint, 13)
        cookie = await browser_session(h)
        response, body = await h.get(
            END_SESSION,
            params={"id_token_hint": hint, "post_logout_redirect_uri": FIRST_LOGOUT_URI},
            cookies={"authsrv_session": cookie},
        )
        assert response.code == 302, body
        assert not await session_alive(h, cookie)

        h.clock.advance(2 * DAY)
        await h.keystore.maintain(h.now())
        await assert_hints_refused(h, await browser_session(h), {"a session's lifetime later": hint})


@pytest_twisted.ensureDeferred
async def test_hint_with_a_one_client_audience_list(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        response, _ = await h.get(
            END_SESSION,
            params={"id_token_hint": id_token(h, aud=["partner"]), "post_logout_redirect_uri": "http://127.0.0.1:9001/",
                    "client_id": "partner"},
        )
        assert response.code == 302
        assert response.headers.getRawHeaders(b"location") == [b"http://127.0.0.1:9001/"]


@pytest.mark.parametrize("hint_sub, hint_sid", [(ALICE.sub, "sid-bob"), (ALICE.sub, None), (BOB.sub, "sid-other")])
@pytest_twisted.ensureDeferred
async def test_a_hint_that_does_not_name_the_session_asks_first(tmp_path, monkeypatch, audit, hint_sub, hint_sid):
    """
    Logout CSRF: any ID token of ours, replayed by another site, must not end
    someone else's session; the user confirms with a form bound to the session.
    """
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h, sub=BOB.sub, sid="sid-bob")
        params = {"id_token_hint": id_token(h, sub=hint_sub, sid=hint_sid), "post_logout_redirect_uri": FIRST_LOGOUT_URI,
                  "state": "s"}
        response, body = await h.get(END_SESSION, params=params, cookies={"authsrv_session": cookie})
        assert response.code == 200 and b"Sign out?" in body
        assert_page_headers(response)
        [csp] = response.headers.getRawHeaders(b"content-security-policy")
        assert csp.endswith(b"form-action 'self' http://127.0.0.1:9000")
        assert not response.headers.hasHeader(b"set-cookie")
        assert await session_alive(h, cookie)
        fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', body.decode()))
        assert {k: fields[k] for k in params} == params and fields["confirm"] == "yes"

        for forged in ({**fields, "csrf": "0" * 64}, {k: v for k, v in fields.items() if k != "csrf"}):
            response, body = await h.post(END_SESSION, data=forged, cookies={"authsrv_session": cookie})
            assert response.code == 200 and b"Sign out?" in body
        response, _ = await h.get(END_SESSION, params=fields, cookies={"authsrv_session": cookie})
        assert response.code == 200, "a confirmation is only ever a POST"
        assert await session_alive(h, cookie)
        assert not audit.of("session.ended")

        response, _ = await h.post(END_SESSION, data=fields, cookies={"authsrv_session": cookie})
        assert response.code == 302
        assert response.headers.getRawHeaders(b"location") == [FIRST_LOGOUT_URI.encode() + b"?state=s"]
        assert not await session_alive(h, cookie)


@pytest_twisted.ensureDeferred
async def test_a_hint_without_sid_ends_its_users_session(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h, sub=BOB.sub, sid="sid-bob")
        hint = id_token(h, sub=BOB.sub, sid=None)
        response, _ = await h.get(END_SESSION, params={"id_token_hint": hint}, cookies={"authsrv_session": cookie})
        assert response.code == 200 and not await session_alive(h, cookie)


@pytest_twisted.ensureDeferred
async def test_without_a_session_the_cookie_is_still_cleared(tmp_path, monkeypatch, audit):
    async with running(tmp_path, monkeypatch) as h:
        for cookies in ({}, {"authsrv_session": "unknown-session"}):
            response, _ = await h.get(
                END_SESSION,
                params={"id_token_hint": id_token(h), "post_logout_redirect_uri": FIRST_LOGOUT_URI, "state": "s"},
                cookies=cookies,
            )
            assert response.code == 302
            assert "Max-Age=0" in cleared_cookie(response)
        assert not audit.of("session.ended")


@pytest_twisted.ensureDeferred
async def test_signing_out_clears_the_sealed_second_factor_cookies(tmp_path, monkeypatch, audit):
    """A shared computer keeps nothing of the last user's enrolment key or new recovery codes."""
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        response, _ = await h.get(
            END_SESSION,
            params={"id_token_hint": id_token(h), "post_logout_redirect_uri": FIRST_LOGOUT_URI},
            cookies={"authsrv_session": cookie, "authsrv_enrolment": "sealed-key", "authsrv_recovery": "sealed-codes"},
        )
        assert response.code == 302
        cleared = {c.decode().split("=", 1)[0]: c.decode() for c in response.headers.getRawHeaders(b"set-cookie")}
        assert set(cleared) == {"authsrv_session", "authsrv_enrolment", "authsrv_recovery"}
        assert all("Max-Age=0" in c and "Path=/api/auth" in c for c in cleared.values())


# --- refusals -------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_missing_hint_is_refused(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        for params in ({}, {"client_id": "first", "post_logout_redirect_uri": FIRST_LOGOUT_URI, "state": "s"}):
            response, body = await h.get(END_SESSION, params=params, cookies={"authsrv_session": cookie})
            assert_refused(response, body, "id_token_hint")
        assert await session_alive(h, cookie)


def _foreign_token(claims: dict, kid: str) -> str:
    key = JWK.generate(kty="RSA", size=2048)
    token = JWT(header={"alg": "RS256", "kid": kid, "typ": "JWT"}, claims=claims)
    token.make_signed_token(key)
    return token.serialize()


def _tampered(hint: str, **changes) -> str:
    header, payload, signature = hint.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims.update(changes)
    return ".".join((header, b64(json.dumps(claims).encode()), signature))


@pytest_twisted.ensureDeferred
async def test_forged_hints_are_refused(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        genuine = id_token(h)
        header = json.loads(base64.urlsafe_b64decode(genuine.split(".")[0] + "=="))
        claims = {"iss": ISSUER, "sub": ALICE.sub, "aud": "first", "iat": h.now(), "exp": h.now() + 60, "sid": "sid-1"}
        unsigned = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode()) + "." + b64(json.dumps(claims).encode()) + "."
        forgeries = {
            "foreign key, our kid": _foreign_token(claims, header["kid"]),
            "foreign key, its kid": _foreign_token(claims, "attacker"),
            "tampered payload": _tampered(genuine, sub=BOB.sub),
            "signature of another token": ".".join(genuine.split(".")[:2] + [id_token(h, sid="x").split(".")[2]]),
            "alg none": unsigned,
            "garbled": genuine[:40] + "!" + genuine[41:],
            "not a JWS": "not-a-token",
            "JSON serialization": json.dumps({"payload": "e30", "signature": "", "protected": "e30"}),
        }
        await assert_hints_refused(h, cookie, forgeries)


@pytest_twisted.ensureDeferred
async def test_our_signature_on_other_tokens_is_refused(tmp_path, monkeypatch):
    """
    Genuine signatures, but not an ID token of this issuer for one client: a
    signed UserInfo answer has an ID token's typ, iss, aud and sub, but no
    iat and exp (OIDC Core sections 2 and 5.3.2).
    """
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        now = h.now()
        claims = {"iss": ISSUER, "sub": ALICE.sub, "aud": "first", "iat": now, "exp": now + 60, "sid": "sid-1"}
        hints = {
            "other issuer": id_token(h, iss="https://elsewhere.example"),
            "no issuer": id_token(h, iss=None),
            "no subject": id_token(h, sub=None),
            "no audience": id_token(h, aud=None),
            "two audiences": id_token(h, aud=["first", "partner"]),
            "access token": h.keystore.sign(claims, "RS256", "at+jwt"),
            "logout token": h.keystore.sign(claims, "RS256", "logout+jwt"),
            "not an object": h.keystore.sign(json.dumps([claims]), "RS256", "JWT"),
            "signed UserInfo answer": h.keystore.sign({"iss": ISSUER, "aud": "first", "sub": ALICE.sub}, "RS256",
                                                      "JWT"),
            "no exp": id_token(h, exp=None),
            "no iat": id_token(h, iat=None),
            "exp not a number": id_token(h, exp=str(now + 60)),
        }
        await assert_hints_refused(h, cookie, hints)


@pytest_twisted.ensureDeferred
async def test_hint_signed_by_every_published_algorithm_is_accepted(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        now = h.now()
        claims = {"iss": ISSUER, "sub": ALICE.sub, "aud": "first", "iat": now, "exp": now + 60, "sid": "sid-1"}
        for alg in h.keystore.algorithms:
            response, _ = await h.get(END_SESSION, params={"id_token_hint": h.keystore.sign(claims, alg, "JWT")})
            assert response.code == 200, alg


@pytest_twisted.ensureDeferred
async def test_client_without_end_session_is_refused(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        for aud in ("spa", "gateway", "unknown-client"):
            response, body = await h.get(
                END_SESSION,
                params={"id_token_hint": id_token(h, aud=aud), "post_logout_redirect_uri": "http://127.0.0.1:9002/"},
                cookies={"authsrv_session": cookie},
            )
            assert_refused(response, body, "may not sign users out")
        assert await session_alive(h, cookie)


@pytest_twisted.ensureDeferred
async def test_unregistered_post_logout_redirect_uri_is_refused(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        for uri in (
            "https://evil.example/",
            "http://127.0.0.1:9000/evil",
            "http://127.0.0.1:9000",
            "http://127.0.0.1:9000/?x=1",
            "HTTP://127.0.0.1:9000/",
            "http://127.0.0.1:9001/",
            "http://127.0.0.1:9000/callback",
        ):
            response, body = await h.get(
                END_SESSION,
                params={"id_token_hint": id_token(h), "post_logout_redirect_uri": uri, "state": "s"},
                cookies={"authsrv_session": cookie},
            )
            assert_refused(response, body, "post_logout_redirect_uri is not registered")
        assert await session_alive(h, cookie)


@pytest_twisted.ensureDeferred
async def test_client_id_must_match_the_hint(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        cookie = await browser_session(h)
        response, body = await h.get(
            END_SESSION,
            params={"id_token_hint": id_token(h), "client_id": "partner",
                    "post_logout_redirect_uri": "http://127.0.0.1:9001/"},
            cookies={"authsrv_session": cookie},
        )
        assert_refused(response, body, "client_id does not match")
        assert await session_alive(h, cookie)
        response, _ = await h.get(
            END_SESSION,
            params={"id_token_hint": id_token(h), "client_id": "first", "post_logout_redirect_uri": FIRST_LOGOUT_URI},
            cookies={"authsrv_session": cookie},
        )
        assert response.code == 302
        assert not await session_alive(h, cookie)


@pytest_twisted.ensureDeferred
async def test_malformed_parameters_get_an_error_page(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        hint = id_token(h)
        for query in (
            f"id_token_hint={hint}&id_token_hint={hint}",
            f"id_token_hint={hint}&state=a&state=b",
            "id_token_hint=%ff%fe",
            f"id_token_hint={hint}&state=%00",
            "id_token_hint=" + "a" * 9000,
        ):
            response, body = await h.get(END_SESSION + "?" + query)
            assert_refused(response, body, "Sign-out failed")


@pytest_twisted.ensureDeferred
async def test_other_methods_are_not_allowed(tmp_path, monkeypatch):
    async with running(tmp_path, monkeypatch) as h:
        response, _ = await h.request("PUT", END_SESSION, data={"id_token_hint": id_token(h)})
        assert response.code == 405


# --- fuzzing ----------------------------------------------------------------------

_NAMES = st.sampled_from(["id_token_hint", "client_id", "post_logout_redirect_uri", "state", "ui_locales"])


@pytest.fixture
def started(tmp_path, monkeypatch):
    """One harness for every example of a hypothesis test (a fixture cannot be async there)."""
    h = Harness(tmp_path, monkeypatch)
    pytest_twisted.blockon(Deferred.fromCoroutine(h.start()))
    yield h
    pytest_twisted.blockon(Deferred.fromCoroutine(h.close()))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    params=st.dictionaries(st.one_of(_NAMES, st.text(max_size=10)), st.text(max_size=200), max_size=5),
    method=st.sampled_from(["GET", "POST"]),
)
@pytest_twisted.ensureDeferred
async def test_arbitrary_parameters_never_give_a_server_error(started, data, params, method):
    h = started
    if data.draw(st.booleans()):
        params["id_token_hint"] = id_token(h, aud=data.draw(st.sampled_from(["first", "partner", "spa", "nobody"])))
    if data.draw(st.booleans()):
        params["post_logout_redirect_uri"] = data.draw(st.sampled_from([FIRST_LOGOUT_URI, "http://127.0.0.1:9001/"]))
    kwargs = {"params": params} if method == "GET" else {"data": params}
    response, body = await h.request(method, END_SESSION, **kwargs)
    assert response.code in ((200, 302, 400) if method == "GET" else (303, 400)), body
    if response.code == 302:
        assert response.headers.getRawHeaders(b"location")[0].decode().startswith(
            (FIRST_LOGOUT_URI, "http://127.0.0.1:9001/")
        )
    if response.code == 303:
        assert response.headers.getRawHeaders(b"location")[0].decode().startswith(END_SESSION + "?")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.lists(st.tuples(st.binary(max_size=20), st.binary(max_size=200)), max_size=4))
@pytest_twisted.ensureDeferred
async def test_arbitrary_query_bytes_never_give_a_server_error(started, raw):
    query = "&".join(f"{quote_from_bytes(k)}={quote_from_bytes(v)}" for k, v in raw)
    response, body = await started.get(END_SESSION + "?" + query)
    assert response.code in (200, 400), body


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest_twisted.ensureDeferred
async def test_any_change_to_a_genuine_hint_is_refused(started, data):
    hint = id_token(started)
    # The last character of a segment may carry only padding bits; any other carries signed bits.
    positions = [i for i, c in enumerate(hint) if c != "." and i + 1 < len(hint) and hint[i + 1] != "."]
    position = data.draw(st.sampled_from(positions))
    replacement = data.draw(st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"))
    assume(replacement != hint[position])
    changed = hint[:position] + replacement + hint[position + 1:]
    response, body = await started.get(END_SESSION, params={"id_token_hint": changed})
    assert response.code == 400, body


class _OneKey:
    """A keystore's verifying side, holding one published key."""

    def __init__(self):
        key = JWK.generate(kty="OKP", crv="Ed25519", kid="k1", alg="EdDSA")
        self.public = JWK.from_json(key.export_public())

    def hint_key(self, kid):
        return self.public if kid == "k1" else None


_ONE_KEY = _OneKey()
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
_HEADERS = _JSON | st.fixed_dictionaries(
    {"alg": st.sampled_from(["EdDSA", "RS256", "none", "HS256", "PS256"]) | _JSON,
     "kid": st.sampled_from(["k1", "other"]) | _JSON},
    optional={"typ": _JSON, "crit": _JSON, "b64": _JSON, "jwk": _JSON, "zip": _JSON},
)


@settings(max_examples=500, deadline=None)
@given(header=_HEADERS, payload=st.binary(max_size=60), signature=st.binary(max_size=80))
def test_hint_parsing_refuses_any_structured_junk(header, payload, signature):
    """jwcrypto's every complaint becomes a refusal, whatever the header holds."""
    hint = ".".join((b64(json.dumps(header).encode()), b64(payload) or "e30", b64(signature) or "AA"))
    with pytest.raises(PageError):
        hint_claims(hint, _ONE_KEY.hint_key, ISSUER)


@pytest_twisted.ensureDeferred
async def test_a_refusal_names_no_parameter_of_the_request(tmp_path, monkeypatch):
    """Whoever makes the link chooses its parameters' names: the error page shows none of them."""
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        response, body = await h.get(f"{END_SESSION}?{SPOOF}=1&{SPOOF}=2")
        assert_refused(response, body, "repeated")
        assert "locked" not in body.decode()
    finally:
        await h.close()
