"""
DPoP (RFC 9449) through the whole server in memory: tokens bound with
cnf.jkt at the token endpoint, UserInfo and introspection honouring the
binding, refresh tokens of public clients bound to the key, codes bound by
dpop_jkt, clients required to use DPoP, server nonces, and the attacks:
a proof for another URL or method, a replayed proof, a token used without
its proof or as a Bearer token, another key, a stale iat, a wrong ath, a
private key in the jwk, alg none and HS256. Authlib 1.9 has no DPoP client
support, so proofs are made with jwcrypto (tests/dpop_proofs.py), as a
client library would.
"""

from __future__ import annotations

import base64
import json

import pytest_twisted
from jwcrypto import jwk

from authsrv.config import read_config_document
from authsrv.protocol.dpop import nonce_for
from authsrv.flows.dpop import NONCE_KEY
from authsrv.records import Ban
from authsrv.testing.identity import ALICE
from dpop_proofs import ec_key, proof
from harness import CLIENTS, ISSUER, Harness
from token_helpers import (
    API, TOKEN, USERINFO, exchange, header, introspect, post_form, refresh, save_code, verify_jwt,
)

TOKEN_URL = ISSUER + "/oauth2/token"
USERINFO_URL = ISSUER + "/oauth2/userinfo"
DPOP_ON = {"dpop": {"enabled": True}}


def b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


async def dpop_tokens(h, key, client_id: str = "first", **code_options) -> dict:
    code, verifier = await save_code(h, client_id, **code_options)
    response, body = await exchange(h, code, verifier, client_id,
                                    headers={"DPoP": proof(key, "POST", TOKEN_URL, h.now())})
    assert response.code == 200, body
    return body


def assert_proof_refused(response, body, description_part: str = "") -> None:
    assert (response.code, body["error"]) == (400, "invalid_dpop_proof"), body
    assert description_part in body["error_description"]


def assert_dpop_challenge(response, body, error: str) -> None:
    assert (response.code, body["error"]) == (401, error), body
    challenge = header(response, "www-authenticate")[0]
    assert challenge.startswith("DPoP ") and f'error="{error}"' in challenge and 'algs="' in challenge


