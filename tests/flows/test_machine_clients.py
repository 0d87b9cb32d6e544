"""
client_credentials and private_key_jwt through the in-memory server: who may
use the grant, what a client's token for itself carries and where it is
refused, how an assertion is checked at every client-authenticated endpoint
(one use, even when the rate limiter looked at it first), and what
discovery lists. The same against a real server with Authlib is in
tests/test_e2e_machine_clients.py.
"""

from __future__ import annotations

import json
import uuid

import attrs

import pytest
import pytest_twisted
from jwcrypto import jwk, jwt
from jwcrypto.common import base64url_encode
from jwcrypto.jwa import JWA
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from authsrv.configsection import ConfigError
from authsrv.config import parse_config
from authsrv.protocol.client_assertion import public_keyset, verified_claims
from authsrv.flows.clients import AssertionChecker
from authsrv.operations.clients import ClientOperations
from authsrv.operations.errors import InvalidInput
from authsrv.operations.views import client_view
from authsrv.protocol.errors import InvalidClient
from authsrv.tokens import token_hash

from harness import CLIENTS, ISSUER, Harness
from token_helpers import INTROSPECT, REVOKE, TOKEN, USERINFO, basic

BOT_SECRET = "bot-secret-Z8k2Lm5Qp9Rt3Wv7Xy1"
API = "https://api.example.test"
KEY = jwk.JWK.generate(kty="EC", crv="P-256", kid="k1")
PUBLIC = json.dumps({"keys": [json.loads(KEY.export_public())]})
MACHINES = [
    {"client_id": "bot", "secret_env": "AUTHSRV_TEST_BOT_SECRET", "grant_types": ["client_credentials"],
     "scopes": ["reports.read", "reports.write", "openid"], "resources": [API]},
    {"client_id": "pinger", "secret_env": "AUTHSRV_TEST_BOT_SECRET", "grant_types": ["client_credentials"],
     "resources": [API]},
    {"client_id": "signer", "token_endpoint_auth_method": "private_key_jwt", "jwks": PUBLIC,
     "grant_types": ["client_credentials"], "scopes": ["reports.read"]},
]


@pytest.fixture
def h(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTHSRV_TEST_BOT_SECRET", BOT_SECRET)
    harness = Harness(tmp_path, monkeypatch, {"clients": [*CLIENTS, *MACHINES]})
    yield harness
    pytest_twisted.blockon(Deferred.fromCoroutine(harness.close()))


def assertion(now: int, *, key=KEY, iss="signer", aud=ISSUER, exp_in=60, jti=None, **claims) -> str:
    token = jwt.JWT(header={"alg": "ES256", "kid": key.kid}, claims={
        "iss": iss, "sub": iss, "aud": aud, "iat": now, "exp": now + exp_in, "jti": jti or uuid.uuid4().hex,
        **claims})
    token.make_signed_token(key)
    return token.serialize()


def signed(h, **fields) -> dict:
    return {"client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            "client_assertion": assertion(h.now()), **fields}


@pytest_twisted.ensureDeferred
async def test_a_client_token_for_itself(h):
    await h.start()
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                  headers=basic("bot", BOT_SECRET))
    assert response.code == 200, body
    assert body["scope"] == "reports.read reports.write"  # openid is never a client's own
    assert set(body) == {"access_token", "token_type", "expires_in", "scope"}
    _, blank = await h.json("POST", TOKEN, data={"grant_type": "client_credentials", "scope": "   "},
                            headers=basic("bot", BOT_SECRET))
    assert blank["scope"] == body["scope"], blank  # a blank scope is no scope asked: all the client may have
    access = await h.store.find_access_token(token_hash(body["access_token"]), h.now())
    assert access.sub == "" and not access.for_user
    response, answer = await h.json("GET", USERINFO, headers={"Authorization": f"Bearer {body['access_token']}"})
    assert response.code == 401 and "client_credentials" in answer["error_description"]
    _, seen = await h.json("POST", INTROSPECT, data={"token": body["access_token"]}, headers=basic("bot", BOT_SECRET))
    assert seen["active"] and seen["sub"] == "bot" and seen["client_id"] == "bot"


@pytest_twisted.ensureDeferred
async def test_a_client_jwt_for_a_resource_names_no_sign_in(h):
    """
    RFC 9068 section 2.2: a client's JWT for itself names the client as its
    sub and carries no auth_time (section 2.2.1: when a user signed in),
    since no one did; a resource server checking how fresh a sign-in is
    must not take the token's issue as one.
    """
    await h.start()
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials", "resource": API},
                                  headers=basic("bot", BOT_SECRET))
    assert response.code == 200, body
    checked = jwt.JWT(jwt=body["access_token"], key=h.keystore.public_keyset(), expected_type="JWS",
                      check_claims={"iss": ISSUER, "aud": API, "exp": h.now()})
    assert json.loads(checked.header)["typ"] == "at+jwt"
    claims = json.loads(checked.claims)
    assert set(claims) == {"iss", "sub", "aud", "client_id", "iat", "exp", "jti", "scope"}, claims
    assert (claims["sub"], claims["client_id"], claims["aud"]) == ("bot", "bot", API)


