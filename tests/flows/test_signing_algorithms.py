"""
Per-client signing algorithms, end to end in memory: each algorithm's ID
tokens, JWT access tokens and signed UserInfo answers verify with the
published JWKS under two independent verifiers (jwcrypto and Authlib's
joserfc), introspection and end-session accept them, discovery lists exactly
what the keystore signs with, and what a client may choose is checked in
the config file, the admin operations and at the token endpoint.
"""

from __future__ import annotations

import base64
import json

import attrs
import pytest
import pytest_twisted
from joserfc import jwt as joserfc_jwt
from joserfc.jwk import KeySet
from jwcrypto.jwk import JWKSet
from jwcrypto.jwt import JWT

from authsrv.config import read_config_document
from authsrv.operations.clients import ClientOperations
from authsrv.operations.errors import InvalidInput
from authsrv.protocol.signing import ALGORITHMS, HASHES, SigningOffer
from authsrv.testing.identity import ALICE
from authsrv.testing.memory import MemoryStore

from harness import CLIENTS, ISSUER, Harness
from token_helpers import API, USERINFO, exchange, introspect, save_code, tokens

END_SESSION = ISSUER + "/oauth2/end-session"


def _config(id_alg="RS256", access_alg="RS256", userinfo_alg=None, algorithms=ALGORITHMS, userinfo=True) -> dict:
    first = {**CLIENTS[0], "id_token_signed_response_alg": id_alg, "access_token_signed_response_alg": access_alg}
    if userinfo_alg is not None:
        first["userinfo_signed_response_alg"] = userinfo_alg
    return {
        "clients": [first, *CLIENTS[1:]],
        "keystore": {"algorithms": list(algorithms)},
        "userinfo": {"signing": userinfo},
    }


async def _published(h) -> bytes:
    response, body = await h.get("/api/auth/jwks")
    assert response.code == 200
    return body


def _verified(token: str, jwks: bytes, alg: str, typ: str) -> dict:
    """The claims of C{token}, checked by jwcrypto and by joserfc against the JWKS as served, allowing only C{alg}."""
    checked = JWT(jwt=token, key=JWKSet.from_json(jwks), algs=[alg], expected_type="JWS")
    header = json.loads(checked.header)
    assert header["alg"] == alg and header["typ"] == typ
    published = {key["kid"]: key for key in json.loads(jwks)["keys"]}
    assert published[header["kid"]]["alg"] == alg
    claims = json.loads(checked.claims)
    other = joserfc_jwt.decode(token, KeySet.import_key_set(json.loads(jwks)), algorithms=[alg])
    assert other.header["alg"] == alg and other.claims == claims
    return claims