@pytest_twisted.ensureDeferred
async def test_bound_tokens_at_userinfo_and_introspection(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, DPOP_ON).start()
    try:
        key = ec_key()
        body = await dpop_tokens(h, key)
        assert body["token_type"] == "DPoP"
        token = body["access_token"]
        info = await introspect(h, token)
        assert info["token_type"] == "DPoP" and info["cnf"] == {"jkt": key.thumbprint()}
        assert "cnf" not in await introspect(h, body["refresh_token"], "first")

        good = proof(key, "GET", USERINFO_URL, h.now(), access_token=token)
        response, claims = await h.json("GET", USERINFO, headers={"Authorization": f"DPoP {token}", "DPoP": good})
        assert (response.code, claims["sub"]) == (200, ALICE.sub), claims
        response, claims = await h.json("POST", USERINFO, headers={
            "Authorization": f"dpop {token}", "DPoP": proof(key, "POST", USERINFO_URL, h.now(), access_token=token)})
        assert response.code == 200, claims

        attacks = {
            "replayed proof": ({"Authorization": f"DPoP {token}", "DPoP": good}, "invalid_dpop_proof"),
            "as Bearer": ({"Authorization": f"Bearer {token}"}, "invalid_token"),
            "as Bearer with proof": ({"Authorization": f"Bearer {token}", "DPoP": proof(
                key, "GET", USERINFO_URL, h.now(), access_token=token)}, "invalid_token"),
            "without proof": ({"Authorization": f"DPoP {token}"}, "invalid_dpop_proof"),
            "proof for another URL": ({"Authorization": f"DPoP {token}", "DPoP": proof(
                key, "GET", TOKEN_URL, h.now(), access_token=token)}, "invalid_dpop_proof"),
            "proof for another method": ({"Authorization": f"DPoP {token}", "DPoP": proof(
                key, "POST", USERINFO_URL, h.now(), access_token=token)}, "invalid_dpop_proof"),
            "another key": ({"Authorization": f"DPoP {token}", "DPoP": proof(
                ec_key(), "GET", USERINFO_URL, h.now(), access_token=token)}, "invalid_dpop_proof"),
            "stale iat": ({"Authorization": f"DPoP {token}", "DPoP": proof(
                key, "GET", USERINFO_URL, h.now() - 61, access_token=token)}, "invalid_dpop_proof"),
            "iat ahead": ({"Authorization": f"DPoP {token}", "DPoP": proof(
                key, "GET", USERINFO_URL, h.now() + 6, access_token=token)}, "invalid_dpop_proof"),
            "ath of another token": ({"Authorization": f"DPoP {token}", "DPoP": proof(
                key, "GET", USERINFO_URL, h.now(), access_token=token + "x")}, "invalid_dpop_proof"),
            "no ath": ({"Authorization": f"DPoP {token}", "DPoP": proof(
                key, "GET", USERINFO_URL, h.now())}, "invalid_dpop_proof"),
            "ath not ASCII": ({"Authorization": f"DPoP {token}", "DPoP": proof(
                key, "GET", USERINFO_URL, h.now(), extra={"ath": "\u00e9"})}, "invalid_dpop_proof"),
        }
        for name, (headers, error) in attacks.items():
            response, answer = await h.json("GET", USERINFO, headers=headers)
            assert_dpop_challenge(response, answer, error)
        response, answer = await h.json("POST", USERINFO, data={"access_token": token})
        assert_dpop_challenge(response, answer, "invalid_token")

        bearer = (await post_form(h, TOKEN, {"grant_type": "refresh_token",
                                             "refresh_token": body["refresh_token"]}))[1]
        assert bearer["token_type"] == "Bearer", "a confidential client's refresh token is not bound"
        response, answer = await h.json("GET", USERINFO, headers={"Authorization": f"DPoP {bearer['access_token']}"})
        assert (response.code, answer["error"]) == (401, "invalid_token")
        response, answer = await h.json("GET", USERINFO, headers={"Authorization": f"Bearer {bearer['access_token']}"})
        assert response.code == 200
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_dpop_bound_requests_bearer_refusals_carry_a_dpop_challenge(tmp_path, monkeypatch):
    """
    RFC 9449 section 7.1: a bound token whose proof is good but which lacks
    openid, belongs to a banned user or is meant for another resource, and
    an unknown token sent as DPoP, are refused with a DPoP challenge, never
    a Bearer one a DPoP client cannot answer.
    """
    clients = [{**c, "resources": [API, ISSUER]} if c["client_id"] == "first" else c for c in CLIENTS]
    h = await Harness(tmp_path, monkeypatch, {**DPOP_ON, "clients": clients}).start()
    try:
        key = ec_key()

        async def refused(token: str, status: int, error: str):
            response, body = await h.json("GET", USERINFO, headers={
                "Authorization": f"DPoP {token}", "DPoP": proof(key, "GET", USERINFO_URL, h.now(), access_token=token)})
            assert (response.code, body["error"]) == (status, error), body
            challenge = header(response, "www-authenticate")[0]
            assert challenge.startswith("DPoP ") and f'error="{error}"' in challenge and 'algs="' in challenge
            return challenge

        no_openid = (await dpop_tokens(h, key, scope="profile email"))["access_token"]
        assert ', scope="openid",' in await refused(no_openid, 403, "insufficient_scope")
        await refused((await dpop_tokens(h, key, resource=(API,)))["access_token"], 401, "invalid_token")
        await refused("unknown-token", 401, "invalid_token")
        token = (await dpop_tokens(h, key))["access_token"]
        await h.store.ban_user(Ban(ALICE.sub, "abuse", h.now()))
        await refused(token, 401, "invalid_token")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_token_endpoint_refuses_bad_proofs(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, DPOP_ON).start()
    try:
        key = ec_key()
        now = h.now()
        private = key.export_private(as_dict=True)
        hmac_key = jwk.JWK.generate(kty="oct", size=256)
        weak_rsa = jwk.JWK.generate(kty="RSA", size=1024)
        unsigned = b64({"typ": "dpop+jwt", "alg": "none", "jwk": key.export_public(as_dict=True)}) + "." + b64(
            {"jti": "j", "htm": "POST", "htu": TOKEN_URL, "iat": now}) + "."
        used = proof(key, "POST", TOKEN_URL, now)
        code, verifier = await save_code(h)
        response, body = await exchange(h, code, verifier, headers={"DPoP": used})
        assert response.code == 200, body
        cases = {
            "replayed proof": (used, "used already"),
            "another URL": (proof(key, "POST", USERINFO_URL, now), "htu"),
            "another method": (proof(key, "GET", TOKEN_URL, now), "htm"),
            "stale iat": (proof(key, "POST", TOKEN_URL, now - 61), "iat"),
            "private key in jwk": (proof(key, "POST", TOKEN_URL, now, public=private), "public key"),
            "alg none": (unsigned, "compact"),
            "HS256": (proof(hmac_key, "POST", TOKEN_URL, now, alg="HS256",
                            public=hmac_key.export(as_dict=True)), "signed with one of"),
            "typ JWT": (proof(key, "POST", TOKEN_URL, now, typ="JWT"), "typ"),
            "1024-bit RSA key": (proof(weak_rsa, "POST", TOKEN_URL, now, alg="RS256"), "2048 to 8192 bits"),
            "signed by another key": (proof(ec_key(), "POST", TOKEN_URL, now,
                                            public=key.export_public(as_dict=True)), "signature"),
            "not a JWT": ("not-a-proof", "compact"),
        }
        for name, (value, part) in cases.items():
            code, verifier = await save_code(h)
            response, body = await exchange(h, code, verifier, headers={"DPoP": value})
            assert_proof_refused(response, body, part)
            response, body = await exchange(h, code, verifier)
            assert response.code == 200, f"{name}: a refused proof must leave the code unused"
        code, verifier = await save_code(h)
        response, body = await h.json("POST", TOKEN, data={
            "grant_type": "authorization_code", "code": code, "code_verifier": verifier,
            "redirect_uri": "http://127.0.0.1:9000/callback", "client_id": "first",
            "client_secret": "first-secret-Q3v9ZkP2mW7xL4nR8tY6",
        }, headers={"DPoP": [proof(key, "POST", TOKEN_URL, now), proof(key, "POST", TOKEN_URL, now)]})
        assert_proof_refused(response, body, "exactly one")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_proof_typ_is_read_as_the_media_type_it_names(tmp_path, monkeypatch):
    """
    RFC 7515 section 4.1.9: typ is a media type, compared without regard to
    case, with "application/" understood when absent; a proof whose typ
    spells dpop+jwt so (as jose, node-oidc-provider's library, accepts) binds
    the token, and only that type does.
    """
    h = await Harness(tmp_path, monkeypatch, DPOP_ON).start()
    try:
        key = ec_key()
        for typ in ("application/dpop+jwt", "DPoP+JWT", "Application/DPOP+jwt"):
            code, verifier = await save_code(h)
            response, body = await exchange(h, code, verifier, headers={"DPoP": proof(key, "POST", TOKEN_URL,
                                                                                      h.now(), typ=typ)})
            assert (response.code, body.get("token_type")) == (200, "DPoP"), (typ, body)
        for typ in ("application/jwt", "text/dpop+jwt", "dpop+jwt; q=1", "application/application/dpop+jwt"):
            code, verifier = await save_code(h)
            response, body = await exchange(h, code, verifier, headers={"DPoP": proof(key, "POST", TOKEN_URL,
                                                                                      h.now(), typ=typ)})
            assert_proof_refused(response, body, "typ")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_proof_whose_iat_has_a_fraction_binds_the_token(tmp_path, monkeypatch):
    """A client that writes time.time() as iat (RFC 7519 NumericDate allows a fraction) gets its tokens."""
    h = await Harness(tmp_path, monkeypatch, DPOP_ON).start()
    try:
        key = ec_key()
        code, verifier = await save_code(h)
        response, body = await exchange(h, code, verifier, headers={"DPoP": proof(key, "POST", TOKEN_URL,
                                                                                  h.now() - 0.75)})
        assert (response.code, body.get("token_type")) == (200, "DPoP"), body
        token = body["access_token"]
        response, claims = await h.json("GET", USERINFO, headers={
            "Authorization": f"DPoP {token}", "DPoP": proof(key, "GET", USERINFO_URL, h.now() + 0.5,
                                                            access_token=token)})
        assert (response.code, claims["sub"]) == (200, ALICE.sub), claims
    finally:
        await h.close()