@pytest_twisted.ensureDeferred
async def test_a_client_asking_for_several_resources_is_told_to_ask_for_one(h):
    """RFC 8707: several resources in one request are invalid_target here, not a repeated parameter."""
    await h.start()
    response, body = await h.json("POST", TOKEN, data=[("grant_type", "client_credentials"), ("resource", API),
                                                       ("resource", "https://other.example.test")],
                                  headers=basic("bot", BOT_SECRET))
    assert (response.code, body["error"]) == (400, "invalid_target"), body
    assert "one resource" in body["error_description"]
    response, body = await h.json("POST", TOKEN, data=[("grant_type", "client_credentials"), ("scope", "a"),
                                                       ("scope", "b")], headers=basic("bot", BOT_SECRET))
    assert (response.code, body["error"]) == (400, "invalid_request"), body
    assert "repeated" in body["error_description"]


@pytest_twisted.ensureDeferred
async def test_a_token_without_scopes_names_none(h):
    """
    A client with no scopes of its own gets a token with none: its answer,
    its introspection and its JWT leave scope out rather than say "" (RFC
    6749 section 5.1, RFC 7662 section 2.2, RFC 9068 section 2.2.3: a scope
    is one or more names).
    """
    await h.start()
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                  headers=basic("pinger", BOT_SECRET))
    assert response.code == 200, body
    assert set(body) == {"access_token", "token_type", "expires_in"}, body
    _, seen = await h.json("POST", INTROSPECT, data={"token": body["access_token"]},
                           headers=basic("pinger", BOT_SECRET))
    assert seen["active"] and "scope" not in seen, seen
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials", "resource": API},
                                  headers=basic("pinger", BOT_SECRET))
    assert response.code == 200 and "scope" not in body, body
    checked = jwt.JWT(jwt=body["access_token"], key=h.keystore.public_keyset(), expected_type="JWS")
    assert "scope" not in json.loads(checked.claims)


@pytest_twisted.ensureDeferred
async def test_who_may_use_the_grant(h):
    await h.start()
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials", "client_id": "spa"})
    assert response.code == 400 and body["error"] == "unauthorized_client"
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                  headers=basic("first", "first-secret-Q3v9ZkP2mW7xL4nR8tY6"))
    assert body["error"] == "unauthorized_client"
    response, body = await h.json("POST", TOKEN, data={"grant_type": "authorization_code", "code": "x",
                                                       "redirect_uri": "x", "code_verifier": "x"},
                                  headers=basic("bot", BOT_SECRET))
    assert body["error"] == "unauthorized_client"


