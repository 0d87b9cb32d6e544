"""
The token endpoint in memory (tests/harness.py): code exchange with every
client authentication, every way a code is refused, refresh rotation with
its grace window and family revocation, ID tokens and RFC 9068 JWT access
tokens checked as a relying party checks them, and the races. One test runs
a real server for the 413 on an oversized body.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from urllib.parse import urlencode

import attrs
import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, fail, gatherResults

from authsrv.flows.clients import TTL as CLIENT_CACHE_TTL
from authsrv.flows.issue import Minted
from authsrv.identity.errors import BackendUnavailable
from authsrv.protocol import pkce
from authsrv.protocol.oidc import at_hash
from authsrv.records import ACR_PWD, Ban
from authsrv.testing.identity import ALICE, BOB, MALLORY
from authsrv.tokens import token_hash
from conftest import free_port
from flow_client import Browser
from harness import CLIENTS, ISSUER, SECRETS, Harness, pkce_pair
from token_helpers import (
    API,
    INTROSPECT,
    REVOKE,
    TOKEN,
    USERINFO,
    active,
    basic,
    exchange,
    header,
    introspect,
    post_form,
    redirect_uri_of,
    refresh,
    save_code,
    tokens,
    verify_jwt,
)

NONCE = "n-0S6_WzA2Mj"


def assert_no_store(response) -> None:
    assert header(response, "cache-control") == ["no-store"]
    assert header(response, "pragma") == ["no-cache"]
    assert header(response, "content-type") == ["application/json"]


def assert_error(response, body, status: int, error: str) -> None:
    assert (response.code, body["error"]) == (status, error), body
    assert body["error_description"]
    assert_no_store(response)


@pytest_twisted.ensureDeferred
async def test_code_exchange_with_client_secret_post(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h, auth_time=h.now() - 30)
        response, body = await exchange(h, code, verifier)
        assert response.code == 200, body
        assert_no_store(response)
        assert list(body) == ["access_token", "token_type", "expires_in", "scope", "refresh_token", "id_token"]
        assert body["token_type"] == "Bearer" and body["expires_in"] == 3600
        assert body["scope"].split() == ["email", "offline_access", "openid", "profile"]
        assert len(body["access_token"]) >= 43 and "." not in body["access_token"]

        header_, claims = verify_jwt(h, body["id_token"], aud="first", nonce=NONCE)
        assert claims == {
            "iss": ISSUER, "sub": ALICE.sub, "aud": "first", "exp": h.now() + 3600, "iat": h.now(),
            "auth_time": h.now() - 30, "nonce": NONCE, "sid": "sid-1", "amr": ["pwd"], "acr": ACR_PWD,
            "at_hash": at_hash(body["access_token"]),
            "name": ALICE.name, "picture": ALICE.picture, "email": ALICE.email, "email_verified": True,
            "chat_user_id": ALICE.chat_user_id,
        }
        assert header_["kid"] in {key["kid"] for key in json.loads(h.keystore.jwks_bytes())["keys"]}

        stored = await h.store.find_access_token(token_hash(body["access_token"]), h.now())
        assert (stored.client_id, stored.sub, stored.audience, stored.jti) == ("first", ALICE.sub, (), None)
        assert stored.expires_at == h.now() + 3600
        refresh_record = await h.store.get_refresh_token(token_hash(body["refresh_token"]))
        assert refresh_record.expires_at == h.now() + 30 * 86400
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_code_exchange_with_client_secret_basic(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h, client_id="partner", scope="openid email")
        response, body = await exchange(h, code, verifier, client_id="partner", method="basic")
        assert response.code == 200, body
        assert "refresh_token" not in body
        _, claims = verify_jwt(h, body["id_token"], aud="partner")
        assert "name" not in claims and "picture" not in claims
        assert (claims["email"], claims["chat_user_id"]) == (ALICE.email, ALICE.chat_user_id)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_public_client_with_pkce_alone(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h, client_id="spa", sub=BOB.sub, scope="openid offline_access", nonce=None)
        response, body = await exchange(h, code, verifier, client_id="spa")
        assert response.code == 200, body
        assert header(response, "access-control-allow-origin") == ["*"]
        _, claims = verify_jwt(h, body["id_token"], aud="spa")
        assert "nonce" not in claims and claims["sub"] == BOB.sub
        assert set(claims) == {"iss", "sub", "aud", "exp", "iat", "auth_time", "at_hash", "sid", "amr", "acr"}
        response, body = await refresh(h, body["refresh_token"], client_id="spa")
        assert response.code == 200, body
        preflight, _ = await h.request("OPTIONS", TOKEN, headers={"Origin": "http://127.0.0.1:9002"})
        assert preflight.code == 204
        assert header(preflight, "access-control-allow-methods") == ["POST, OPTIONS"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_without_openid_no_id_token(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        body = await tokens(h, scope="profile")
        assert set(body) == {"access_token", "token_type", "expires_in", "scope"}
        assert body["scope"] == "profile"
    finally:
        await h.close()


async def _grant_revoked(h, code: str) -> bool:
    """Whether the grant of a code that was used is revoked."""
    used = await h.store.find_code(token_hash(code), h.now())
    return (await h.store.get_grant(used.grant_id)).revoked_at is not None


async def _refused_code(h, code, verifier, **exchange_options):
    response, body = await exchange(h, code, verifier, **exchange_options)
    assert_error(response, body, 400, "invalid_grant")
    return body


@pytest_twisted.ensureDeferred
async def test_every_invalid_grant_of_a_code(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h)
        await _refused_code(h, code, verifier[:-1] + ("A" if verifier[-1] != "A" else "B"))
        # A refused attempt used the code up and ended the grant it would have started.
        await _refused_code(h, code, verifier)
        assert await _grant_revoked(h, code)

        code, verifier = await save_code(h)
        body = await _refused_code(h, code, verifier, redirect_uri=redirect_uri_of("first") + "/")
        assert "redirect_uri" in body["error_description"]

        # Another client's attempt (any caller may claim a public client's id) neither uses the code up nor,
        # once it is used, revokes what it issued: only the client it was issued to can.
        code, verifier = await save_code(h)
        body = await _refused_code(h, code, verifier, client_id="partner")
        assert "another client" in body["error_description"]
        response, body = await exchange(h, code, verifier)
        assert response.code == 200, body
        await _refused_code(h, code, verifier, client_id="partner")
        assert not await _grant_revoked(h, code)
        await _refused_code(h, code, verifier)
        assert await _grant_revoked(h, code)

        code, verifier = await save_code(h)
        h.clock.advance(61)
        await _refused_code(h, code, verifier)

        await _refused_code(h, "no-such-code", verifier)

        code, verifier = await save_code(h, sub=MALLORY.sub)
        await _refused_code(h, code, verifier)

        code, verifier = await save_code(h, sub=BOB.sub)
        await h.store.ban_user(Ban(BOB.sub, "spam", h.now()))
        await _refused_code(h, code, verifier)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_verifier_ending_in_a_newline_is_refused(tmp_path, monkeypatch):
    """RFC 7636 section 4.1: unreserved characters only, even when the client made its challenge of that text."""
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        verifier = pkce_pair()[0] + "\n"
        query = await Browser(h).sign_in(ALICE, "spa", challenge=pkce.s256(verifier))
        body = await _refused_code(h, query["code"], verifier, client_id="spa")
        assert "code_verifier" in body["error_description"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_unrecognized_parameters_are_ignored(tmp_path, monkeypatch):
    """
    RFC 6749 section 3.2: even repeated, too long or not UTF-8 text; the
    parameters the endpoint reads are held to their rules all the same.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        extensions = b"&ext=1&ext=2&other=%FF&long=" + b"a" * 9000
        code, verifier = await save_code(h)
        good = urlencode({"grant_type": "authorization_code", "code": code, "code_verifier": verifier,
                          "redirect_uri": redirect_uri_of("first"), "client_id": "first",
                          "client_secret": SECRETS["first"]}).encode()
        response, body = await h.json("POST", TOKEN, data=good + b"&code=" + code.encode() + extensions, headers=form)
        assert_error(response, body, 400, "invalid_request")
        assert "code is repeated" in body["error_description"]
        response, body = await h.json("POST", TOKEN, data=good + extensions, headers=form)
        assert response.code == 200, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_an_identity_outage_leaves_the_code_usable(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h)
        with monkeypatch.context() as outage:
            outage.setattr(h.identity, "user_by_id", lambda sub: fail(BackendUnavailable("directory down")))
            response, body = await exchange(h, code, verifier)
        assert_error(response, body, 503, "temporarily_unavailable")
        assert header(response, "retry-after") is not None
        # Nothing was used up or revoked: the client's retry gets its tokens.
        response, body = await exchange(h, code, verifier)
        assert response.code == 200, body
        assert await active(h, body["access_token"]) and await active(h, body["refresh_token"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_code_expires_after_its_lifetime_not_before(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h)
        h.clock.advance(59)
        response, body = await exchange(h, code, verifier)
        assert response.code == 200, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_replayed_code_revokes_what_the_first_exchange_issued(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h)
        response, first = await exchange(h, code, verifier)
        assert response.code == 200
        assert await active(h, first["access_token"]) and await active(h, first["refresh_token"])
        response, body = await exchange(h, code, verifier)
        assert_error(response, body, 400, "invalid_grant")
        assert not await active(h, first["access_token"])
        assert not await active(h, first["refresh_token"])
        response, body = await refresh(h, first["refresh_token"])
        assert_error(response, body, 400, "invalid_grant")
        response, _ = await h.json("GET", USERINFO, headers={"Authorization": "Bearer " + first["access_token"]})
        assert response.code == 401
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_invalid_client(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h)
        base = {"grant_type": "authorization_code", "code": code, "code_verifier": verifier,
                "redirect_uri": redirect_uri_of("first")}
        attempts = [
            ({"client_id": "nobody", "client_secret": "x"}, {}),
            ({"client_id": "first", "client_secret": "wrong"}, {}),
            ({"client_id": "first"}, {}),
            ({}, {}),
            ({}, basic("first", "wrong")),
            ({}, basic("nobody", "x")),
            ({}, {"Authorization": "Basic !!!not-base64"}),
            ({}, {"Authorization": "Basic " + "Zmlyc3Q="}),
            ({"client_id": "spa", "client_secret": "anything"}, {}),
        ]
        for fields, headers in attempts:
            response, body = await post_form(h, TOKEN, {**base, **fields}, client_id=None, headers=headers)
            assert_error(response, body, 401, "invalid_client")
            assert header(response, "www-authenticate") == ['Basic realm="authsrv"'], fields
        # None of them used the code up.
        response, body = await exchange(h, code, verifier)
        assert response.code == 200, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_malformed_token_requests(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        code, verifier = await save_code(h)
        good = {"grant_type": "authorization_code", "code": code, "code_verifier": verifier,
                "redirect_uri": redirect_uri_of("first"), "client_id": "first", "client_secret": SECRETS["first"]}
        for missing in ("grant_type", "code", "redirect_uri", "code_verifier"):
            response, body = await post_form(h, TOKEN, {k: v for k, v in good.items() if k != missing},
                                             client_id=None)
            assert_error(response, body, 400, "invalid_request")
            assert missing in body["error_description"]
        _, discovery = await h.json("GET", "/api/auth/.well-known/openid-configuration")
        for grant_type in ("password", "implicit", "urn:x"):
            response, body = await post_form(h, TOKEN, {**good, "grant_type": grant_type}, client_id=None)
            assert_error(response, body, 400, "unsupported_grant_type")
            # Only the grants discovery lists: client_credentials is not while no client uses it.
            offered = ", ".join(discovery["grant_types_supported"])
            assert body["error_description"] == f"grant_type must be one of {offered}"
            assert "client_credentials" not in body["error_description"]
        response, body = await post_form(h, TOKEN, {**good, "grant_type": "client_credentials"}, client_id=None)
        assert_error(response, body, 400, "unauthorized_client")  # offered, but not to this client

        response, body = await h.json("POST", TOKEN, data=list(good.items()) + [("code", code)])
        assert_error(response, body, 400, "invalid_request")
        assert "repeated" in body["error_description"]
        response, body = await h.json("POST", TOKEN, json=good)
        assert_error(response, body, 400, "invalid_request")
        response, body = await h.json("POST", TOKEN + "?client_secret=" + SECRETS["first"], data=good)
        assert_error(response, body, 400, "invalid_request")
        response, body = await h.json("POST", TOKEN, data={**good, "code": "\x00"})
        assert_error(response, body, 400, "invalid_request")
        response, body = await h.json("POST", TOKEN, data={**good, "code": "x" * 10000})
        assert_error(response, body, 400, "invalid_request")
        response, body = await h.json(
            "POST", TOKEN, data=b"grant_type=%FF%FE", headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        assert_error(response, body, 400, "invalid_request")
        response, body = await post_form(h, TOKEN, {**good, "client_id": "other"}, client_id=None,
                                         headers=basic("first", SECRETS["first"]))
        assert_error(response, body, 400, "invalid_request")
        response, body = await h.json("GET", TOKEN)
        assert response.code == 405 and header(response, "allow") is not None

        # Still unused after all that.
        response, body = await exchange(h, code, verifier)
        assert response.code == 200, body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_refresh_rotates_and_replays_inside_the_grace_window(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        first = await tokens(h)
        h.clock.advance(100)
        response, second = await refresh(h, first["refresh_token"])
        assert response.code == 200, second
        assert_no_store(response)
        assert set(second) == set(first)
        assert second["refresh_token"] != first["refresh_token"]
        assert second["access_token"] != first["access_token"]
        _, claims = verify_jwt(h, second["id_token"], aud="first")
        assert "nonce" not in claims
        assert (claims["iat"], claims["auth_time"], claims["sid"]) == (h.now(), h.now() - 105, "sid-1")
        assert claims["at_hash"] == at_hash(second["access_token"])

        h.clock.advance(9)
        response, again = await refresh(h, first["refresh_token"])
        assert response.code == 200
        # The same tokens; expires_in is what is left of the access token's lifetime (RFC 6749 section 5.1).
        assert again == {**second, "expires_in": second["expires_in"] - 9}
        assert list(again) == list(second)
        assert await active(h, second["refresh_token"]) and await active(h, second["access_token"])
        assert not await active(h, first["refresh_token"])

        h.clock.advance(1)
        response, body = await refresh(h, first["refresh_token"])
        assert_error(response, body, 400, "invalid_grant")
        for token in (first["access_token"], second["access_token"], second["refresh_token"]):
            assert not await active(h, token)
        response, body = await refresh(h, second["refresh_token"])
        assert_error(response, body, 400, "invalid_grant")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_replay_late_in_a_long_grace_window_tells_the_access_tokens_remaining_lifetime(tmp_path, monkeypatch):
    """
    A client given a grace window longer than an access token lives gets
    the same tokens again, with expires_in counting down to the access
    token's real end and never below zero, so it knows to refresh again
    (with the successor) instead of using an expired token for an hour.
    """
    clients = [dict(c, refresh_grace="2h") if c["client_id"] == "first" else c for c in CLIENTS]
    h = await Harness(tmp_path, monkeypatch, {"clients": clients}).start()
    try:
        first = await tokens(h)
        response, second = await refresh(h, first["refresh_token"])
        assert response.code == 200 and second["expires_in"] == 3600, second
        h.clock.advance(3000)
        response, again = await refresh(h, first["refresh_token"])
        assert response.code == 200, again
        assert again == {**second, "expires_in": 600}
        assert await active(h, second["access_token"])  # still live: 600 s are left
        h.clock.advance(1200)
        response, again = await refresh(h, first["refresh_token"])
        assert response.code == 200, again
        assert again == {**second, "expires_in": 0}
        assert not await active(h, second["access_token"])
        response, third = await refresh(h, second["refresh_token"])
        assert response.code == 200 and third["expires_in"] == 3600, third
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_replay_sealed_whole_as_earlier_versions_sealed_it_is_answered_as_it_is(tmp_path, monkeypatch):
    """
    A replay keeps the ID token's claims and signs them again; one that an
    earlier version sealed whole, ID token included (an instance not yet
    upgraded, within the grace window), is answered as it was sealed.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        first = await tokens(h)
        monkeypatch.setattr(Minted, "replayable", lambda minted: {**minted.issued.response, "id_token": "sealed.whole"})
        response, second = await refresh(h, first["refresh_token"])
        assert response.code == 200, second
        response, again = await refresh(h, first["refresh_token"])
        assert response.code == 200, again
        assert again == {**second, "id_token": "sealed.whole"}
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_refresh_chain_keeps_going(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        current = await tokens(h)
        for _ in range(3):
            h.clock.advance(3600)
            response, current = await refresh(h, current["refresh_token"])
            assert response.code == 200, current
        assert await active(h, current["access_token"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_refresh_scope_narrows_never_widens(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        first = await tokens(h, scope="openid profile offline_access")
        response, body = await refresh(h, first["refresh_token"], scope="email openid")
        assert_error(response, body, 400, "invalid_scope")
        response, body = await refresh(h, first["refresh_token"], scope="profile  offline_access")
        assert response.code == 200, body
        assert body["scope"] == "offline_access profile" and "id_token" not in body
        assert (await introspect(h, body["access_token"]))["scope"] == "offline_access profile"
        # The refresh token keeps the whole grant: a later refresh gets it all back.
        response, body = await refresh(h, body["refresh_token"])
        assert body["scope"] == "offline_access openid profile" and "id_token" in body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_refresh_refused(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        mine = await tokens(h)
        response, body = await refresh(h, mine["refresh_token"], client_id="partner")
        assert_error(response, body, 400, "invalid_grant")
        response, body = await refresh(h, mine["access_token"])
        assert_error(response, body, 400, "invalid_grant")
        response, body = await refresh(h, "no-such-token")
        assert_error(response, body, 400, "invalid_grant")
        response, body = await post_form(h, TOKEN, {"grant_type": "refresh_token"})
        assert_error(response, body, 400, "invalid_request")
        # The attempts by another client did not consume it.
        response, body = await refresh(h, mine["refresh_token"])
        assert response.code == 200, body

        h.clock.advance(30 * 86400)
        response, body = await refresh(h, body["refresh_token"])
        assert_error(response, body, 400, "invalid_grant")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_refresh_never_outlives_the_grant(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        current = await tokens(h)
        grant_end = h.now() + 90 * 86400
        for _ in range(3):
            h.clock.advance(29 * 86400)
            response, current = await refresh(h, current["refresh_token"])
            assert response.code == 200, current
        record = await h.store.get_refresh_token(token_hash(current["refresh_token"]))
        assert record.expires_at == grant_end
        h.clock.advance(grant_end - h.now())
        response, body = await refresh(h, current["refresh_token"])
        assert_error(response, body, 400, "invalid_grant")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_access_tokens_end_with_their_grant(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        current = await tokens(h, resource=(API,))
        grant_end = h.now() + 90 * 86400
        for _ in range(3):
            h.clock.advance(29 * 86400 + 86000)
            response, current = await refresh(h, current["refresh_token"])
            assert response.code == 200, current
        left = grant_end - h.now()
        assert 0 < left < 3600
        assert current["expires_in"] == left
        _, claims = verify_jwt(h, current["access_token"], typ="at+jwt", aud=API)
        assert claims["exp"] == grant_end
        response, opaque = await refresh(h, current["refresh_token"])
        assert (response.code, opaque["expires_in"]) == (200, left), opaque
        assert (await h.store.find_access_token(token_hash(opaque["access_token"]), h.now())).expires_at == grant_end
        h.clock.advance(left)
        assert not await active(h, opaque["access_token"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_ban_ends_the_grant_at_the_next_refresh(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        first = await tokens(h)
        await h.store.ban_user(Ban(ALICE.sub, "abuse", h.now()))
        response, body = await refresh(h, first["refresh_token"])
        assert_error(response, body, 400, "invalid_grant")
        await h.store.unban_user(ALICE.sub)
        response, body = await refresh(h, first["refresh_token"])
        assert_error(response, body, 400, "invalid_grant")
        assert not await active(h, first["access_token"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_jwt_access_token_for_a_resource(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        body = await tokens(h, resource=(API,), auth_time=h.now() - 7)
        header_, claims = verify_jwt(h, body["access_token"], typ="at+jwt", aud=API)
        assert claims == {
            "iss": ISSUER, "sub": ALICE.sub, "aud": API, "client_id": "first", "iat": h.now(),
            "exp": h.now() + 3600, "jti": claims["jti"], "scope": "email offline_access openid profile",
            "auth_time": h.now() - 7,
        }
        stored = await h.store.find_access_token(token_hash(body["access_token"]), h.now())
        assert (stored.jti, stored.audience) == (claims["jti"], (API,))
        _, id_claims = verify_jwt(h, body["id_token"], aud="first")
        assert id_claims["at_hash"] == at_hash(body["access_token"])

        response, refreshed = await refresh(h, body["refresh_token"], resource=API)
        assert response.code == 200, refreshed
        _, again = verify_jwt(h, refreshed["access_token"], typ="at+jwt", aud=API)
        assert again["jti"] != claims["jti"]
        response, error = await refresh(h, refreshed["refresh_token"], resource="https://evil.example")
        assert_error(response, error, 400, "invalid_target")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_resource_taken_off_the_client_is_in_none_of_its_next_tokens(tmp_path, monkeypatch):
    """
    The operator's change to a client's resources holds for its grants'
    next tokens too: a refresh, or a code issued before the change, gets
    an opaque token instead of a JWT for that audience, and asking for it
    by name is invalid_target.
    """
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        body = await tokens(h, resource=(API,))
        code, verifier = await save_code(h, resource=(API,))
        before = await h.store.get_client("first")
        assert await h.store.change_client(before, attrs.evolve(before, resources=())) is True
        h.clock.advance(CLIENT_CACHE_TTL + 1)

        response, error = await refresh(h, body["refresh_token"], resource=API)
        assert_error(response, error, 400, "invalid_target")
        assert "no longer" in error["error_description"]
        response, refreshed = await refresh(h, body["refresh_token"])
        assert response.code == 200, refreshed
        assert "." not in refreshed["access_token"]
        stored = await h.store.find_access_token(token_hash(refreshed["access_token"]), h.now())
        assert stored.audience == ()

        response, exchanged = await exchange(h, code, verifier)
        assert response.code == 200, exchanged
        assert "." not in exchanged["access_token"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_grant_type_taken_off_the_client_refuses_its_live_tokens(tmp_path, monkeypatch):
    """A refresh token issued before its client lost the refresh_token grant refreshes nothing."""
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        issued = await tokens(h)
        before = await h.store.get_client("first")
        assert await h.store.change_client(before, attrs.evolve(before, grant_types=("authorization_code",))) is True
        h.clock.advance(CLIENT_CACHE_TTL + 1)
        response, body = await refresh(h, issued["refresh_token"])
        assert_error(response, body, 400, "unauthorized_client")
    finally:
        await h.close()


TWO_RESOURCES = (API, "https://chat.example.test")


def with_two_resources(tmp_path, monkeypatch) -> Harness:
    """The harness with the client "first" registered for L{TWO_RESOURCES}."""
    clients = [{**c, "resources": list(TWO_RESOURCES)} if c["client_id"] == "first" else c for c in CLIENTS]
    return Harness(tmp_path, monkeypatch, {"clients": clients})


@pytest_twisted.ensureDeferred
async def test_several_resources_give_a_list_audience(tmp_path, monkeypatch):
    h = await with_two_resources(tmp_path, monkeypatch).start()
    try:
        resources = TWO_RESOURCES
        body = await tokens(h, resource=resources)
        _, claims = verify_jwt(h, body["access_token"], typ="at+jwt", aud=API)
        assert claims["aud"] == list(resources)
        code, verifier = await save_code(h, resource=resources)
        response, narrowed = await exchange(h, code, verifier, resource=resources[1])
        assert response.code == 200, narrowed
        _, claims = verify_jwt(h, narrowed["access_token"], typ="at+jwt", aud=resources[1])
        assert claims["aud"] == resources[1]
        assert not await _grant_revoked(h, code)
        code, verifier = await save_code(h, resource=resources)
        response, body = await exchange(h, code, verifier, resource="https://evil.example")
        assert_error(response, body, 400, "invalid_target")
        assert await _grant_revoked(h, code)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_several_resources_in_one_token_request_are_invalid_target(tmp_path, monkeypatch):
    """
    RFC 8707 lets a token request name several resources, and a server that
    cannot issue one token for them answers invalid_target: a token here is
    for one resource (or every granted one without resource). The code is
    left for a request that asks rightly; the same resource twice is once.
    """
    h = await with_two_resources(tmp_path, monkeypatch).start()
    try:
        resources = TWO_RESOURCES
        code, verifier = await save_code(h, resource=resources)
        fields = [("grant_type", "authorization_code"), ("code", code), ("code_verifier", verifier),
                  ("redirect_uri", redirect_uri_of("first")), ("client_id", "first"),
                  ("client_secret", SECRETS["first"])]
        response, body = await h.json("POST", TOKEN, data=fields + [("resource", r) for r in resources])
        assert_error(response, body, 400, "invalid_target")
        assert "one resource" in body["error_description"] and "leave resource out" in body["error_description"]
        response, body = await h.json("POST", TOKEN, data=fields + [("resource", API), ("resource", API)])
        assert response.code == 200, body
        _, claims = verify_jwt(h, body["access_token"], typ="at+jwt", aud=API)
        assert claims["aud"] == API
        refreshing = [("grant_type", "refresh_token"), ("refresh_token", body["refresh_token"]),
                      ("client_id", "first"), ("client_secret", SECRETS["first"])]
        response, error = await h.json("POST", TOKEN, data=refreshing + [("resource", r) for r in resources])
        assert_error(response, error, 400, "invalid_target")
        response, refreshed = await h.json("POST", TOKEN, data=refreshing + [("resource", resources[1])])
        assert response.code == 200, refreshed
    finally:
        await h.close()


def _concurrently(*coroutines):
    """Start every request before any is answered."""
    return gatherResults([Deferred.fromCoroutine(c) for c in coroutines])


@pytest_twisted.ensureDeferred
async def test_racing_code_redemptions_have_one_winner(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        for _ in range(5):
            code, verifier = await save_code(h)
            results = await _concurrently(exchange(h, code, verifier), exchange(h, code, verifier))
            codes = sorted(response.code for response, _ in results)
            assert codes == [200, 400], results
            loser = next(body for response, body in results if response.code == 400)
            assert loser["error"] == "invalid_grant"
            winner = next(body for response, body in results if response.code == 200)
            # The replay revoked what the winner issued.
            assert not await active(h, winner["access_token"])
            assert not await active(h, winner["refresh_token"])
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_racing_refreshes_never_fork_the_chain(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        for _ in range(5):
            first = await tokens(h)
            results = await _concurrently(refresh(h, first["refresh_token"]), refresh(h, first["refresh_token"]))
            successes = [body for response, body in results if response.code == 200]
            assert successes, results
            assert all(body == successes[0] for body in successes), "two different live chains"
            for response, body in results:
                assert response.code == 200 or body["error"] == "invalid_grant"
            assert await active(h, successes[0]["refresh_token"])
    finally:
        await h.close()


@pytest.mark.slow
def test_oversized_token_request_gets_413(run_server, tmp_path):
    port = free_port()
    config = tmp_path / "authsrv.toml"
    config.write_text(
        f'[server]\npublic_url = "http://127.0.0.1:{port}"\nlisten = ["tcp:{port}:interface=127.0.0.1"]\n'
        '[store]\npath = "data/authsrv.sqlite3"\n'
        '[keystore]\npath = "data/keys.jwks.json"\n'
        '[[identity]]\nplugin = "static"\npath = "users.toml"\n'
        '[[clients]]\nclient_id = "demo-spa"\nredirect_uris = ["http://127.0.0.1:9002/callback"]\n'
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "users.toml").write_text("")
    server = run_server(["authsrv", "--config", str(config)], tmp_path, port=port)

    def post(body: bytes) -> tuple[int, dict]:
        request = urllib.request.Request(
            server.base + TOKEN, data=body, method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    status, body = post(b"grant_type=refresh_token&client_id=demo-spa&refresh_token=" + b"a" * 70000)
    assert (status, body["error"]) == (413, "invalid_request")
    status, body = post(b"grant_type=refresh_token&client_id=demo-spa&refresh_token=unknown")
    assert (status, body["error"]) == (400, "invalid_grant")


@pytest_twisted.ensureDeferred
async def test_no_malformed_request_gets_a_server_error(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        issued = await tokens(h)
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        bodies = [
            b"", b"=", b"&&&", b"grant_type", b"grant_type=&code=", b"%", b"%zz=%zz", b"a=%00", b"\xff\xfe=\x00",
            b"grant_type=authorization_code&code=%FF", b"grant_type=refresh_token&refresh_token=" + b"%41" * 3000,
            b"token=" + issued["access_token"].encode() + b"&token_type_hint=%FF",
            b"client_id=first&client_secret=" + b"\xc3" * 10, b"&".join(b"p%d=v" % n for n in range(2000)),
            b"client_id=%00&client_secret=x&grant_type=refresh_token&refresh_token=x",
        ]
        authorizations = [
            None, "Basic", "Basic =", "Basic Og==", "Basic " + base64.b64encode(b"\xff:\xfe").decode(),
            "Basic " + base64.b64encode(b"%00:%ZZ").decode(), "Bearer", "Bearer \x7f", "Negotiate abc",
            "Bearer " + issued["access_token"],
        ]
        content_types = [form, {}, {"Content-Type": "application/json"}, {"Content-Type": "text/plain"},
                         {"Content-Type": "application/x-www-form-urlencoded; charset=latin-1"},
                         {"Content-Type": ";;;"}, {"Content-Type": "multipart/form-data; boundary=x"},
                         {"Content-Type": "multipart/form-data"}]
        for path in (TOKEN, INTROSPECT, REVOKE, USERINFO):
            for body in bodies:
                for authorization in authorizations:
                    headers = dict(form)
                    if authorization is not None:
                        headers["Authorization"] = authorization
                    response, _ = await h.request("POST", path, data=body, headers=headers)
                    assert response.code < 500, (path, body[:40], authorization)
            for content_type in content_types:
                response, _ = await h.request("POST", path, data=b"token=x&grant_type=refresh_token",
                                              headers=content_type)
                assert response.code < 500, (path, content_type)
            for method in ("GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"):
                response, _ = await h.request(method, path + "?token=%FF&access_token=%00")
                assert response.code < 500, (path, method)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_client_uses_only_the_grant_types_it_registered(tmp_path, monkeypatch):
    """
    A client limited to authorization_code gets no refresh token even with
    offline_access, nor is offline_access in the scope its tokens carry, and
    its refresh attempts are unauthorized_client; discovery
    lists what the token endpoint offers.
    """
    limited = [dict(c, grant_types=["authorization_code"]) if c["client_id"] == "first" else c for c in CLIENTS]
    h = await Harness(tmp_path, monkeypatch, {"clients": limited}).start()
    try:
        body = await tokens(h)
        assert "refresh_token" not in body and "access_token" in body
        # RFC 6749 section 5.1: the scope answered is the scope granted, which holds no offline access.
        assert body["scope"] == "email openid profile"
        assert (await introspect(h, body["access_token"], "first"))["scope"] == "email openid profile"
        response, answer = await refresh(h, "any-refresh-token")
        assert_error(response, answer, 400, "unauthorized_client")
        assert "refresh_token" in answer["error_description"]

        _, document = await h.json("GET", ISSUER + "/.well-known/openid-configuration")
        assert document["grant_types_supported"] == ["authorization_code", "refresh_token"]
        _, metadata = await h.json("GET", ISSUER + "/.well-known/oauth-authorization-server")
        assert metadata["grant_types_supported"] == ["authorization_code", "refresh_token"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_public_clients_refresh_tokens_are_strictly_one_time(tmp_path, monkeypatch, audit):
    """RFC 9700 section 4.14.2: no grace window for a public client; presenting a rotated token is reuse."""
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        issued = await tokens(h, client_id="spa", scope="openid offline_access")
        response, rotated = await refresh(h, issued["refresh_token"], client_id="spa")
        assert response.code == 200, rotated
        # Nothing can be replayed, so no sealed answer is kept for it.
        assert (await h.store.get_refresh_token(token_hash(issued["refresh_token"]))).replay is None
        response, body = await refresh(h, issued["refresh_token"], client_id="spa")
        assert_error(response, body, 400, "invalid_grant")
        assert "already used" in body["error_description"]
        assert not await active(h, rotated["access_token"], "gateway")
        assert [e["client_id"] for e in audit.of("refresh.reused")] == ["spa"]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_grace_windows_per_kind_of_client_and_per_client(tmp_path, monkeypatch):
    overrides = {"spa": {"refresh_grace": "5s"}, "first": {"refresh_grace": 0}}
    clients = [dict(c, **overrides.get(c["client_id"], {})) for c in CLIENTS]
    h = await Harness(tmp_path, monkeypatch, {"clients": clients, "limits": {"refresh_grace_public": "30s"}}).start()
    try:
        for client_id, replayed in (("spa", True), ("first", False), ("partner", True)):
            issued = await tokens(h, client_id=client_id, scope="openid offline_access")
            _, rotated = await refresh(h, issued["refresh_token"], client_id=client_id)
            sealed = (await h.store.get_refresh_token(token_hash(issued["refresh_token"]))).replay
            assert (sealed is not None) == replayed, client_id
            h.clock.advance(4)
            response, again = await refresh(h, issued["refresh_token"], client_id=client_id)
            same = again == {**rotated, "expires_in": rotated["expires_in"] - 4}
            assert (response.code == 200 and same) == replayed, client_id
        issued = await tokens(h, client_id="spa", scope="openid offline_access")
        await refresh(h, issued["refresh_token"], client_id="spa")
        h.clock.advance(6)
        response, body = await refresh(h, issued["refresh_token"], client_id="spa")
        assert_error(response, body, 400, "invalid_grant")
    finally:
        await h.close()