async def refreshed_only_with(h, refresh_token: str, key) -> dict:
    """The spa's C{refresh_token}, refused without a proof and with another key's, refreshed with C{key}'s."""
    for headers in ({}, {"DPoP": proof(ec_key(), "POST", TOKEN_URL, h.now())}):
        response, answer = await refresh(h, refresh_token, "spa", headers=headers)
        assert (response.code, answer["error"]) == (400, "invalid_grant"), answer
    response, answer = await refresh(h, refresh_token, "spa", headers={"DPoP": proof(key, "POST", TOKEN_URL, h.now())})
    assert (response.code, answer["token_type"]) == (200, "DPoP"), answer
    return answer


@pytest_twisted.ensureDeferred
async def test_public_clients_refresh_tokens_are_bound_to_the_key(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, DPOP_ON).start()
    try:
        key = ec_key()
        body = await dpop_tokens(h, key, "spa")
        assert (await introspect(h, body["refresh_token"], "gateway"))["active"] is False
        answer = await refreshed_only_with(h, body["refresh_token"], key)
        response, answer = await refresh(h, answer["refresh_token"], "spa",
                                         headers={"DPoP": proof(ec_key(), "POST", TOKEN_URL, h.now())})
        assert (response.code, answer["error"]) == (400, "invalid_grant"), "the successor stays bound"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_a_public_clients_bearer_refresh_token_is_bound_once_it_refreshes_with_a_proof(tmp_path, monkeypatch):
    """
    RFC 9449 section 5: a refresh token issued to a public client that
    presents a valid proof MUST be bound to its key. A chain begun without
    DPoP (an app updated since, say) stayed a bearer chain however the
    client refreshed, so a stolen successor worked without the key.
    """
    h = await Harness(tmp_path, monkeypatch, DPOP_ON).start()
    try:
        key = ec_key()
        code, verifier = await save_code(h, "spa")
        response, body = await exchange(h, code, verifier, "spa")
        assert (response.code, body["token_type"]) == (200, "Bearer"), body
        response, body = await refresh(h, body["refresh_token"], "spa",
                                       headers={"DPoP": proof(key, "POST", TOKEN_URL, h.now())})
        assert (response.code, body["token_type"]) == (200, "DPoP"), body
        await refreshed_only_with(h, body["refresh_token"], key)
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_dpop_jkt_binds_the_code_and_jwt_access_tokens_carry_cnf(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, DPOP_ON).start()
    try:
        key = ec_key()
        code, verifier = await save_code(h, dpop_jkt=key.thumbprint())
        response, body = await exchange(h, code, verifier)
        assert (response.code, body["error"]) == (400, "invalid_grant")
        code, verifier = await save_code(h, dpop_jkt=key.thumbprint())
        response, body = await exchange(h, code, verifier,
                                        headers={"DPoP": proof(ec_key(), "POST", TOKEN_URL, h.now())})
        assert (response.code, body["error"]) == (400, "invalid_grant")
        body = await dpop_tokens(h, key, dpop_jkt=key.thumbprint(), resource=(API,))
        _, claims = verify_jwt(h, body["access_token"], typ="at+jwt", aud=API)
        assert claims["cnf"] == {"jkt": key.thumbprint()}

        response, body = await h.get(h.authorize_url(dpop_jkt="too-short"))
        assert response.code == 302 and b"" == body
        assert "dpop_jkt" in header(response, "location")[0]
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_client_required_to_use_dpop(tmp_path, monkeypatch):
    clients = [{**c, "dpop_bound_access_tokens": c["client_id"] == "spa"} for c in CLIENTS]
    h = await Harness(tmp_path, monkeypatch, {**DPOP_ON, "clients": clients}).start()
    try:
        code, verifier = await save_code(h, "spa")
        response, body = await exchange(h, code, verifier, "spa")
        assert_proof_refused(response, body, "must send a DPoP proof")
        response, body = await exchange(h, code, verifier, "spa",
                                        headers={"DPoP": proof(ec_key(), "POST", TOKEN_URL, h.now())})
        assert (response.code, body["token_type"]) == (200, "DPoP"), body
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_server_nonce(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, {"dpop": {"enabled": True, "use_nonce": True,
                                                       "nonce_lifetime": 300}}).start()
    try:
        key = ec_key()
        code, verifier = await save_code(h)
        response, body = await exchange(h, code, verifier, headers={"DPoP": proof(key, "POST", TOKEN_URL, h.now())})
        assert (response.code, body["error"]) == (400, "use_dpop_nonce"), body
        nonce = header(response, "dpop-nonce")[0]
        assert nonce == nonce_for(await h.store.server_key(NONCE_KEY), h.now(), 300)
        for forged in ("forged", "\u00e9t\u00e9"):
            response, body = await exchange(h, code, verifier, headers={
                "DPoP": proof(key, "POST", TOKEN_URL, h.now(), nonce=forged)})
            assert (response.code, body["error"]) == (400, "use_dpop_nonce"), body
        response, body = await exchange(h, code, verifier, headers={
            "DPoP": proof(key, "POST", TOKEN_URL, h.now(), nonce=nonce)})
        assert response.code == 200, body
        token = body["access_token"]

        h.clock.advance(300)
        response, answer = await h.json("GET", USERINFO, headers={"Authorization": f"DPoP {token}", "DPoP": proof(
            key, "GET", USERINFO_URL, h.now(), access_token=token, nonce=nonce)})
        assert response.code == 200, "a nonce of the previous window still counts"
        h.clock.advance(300)
        response, answer = await h.json("GET", USERINFO, headers={"Authorization": f"DPoP {token}", "DPoP": proof(
            key, "GET", USERINFO_URL, h.now(), access_token=token, nonce=nonce)})
        assert_dpop_challenge(response, answer, "use_dpop_nonce")
        fresh = header(response, "dpop-nonce")[0]
        assert fresh != nonce
        response, answer = await h.json("GET", USERINFO, headers={"Authorization": f"DPoP {token}", "DPoP": proof(
            key, "GET", USERINFO_URL, h.now(), access_token=token, nonce=fresh)})
        assert response.code == 200, answer
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_dpop_off_ignores_the_header_and_is_not_advertised(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        _, document = await h.json("GET", ISSUER + "/.well-known/openid-configuration")
        assert "dpop_signing_alg_values_supported" not in document
        code, verifier = await save_code(h)
        response, body = await exchange(h, code, verifier, headers={"DPoP": "anything"})
        assert (response.code, body["token_type"]) == (200, "Bearer"), body
        assert "cnf" not in await introspect(h, body["access_token"])
    finally:
        await h.close()
    (tmp_path / "on").mkdir()
    h = await Harness(tmp_path / "on", monkeypatch, DPOP_ON).start()
    try:
        for path in ("/.well-known/openid-configuration", "/.well-known/oauth-authorization-server"):
            _, document = await h.json("GET", ISSUER + path)
            assert "ES256" in document["dpop_signing_alg_values_supported"]
            assert not any(alg.startswith("HS") for alg in document["dpop_signing_alg_values_supported"])
    finally:
        await h.close()


def test_config_refuses_dpop_bound_clients_while_dpop_is_off():
    bound = {"client_id": "api", "redirect_uris": ["https://api.example/cb"], "dpop_bound_access_tokens": True}
    _, errors = read_config_document({"clients": [bound]}, None)
    assert [str(e) for e in errors] == [
        "clients[0].dpop_bound_access_tokens: needs DPoP offered: set [dpop] enabled = true"]
    assert read_config_document({"clients": [bound], "dpop": {"enabled": True}}, None)[1] == []