@pytest_twisted.ensureDeferred
async def test_assertions_work_once_at_every_endpoint(h, audit):
    await h.start()
    response, body = await h.json("POST", TOKEN, data=signed(h, grant_type="client_credentials"))
    assert response.code == 200, body
    token = body["access_token"]
    _, seen = await h.json("POST", INTROSPECT, data=signed(h, token=token))
    assert seen["active"] and seen["client_id"] == "signer"
    response, _ = await h.request("POST", REVOKE, data=signed(h, token=token))
    assert response.code == 200
    _, seen = await h.json("POST", INTROSPECT, data=signed(h, token=token))
    assert seen == {"active": False}

    once = signed(h, grant_type="client_credentials")
    assert (await h.request("POST", TOKEN, data=once))[0].code == 200
    response, body = await h.json("POST", TOKEN, data=once)
    assert response.code == 401 and body["error"] == "invalid_client"
    assert response.headers.getRawHeaders("www-authenticate")
    assert [e["client_id"] for e in audit.of("assertion.replayed")] == ["signer"]

    h.clock.advance(61)  # expired, but within the clock skew allowed: still a replay
    response, body = await h.json("POST", TOKEN, data=once)
    assert response.code == 401 and "already used" in body["error_description"]
    h.clock.advance(30)
    response, body = await h.json("POST", TOKEN, data=once)
    assert response.code == 401 and "expired" in body["error_description"]


@pytest_twisted.ensureDeferred
async def test_an_assertion_whose_times_have_a_fraction_authenticates_once(h):
    """
    RFC 7519 section 2: a NumericDate may have a fraction, as a library
    writing time.time() + 60 sends it; such an assertion authenticates, its
    jti is kept until its exp (rounded up) plus the skew, and a replay fails.
    """
    await h.start()
    now = h.now()
    fractional = assertion(now, exp_in=59.75, iat=now - 0.5, nbf=now - 0.25)
    once = {"grant_type": "client_credentials", "client_assertion": fractional,
            "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"}
    response, body = await h.json("POST", TOKEN, data=once)
    assert response.code == 200, body
    h.clock.advance(60 + 29)  # expired, but within the skew: its jti is still kept
    response, body = await h.json("POST", TOKEN, data=once)
    assert response.code == 401 and "already used" in body["error_description"], body
    response, body = await h.json("POST", TOKEN, data={**once, "client_assertion": assertion(
        h.now(), iat="yesterday")})
    assert response.code == 401 and "iat is not a NumericDate" in body["error_description"], body


@pytest_twisted.ensureDeferred
async def test_assertion_requests_that_mix_methods_or_types(h):
    await h.start()
    response, body = await h.json("POST", TOKEN, data=signed(h, grant_type="client_credentials",
                                                             client_assertion_type="urn:other"))
    assert response.code == 400 and body["error"] == "invalid_request"
    response, body = await h.json("POST", TOKEN, data=signed(h, grant_type="client_credentials", client_id="bot"))
    assert response.code == 401 and "differs" in body["error_description"]
    response, body = await h.json("POST", TOKEN, data=signed(h, grant_type="client_credentials",
                                                             client_secret="x"))
    assert response.code == 400 and body["error"] == "invalid_request"
    response, body = await h.json("POST", TOKEN, data={
        "grant_type": "client_credentials", "client_assertion_type": signed(h)["client_assertion_type"],
        "client_assertion": "not.a.jwt"})
    assert response.code == 401 and body["error"] == "invalid_client"