def _at_hash(token: str, alg: str) -> str:
    digest = HASHES[alg](token.encode()).digest()
    return base64.urlsafe_b64encode(digest[: len(digest) // 2]).rstrip(b"=").decode()


@pytest.mark.parametrize("alg", ALGORITHMS)
@pytest_twisted.ensureDeferred
async def test_each_algorithm_end_to_end(tmp_path, monkeypatch, alg):
    h = await Harness(tmp_path, monkeypatch, _config(alg, alg, alg)).start()
    try:
        jwks = await _published(h)
        assert {key["alg"] for key in json.loads(jwks)["keys"]} == set(ALGORITHMS)

        body = await tokens(h, resource=(API,))
        id_claims = _verified(body["id_token"], jwks, alg, "JWT")
        assert (id_claims["iss"], id_claims["aud"], id_claims["sub"]) == (ISSUER, "first", ALICE.sub)
        assert id_claims["at_hash"] == _at_hash(body["access_token"], alg)
        access_claims = _verified(body["access_token"], jwks, alg, "at+jwt")
        assert (access_claims["aud"], access_claims["client_id"]) == (API, "first")
        assert (await introspect(h, body["access_token"]))["active"] is True

        opaque = (await tokens(h))["access_token"]
        response, answer = await h.get(USERINFO, headers={"Authorization": f"Bearer {opaque}"})
        assert response.code == 200, answer
        assert response.headers.getRawHeaders(b"content-type") == [b"application/jwt"]
        assert response.headers.getRawHeaders(b"cache-control") == [b"no-store"]
        info = _verified(answer.decode(), jwks, alg, "JWT")
        assert (info["iss"], info["aud"], info["sub"], info["email"]) == (ISSUER, "first", ALICE.sub, ALICE.email)

        response, page = await h.get(END_SESSION, params={
            "id_token_hint": body["id_token"], "post_logout_redirect_uri": "http://127.0.0.1:9000/",
        })
        assert response.code == 302, page
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_clients_choose_separately_and_default_to_rs256_and_json(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch, _config("EdDSA", "PS256")).start()
    try:
        jwks = await _published(h)
        body = await tokens(h, resource=(API,))
        _verified(body["id_token"], jwks, "EdDSA", "JWT")
        _verified(body["access_token"], jwks, "PS256", "at+jwt")
        opaque = (await tokens(h))["access_token"]
        response, answer = await h.json("GET", USERINFO, headers={"Authorization": f"Bearer {opaque}"})
        assert response.headers.getRawHeaders(b"content-type") == [b"application/json"]
        assert answer["sub"] == ALICE.sub

        partner = await tokens(h, "partner")
        _verified(partner["id_token"], jwks, "RS256", "JWT")
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_discovery_lists_exactly_what_can_be_produced(tmp_path, monkeypatch):
    for algorithms, userinfo in ((("RS256", "ES256"), True), (("RS256",), False)):
        folder = tmp_path / "-".join(algorithms)
        folder.mkdir()
        h = await Harness(folder, monkeypatch, _config(algorithms=algorithms, userinfo=userinfo)).start()
        try:
            _, oidc = await h.json("GET", "/api/auth/.well-known/openid-configuration")
            _, oauth = await h.json("GET", "/api/auth/.well-known/oauth-authorization-server")
            jwks = json.loads(await _published(h))
        finally:
            await h.close()
        assert oidc["id_token_signing_alg_values_supported"] == list(algorithms)
        assert oauth["id_token_signing_alg_values_supported"] == list(algorithms)
        assert {key["alg"] for key in jwks["keys"]} == set(algorithms)
        if userinfo:
            assert oidc["userinfo_signing_alg_values_supported"] == list(algorithms)
        else:
            assert "userinfo_signing_alg_values_supported" not in oidc


@pytest_twisted.ensureDeferred
async def test_an_algorithm_no_longer_offered_is_refused_plainly(tmp_path, monkeypatch):
    """A stored client keeps ES256 after the operator dropped it from [keystore] algorithms."""
    h = await Harness(tmp_path, monkeypatch, _config(algorithms=("RS256",))).start()
    try:
        first = await h.store.get_client("first")
        await h.store.put_client(attrs.evolve(first, id_token_signed_response_alg="ES256"))
        code, verifier = await save_code(h)
        response, body = await exchange(h, code, verifier)
        assert response.code == 400 and body["error"] == "unauthorized_client", body
        assert "id_token_signed_response_alg is ES256" in body["error_description"]

        await h.store.put_client(attrs.evolve(first, userinfo_signed_response_alg="ES256"))
        h.clock.advance(5)  # past the client cache
        opaque = (await tokens(h))["access_token"]
        response, answer = await h.json("GET", USERINFO, headers={"Authorization": f"Bearer {opaque}"})
        # RFC 6750 has no error for the server's own setting: a server error, saying which.
        assert response.code == 500 and answer["error"] == "server_error", answer
        assert "userinfo_signed_response_alg is ES256" in answer["error_description"]
    finally:
        await h.close()


def _problems(config: dict) -> list[str]:
    document = {"clients": config.pop("clients"), **config}
    _, errors = read_config_document(document, None)
    return [str(e) for e in errors]


def test_config_refuses_an_algorithm_the_server_does_not_offer(monkeypatch):
    for name, value in (("AUTHSRV_TEST_FIRST_SECRET", "x" * 40), ("AUTHSRV_TEST_PARTNER_SECRET", "y" * 40),
                        ("AUTHSRV_TEST_GATEWAY_SECRET", "z" * 40)):
        monkeypatch.setenv(name, value)
    assert _problems(_config("ES256", algorithms=("RS256", "ES256"))) == []
    assert _problems(_config("ES256", algorithms=("RS256",))) == [
        "clients[0].id_token_signed_response_alg: ES256 is not offered by this server:"
        " add it to [keystore] algorithms (now RS256) or choose among those"
    ]
    config = _config(access_alg="PS256")
    del config["keystore"]
    assert _problems(config) == [
        "clients[0].access_token_signed_response_alg: PS256 is not offered by this server:"
        " add it to [keystore] algorithms (now RS256) or choose among those"
    ]
    assert _problems(_config(userinfo_alg="ES256", userinfo=False)) == [
        "clients[0].userinfo_signed_response_alg: needs signed UserInfo responses, which this server"
        " does not offer: set [userinfo] signing = true first"
    ]
    assert _problems(_config("HS256")) == [
        "clients[0].id_token_signed_response_alg: 'HS256' is not a signing algorithm;"
        " choose among RS256, PS256, ES256, EdDSA"
    ]
    assert _problems(_config("none")) == [
        "clients[0].id_token_signed_response_alg: 'none' is not a signing algorithm;"
        " choose among RS256, PS256, ES256, EdDSA"
    ]


@pytest_twisted.ensureDeferred
async def test_admin_operations_refuse_an_algorithm_the_server_does_not_offer():
    from twisted.internet.task import Clock

    store = MemoryStore()
    operations = ClientOperations(
        store=store, clock=Clock(), declared=frozenset(), resolve=None,
        signing=SigningOffer(("RS256", "ES256"), userinfo=False),
    )
    base = {"client_id": "app", "redirect_uris": ["https://app.example/cb"]}
    for field, value, words in (
        ("id_token_signed_response_alg", "EdDSA", "EdDSA is not offered by this server"),
        ("access_token_signed_response_alg", "HS256", "'HS256' is not a signing algorithm"),
        ("id_token_signed_response_alg", None, "must be an algorithm's name"),
        ("id_token_signed_response_alg", 7, "must be a non-empty string"),
        ("userinfo_signed_response_alg", "ES256", "set [userinfo] signing = true"),
    ):
        with pytest.raises(InvalidInput) as refused:
            await operations.create({**base, field: value}, actor="test")
        assert refused.value.field == field and words in refused.value.message
    assert await store.list_clients() == []

    client, _ = await operations.create({**base, "id_token_signed_response_alg": "ES256"}, actor="test")
    assert (client.id_token_signed_response_alg, client.access_token_signed_response_alg) == ("ES256", "RS256")
    with pytest.raises(InvalidInput):
        await operations.update("app", {"access_token_signed_response_alg": "PS256"}, actor="test")
    changed = await operations.update("app", {"access_token_signed_response_alg": "ES256"}, actor="test")
    assert (await store.get_client("app")) == changed
    assert changed.access_token_signed_response_alg == "ES256"