@pytest_twisted.ensureDeferred
async def test_discovery_lists_only_what_some_client_uses(h, tmp_path, monkeypatch):
    await h.start()
    _, discovery = await h.json("GET", "/api/auth/.well-known/oauth-authorization-server")
    assert "client_credentials" in discovery["grant_types_supported"]
    assert "private_key_jwt" in discovery["token_endpoint_auth_methods_supported"]
    (tmp_path / "plain").mkdir()
    plain = await Harness(tmp_path / "plain", monkeypatch).start()
    try:
        _, discovery = await plain.json("GET", "/api/auth/.well-known/openid-configuration")
        assert discovery["grant_types_supported"] == ["authorization_code", "refresh_token"]
        assert "private_key_jwt" not in discovery["token_endpoint_auth_methods_supported"]
        assert "token_endpoint_auth_signing_alg_values_supported" not in discovery
        # The request started a refresh on the store's read thread; a read queued behind it returns after it,
        # so the client added next is not in that refresh and the minute counts from its end.
        await plain.store.list_clients()
        await plain.store.add_client(h.config.clients[-1])
        plain.clock.advance(59)
        _, discovery = await plain.json("GET", "/api/auth/.well-known/openid-configuration")
        assert "client_credentials" not in discovery["grant_types_supported"]  # seen within a minute
        plain.clock.advance(1)
        for _ in range(1000):  # the refresh it starts runs on the store's thread: at most 10 s on a busy machine
            _, discovery = await plain.json("GET", "/api/auth/.well-known/openid-configuration")
            if "client_credentials" in discovery["grant_types_supported"]:
                break
            await deferLater(reactor, 0.01)
        assert "client_credentials" in discovery["grant_types_supported"]
        assert discovery["token_endpoint_auth_signing_alg_values_supported"] == ["RS256", "PS256", "ES256", "EdDSA"]
    finally:
        await plain.close()


def test_claims_checks():
    keyset = public_keyset(PUBLIC)
    now = 1_800_000_000
    audiences = (ISSUER, ISSUER + "/oauth2/token")
    assert verified_claims(assertion(now, aud=[ISSUER, "x"]), "signer", keyset, audiences, now)["iss"] == "signer"
    assert verified_claims(assertion(now, aud=audiences[1]), "signer", keyset, audiences, now)
    for bad, words in [
        (assertion(now, iat=now + 600), "iat is in the future"),
        (assertion(now, nbf=now + 600), "nbf is in the future"),
        (assertion(now, jti=7), "jti"),
        (assertion(now, exp_in=-31), "expired"),
        (assertion(now, aud=ISSUER + "/elsewhere"), "aud"),
    ]:
        with pytest.raises(InvalidClient, match=words):
            verified_claims(bad, "signer", keyset, audiences, now)
    with pytest.raises(InvalidClient, match="ES256"):
        verified_claims(assertion(now), "signer", keyset, audiences, now, algorithms=("RS256",))


def test_a_registered_key_set_must_be_public():
    with pytest.raises(ValueError, match="private key"):
        public_keyset(json.dumps({"keys": [json.loads(KEY.export_private())]}))
    with pytest.raises(ValueError, match="public RSA, EC or OKP"):
        public_keyset(json.dumps({"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}))
    with pytest.raises(ValueError, match="at least one key"):
        public_keyset('{"keys": []}')


def test_a_key_set_is_made_once_for_every_request_that_presents_it():
    keyset = public_keyset(PUBLIC)
    assert public_keyset(PUBLIC) is keyset
    fetched = public_keyset(json.loads(PUBLIC))
    assert public_keyset(json.loads(PUBLIC)) is fetched
    assert fetched.get_key(KEY.kid) is not None
    for _ in range(2):
        with pytest.raises(ValueError, match="at least one key"):
            public_keyset('{"keys": []}')


@pytest.mark.parametrize("client, words", [
    ({"client_id": "c", "grant_types": ["client_credentials"]}, "grant_types: client_credentials is for confidential"),
    ({"client_id": "c", "grant_types": ["authorization_code"], "secret_env": "S"}, "redirect_uris: must name"),
    ({"client_id": "c", "token_endpoint_auth_method": "private_key_jwt", "grant_types": ["client_credentials"]},
     "exactly one of jwks and jwks_uri"),
    ({"client_id": "c", "token_endpoint_auth_method": "private_key_jwt", "grant_types": ["client_credentials"],
      "jwks_uri": "https://10.0.0.5/jwks.json"}, "jwks_uri: 'https://10.0.0.5/jwks.json' is refused"),
    ({"client_id": "c", "token_endpoint_auth_method": "private_key_jwt", "grant_types": ["client_credentials"],
      "jwks_uri": "http://keys.example/jwks.json"}, "must use https"),
    ({"client_id": "c", "token_endpoint_auth_method": "private_key_jwt", "grant_types": ["client_credentials"],
      "jwks": json.dumps({"keys": [json.loads(KEY.export_private())]})}, "private key"),
    ({"client_id": "c", "jwks": PUBLIC, "redirect_uris": ["https://a.example/cb"]}, "only a private_key_jwt"),
    ({"client_id": "c", "secret_env": "S", "grant_types": ["client_credentials"], "scopes": ['a"b']}, "scopes"),
    ({"client_id": "c", "token_endpoint_auth_method": "none", "grant_types": ["client_credentials"]},
     "client_credentials is for confidential"),
    ({"client_id": "c", "token_endpoint_auth_method": "client_secret_post", "redirect_uris": ["https://a.example/cb"]},
     "client_secret_post needs a client secret"),
])
def test_client_config_mistakes(client, words, monkeypatch):
    monkeypatch.setenv("S", "a-long-enough-secret-for-loopback")
    with pytest.raises(ConfigError, match=words):
        parse_config({"clients": [client]}, None)


def test_a_client_credentials_client_needs_no_redirect_uris(monkeypatch):
    monkeypatch.setenv("S", "a-long-enough-secret-for-loopback")
    client = parse_config({"clients": [{"client_id": "c", "secret_env": "S", "grant_types": ["client_credentials"]}]},
                          None).clients[0]
    assert client.redirect_uris == () and client.grant_types == ("client_credentials",)


@pytest_twisted.ensureDeferred
async def test_the_operator_registers_machine_clients(h):
    await h.start()
    operations = ClientOperations(store=h.store, clock=h.clock, declared=frozenset(), resolve=None)
    client, secret = await operations.create({
        "client_id": "job", "grant_types": ["client_credentials"], "scopes": ["reports.read"],
        "token_endpoint_auth_method": "private_key_jwt", "jwks": json.loads(PUBLIC)}, actor="admin-api")
    assert secret is None and not client.is_public and client.redirect_uris == ()
    assert client_view(client)["jwks"] == json.loads(PUBLIC)
    response, body = await h.json("POST", TOKEN, data={**signed(h, grant_type="client_credentials"),
                                                       "client_assertion": assertion(h.now(), iss="job")})
    assert response.code == 200 and body["scope"] == "reports.read"
    bot, secret = await operations.create({"client_id": "bot2", "grant_types": ["client_credentials"]},
                                          actor="admin-api")
    assert secret and not bot.is_public
    for data, field in [
        ({"client_id": "j2", "grant_types": ["client_credentials"], "token_endpoint_auth_method": "private_key_jwt",
          "jwks_uri": "https://127.0.0.1/jwks.json"}, "jwks_uri"),
        ({"client_id": "j3", "grant_types": ["client_credentials"], "public": True}, "grant_types"),
        ({"client_id": "j4", "jwks": {"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}}, "jwks"),
        ({"client_id": "j5"}, "redirect_uris"),
    ]:
        with pytest.raises(InvalidInput) as caught:
            await operations.create(data, actor="admin-api")
        assert caught.value.field == field, caught.value


@pytest_twisted.ensureDeferred
async def test_an_unknown_kid_refetches_the_key_set_once(h):
    """A rotated key is found by fetching the jwks_uri again; a kid still unknown then fails without more fetches."""
    await h.start()
    rotated = jwk.JWK.generate(kty="EC", crv="P-256", kid="k2")
    answers = [json.loads(PUBLIC), {"keys": [json.loads(KEY.export_public()), json.loads(rotated.export_public())]}]
    fetched = []

    class Documents:
        """The cached set until a refetch, the rotated one from then on."""

        async def fetch(self, url, refetch=False):
            fetched.append(refetch)
            return answers[1 if True in fetched else 0]

    remote = attrs.evolve(h.config.clients[-1], client_id="remote", jwks=None, jwks_uri="https://keys.example/j")
    checker = AssertionChecker(store=h.store, documents=Documents(), audiences=(ISSUER,))
    assert await checker.check(remote, assertion(h.now(), iss="remote"), h.now(), True) is remote
    assert fetched == [False]
    assert await checker.check(remote, assertion(h.now(), key=rotated, iss="remote"), h.now(), True) is remote
    assert fetched == [False, False, True]
    stranger = jwk.JWK.generate(kty="EC", crv="P-256", kid="k3")
    with pytest.raises(InvalidClient, match="does not verify"):
        await checker.check(remote, assertion(h.now(), key=stranger, iss="remote"), h.now(), True)
    assert fetched == [False, False, True, False, True]


@pytest_twisted.ensureDeferred
async def test_a_removed_client_gets_no_token_while_an_instance_still_holds_it(h, audit):
    """
    An operator removes a client (its secret leaked, say) while this instance
    holds it in its cache: the secret still checks out against the cached
    record, but the store starts no grant for a client it no longer has.
    """
    await h.start()
    operations = ClientOperations(store=h.store, clock=h.clock, declared=frozenset(), resolve=None)
    _, secret = await operations.create({"client_id": "leaky", "grant_types": ["client_credentials"]},
                                        actor="admin-api")
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                  headers=basic("leaky", secret))
    assert response.code == 200, body
    await operations.delete("leaky", actor="admin-api")
    for later in (0, 3):
        h.clock.advance(later)
        response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                      headers=basic("leaky", secret))
        assert (response.code, body["error"]) == (401, "invalid_client"), body
    assert [e["client_id"] for e in audit.of("token.issued")] == ["leaky"]


@pytest_twisted.ensureDeferred
async def test_a_secret_ended_elsewhere_mints_nothing_more_while_this_instance_caches_its_client(h, audit):
    """
    Another instance ends a leaked secret (overlap 0) while this one holds
    the client in its cache: client_credentials reads the client from the
    store, so the old secret mints nothing more, and the new one works at
    once. Other grants answer from the cache until that read replaces it.
    """
    await h.start()
    operations = ClientOperations(store=h.store, clock=h.clock, declared=frozenset(), resolve=None)
    _, old = await operations.create(
        {"client_id": "leaky", "grant_types": ["client_credentials", "refresh_token"]}, actor="admin-api")
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                  headers=basic("leaky", old))
    assert response.code == 200, body
    _, new = await operations.rotate_secret("leaky", actor="admin-api", overlap=0)
    refresh = {"grant_type": "refresh_token", "refresh_token": "unknown"}
    _, body = await h.json("POST", TOKEN, data=refresh, headers=basic("leaky", old))
    assert body["error"] == "invalid_grant", body  # the cached client took the old secret
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                  headers=basic("leaky", old))
    assert (response.code, body["error"]) == (401, "invalid_client"), body
    _, body = await h.json("POST", TOKEN, data=refresh, headers=basic("leaky", old))
    assert body["error"] == "invalid_client", body  # the store's record replaced the cached one
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                  headers=basic("leaky", new))
    assert response.code == 200, body
    assert len(audit.of("token.issued")) == 2


@pytest_twisted.ensureDeferred
async def test_a_store_that_answers_none_for_a_new_grant_is_taken_as_having_stored_it(h, monkeypatch):
    """A store plugin written before start_grant answered True still issues tokens."""
    await h.start()
    store_grant = h.store.start_grant
    monkeypatch.setattr(h.store, "start_grant", lambda grant, access: store_grant(grant, access).addCallback(
        lambda stored: None))
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials"},
                                  headers=basic("bot", BOT_SECRET))
    assert response.code == 200, body
    assert (await h.store.find_access_token(token_hash(body["access_token"]), h.now())).client_id == "bot"


def crafted(header: dict, claims: dict, key=KEY) -> str:
    """A compact JWS of C{header} and C{claims} exactly as given, signed by C{key} with ES256."""
    signing_input = b".".join(base64url_encode(json.dumps(part)).encode() for part in (header, claims))
    signature = base64url_encode(JWA.signing_alg("ES256").sign(key, signing_input))
    return f"{signing_input.decode()}.{signature}"


@pytest.mark.parametrize("crit", [5, None, [[]], [{}]])
@pytest_twisted.ensureDeferred
async def test_an_assertion_with_a_malformed_crit_header_is_invalid_client(h, crit):
    """RFC 7515 section 4.1.11: crit is an array of header names; anything else is no JWS, and never a 500."""
    await h.start()
    now = h.now()
    forged = crafted({"alg": "ES256", "kid": KEY["kid"], "crit": crit}, {
        "iss": "signer", "sub": "signer", "aud": ISSUER, "exp": now + 60, "jti": uuid.uuid4().hex})
    response, body = await h.json("POST", TOKEN, data={
        "grant_type": "client_credentials", "client_assertion": forged,
        "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"})
    assert response.code == 401 and body["error"] == "invalid_client", body
    assert "not a compact signed JWT" in body["error_description"]


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
@pytest_twisted.ensureDeferred
async def test_a_jti_holding_a_nul_is_invalid_client_on_every_store(request, tmp_path, monkeypatch, store, audit):
    """
    The jti is kept as it came until the assertion expires, and PostgreSQL
    text cannot hold U+0000: such a jti was taken on SQLite, and on
    PostgreSQL called "already used" and audited as a replay. It is refused
    for what it is, whatever the store.
    """
    monkeypatch.setenv("AUTHSRV_TEST_BOT_SECRET", BOT_SECRET)
    dsn = request.getfixturevalue("pg_dsn") if store == "postgres" else None
    h = Harness(tmp_path, monkeypatch, {"clients": [*CLIENTS, *MACHINES]}, postgres_dsn=dsn)
    try:
        await h.start()
        response, body = await h.json("POST", TOKEN, data=signed(h, grant_type="client_credentials",
                                                                 client_assertion=assertion(h.now(), jti="a\x00b")))
        assert (response.code, body["error"]) == (401, "invalid_client"), body
        assert "without NUL" in body["error_description"]
        assert audit.of("assertion.replayed") == []
        response, body = await h.json("POST", TOKEN, data=signed(h, grant_type="client_credentials"))
        assert response.code == 200, body
    finally:
        await h.close()


def test_a_key_registered_for_one_algorithm_verifies_only_that_one():
    """
    RFC 7517 section 4.4 and RFC 8725 section 3.1: a key whose alg the
    client registered signs with that algorithm alone (node-oidc-provider
    selects keys so too); a key registered without alg serves any its type can.
    """
    rsa = jwk.JWK.generate(kty="RSA", size=2048, kid="r1")
    now = 1_800_000_000
    audiences = (ISSUER,)
    claims = {"iss": "signer", "sub": "signer", "aud": ISSUER, "exp": now + 60, "jti": "j"}

    def made(alg: str) -> str:
        token = jwt.JWT(header={"alg": alg, "kid": "r1"}, claims=claims)
        token.make_signed_token(rsa)
        return token.serialize()

    pinned = public_keyset({"keys": [{**rsa.export_public(as_dict=True), "alg": "RS256"}]})
    assert verified_claims(made("RS256"), "signer", pinned, audiences, now)["jti"] == "j"
    with pytest.raises(InvalidClient, match="registered for RS256, not PS256"):
        verified_claims(made("PS256"), "signer", pinned, audiences, now)
    unpinned = public_keyset({"keys": [rsa.export_public(as_dict=True)]})
    for alg in ("RS256", "PS256"):
        assert verified_claims(made(alg), "signer", unpinned, audiences, now)["jti"] == "j"
