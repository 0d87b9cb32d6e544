"""
client_secret_jwt through the in-memory server: a client declared with the
method and a C{[client_secrets]} key authenticates with an HMAC assertion at
every client-authenticated endpoint, once per assertion; the operator's
create, rotate and change keep the sealed secret right; the config refuses
what cannot work; and a sealed secret opens only for its own client. The
same against a real server with Authlib and openid-client is in
tests/test_e2e_client_secret_jwt.py.
"""

from __future__ import annotations


import attrs
import pytest
import pytest_twisted
from twisted.internet.defer import Deferred

from authsrv.client_secrets import SecretKeeper
from authsrv.config import parse_config
from authsrv.configsection import ConfigError
from authsrv.operations.clients import ClientOperations
from authsrv.operations.errors import InvalidInput
from authsrv.operations.views import client_view
from authsrv.protocol.discovery import advertised_assertion_algs
from authsrv.records import Client
from authsrv.sealing import Unsealable, key_from_text, new_key_text
from authsrv.tokens import token_hash

from harness import CLIENTS, ISSUER, Harness, discovery_when
from token_helpers import INTROSPECT, REVOKE, TOKEN, hmac_assertion

SECRET = "hmac-secret-Z8k2Lm5Qp9Rt3Wv7Xy1-Hq4Jd"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
KEY_TEXT = new_key_text()
HMAC_CLIENT = {"client_id": "hmac", "secret_env": "AUTHSRV_TEST_HMAC_SECRET", "grant_types": ["client_credentials"],
               "token_endpoint_auth_method": "client_secret_jwt", "scopes": ["reports.read"]}
KEYED = {"client_secrets": {"encryption_key_env": "AUTHSRV_TEST_CLIENT_SECRETS_KEY"}}


@pytest.fixture
def secrets_env(monkeypatch):
    monkeypatch.setenv("AUTHSRV_TEST_HMAC_SECRET", SECRET)
    monkeypatch.setenv("AUTHSRV_TEST_CLIENT_SECRETS_KEY", KEY_TEXT)


@pytest.fixture
def h(tmp_path, monkeypatch, secrets_env):
    harness = Harness(tmp_path, monkeypatch, {"clients": [*CLIENTS, HMAC_CLIENT], **KEYED})
    yield harness
    pytest_twisted.blockon(Deferred.fromCoroutine(harness.close()))


def signed(h, **fields) -> dict:
    return {"client_assertion_type": ASSERTION_TYPE,
            "client_assertion": hmac_assertion(SECRET, "hmac", ISSUER, h.now()), **fields}


@pytest_twisted.ensureDeferred
async def test_an_hmac_assertion_works_once_at_every_endpoint(h):
    await h.start()
    response, token = await h.json("POST", TOKEN, data=signed(h, grant_type="client_credentials"))
    assert response.code == 200 and token["scope"] == "reports.read", token
    response, answer = await h.json("POST", INTROSPECT, data=signed(h, token=token["access_token"]))
    assert response.code == 200 and answer["active"] is True and answer["client_id"] == "hmac"
    response, _ = await h.post(REVOKE, data=signed(h, token=token["access_token"]))
    assert response.code == 200
    once = signed(h, grant_type="client_credentials")
    assert (await h.post(TOKEN, data=once))[0].code == 200
    response, body = await h.json("POST", TOKEN, data=once)
    assert response.code == 401 and body["error"] == "invalid_client" and "already used" in body["error_description"]
    for wrong in (hmac_assertion("a-wrong-secret-of-a-good-length-000000", "hmac", ISSUER, h.now()),
                  hmac_assertion(SECRET, "hmac", ISSUER, h.now(), alg="HS512")):
        response, body = await h.json("POST", TOKEN, data={**signed(h, grant_type="client_credentials"),
                                                           "client_assertion": wrong})
        assert response.code == 401 and body["error"] == "invalid_client"
    response, body = await h.json("POST", TOKEN, data={"grant_type": "client_credentials", "client_id": "hmac",
                                                       "client_secret": SECRET})
    assert response.code == 401 and "client_secret_jwt assertion" in body["error_description"]


@pytest_twisted.ensureDeferred
async def test_an_assertion_authenticates_with_metadata_documents_on(tmp_path, monkeypatch, secrets_env):
    """Client ID metadata documents wrap the client cache: an operator's client still authenticates by assertion."""
    h = Harness(tmp_path, monkeypatch, {"clients": [*CLIENTS, HMAC_CLIENT], **KEYED,
                                        "registration": {"client_id_metadata_documents": True}})
    try:
        await h.start()
        response, token = await h.json("POST", TOKEN, data=signed(h, grant_type="client_credentials"))
        assert response.code == 200 and token["scope"] == "reports.read", token
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_the_operator_makes_rotates_and_changes_hmac_clients(h):
    await h.start()
    keeper = h.config.secret_keeper
    operations = ClientOperations(store=h.store, clock=h.clock, declared=frozenset(), resolve=None, secrets=keeper)
    client, secret = await operations.create({
        "client_id": "job", "grant_types": ["client_credentials"], "scopes": ["reports.read"],
        "token_endpoint_auth_method": "client_secret_jwt"}, actor="admin-api")
    assert keeper.secrets(client, h.now()) == (secret,) and "sealed_secret" not in client_view(client)
    assert len(secret) == 64, "48 random bytes: a full HS512 key"
    async def code(key: str) -> int:
        data = {"grant_type": "client_credentials", "client_assertion_type": ASSERTION_TYPE,
                "client_assertion": hmac_assertion(key, "job", ISSUER, h.now())}
        return (await h.post(TOKEN, data=data))[0].code

    assert await code(secret) == 200

    rotated, new = await operations.rotate_secret("job", actor="admin-api", overlap=600)
    assert keeper.secrets(rotated, h.now()) == (new, secret) and len(new) == 64
    h.clock.advance(3)  # past the client cache
    assert [await code(new), await code(secret)] == [200, 200]
    h.clock.advance(601)
    assert keeper.secrets(rotated, h.now()) == (new,)
    assert await code(secret) == 401

    changed = await operations.update("job", {"token_endpoint_auth_method": "client_secret_basic"}, actor="admin-api")
    assert changed.sealed_secret is None
    with pytest.raises(InvalidInput, match="kept sealed"):
        await operations.update("job", {"token_endpoint_auth_method": "client_secret_jwt"}, actor="admin-api")

    keyless = ClientOperations(store=h.store, clock=h.clock, declared=frozenset(), resolve=None)
    with pytest.raises(InvalidInput, match=r"\[client_secrets\] encryption_key_env"):
        await keyless.create({"client_id": "job2", "grant_types": ["client_credentials"],
                              "token_endpoint_auth_method": "client_secret_jwt"}, actor="admin-api")


def test_a_sealed_secret_opens_only_for_its_own_client_and_key():
    keeper = SecretKeeper(key_from_text(KEY_TEXT))
    client = Client("hmac", token_hash(SECRET), [], token_endpoint_auth_method="client_secret_jwt")
    sealed = keeper.seal("hmac", SECRET)
    assert SECRET.encode() not in sealed and keeper.seal("hmac", SECRET) != sealed
    assert keeper.secrets(attrs.evolve(client, client_id="hmac", sealed_secret=sealed), 0) == (SECRET,)
    with pytest.raises(Unsealable):
        keeper.secrets(attrs.evolve(client, client_id="other", sealed_secret=sealed), 0)
    with pytest.raises(Unsealable):
        SecretKeeper(key_from_text(new_key_text())).secrets(attrs.evolve(client, client_id="hmac",
                                                                          sealed_secret=sealed), 0)


@pytest.mark.parametrize("extra, env, words", [
    ({}, {}, r"client_secret_jwt needs the secret kept sealed on the server: set \[client_secrets\]"),
    (KEYED, {"AUTHSRV_TEST_HMAC_SECRET": "short-secret-of-20b"},
     r"clients\[0\]\.secret_env: a client_secret_jwt secret needs at least 32 bytes"),
    (KEYED, {"AUTHSRV_TEST_CLIENT_SECRETS_KEY": "not a key"}, "client_secrets.encryption_key_env: must be base64url"),
])
def test_client_secret_jwt_config_mistakes(extra, env, words, monkeypatch, secrets_env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=words):
        parse_config({"public_url": "https://auth.example.com", "clients": [HMAC_CLIENT], **extra}, None)


def test_a_declared_client_keeps_its_secret_sealed(secrets_env):
    config = parse_config({"clients": [HMAC_CLIENT], **KEYED}, None)
    client = config.clients[0]
    assert config.secret_keeper.secrets(client, 0) == (SECRET,)
    assert KEY_TEXT not in repr(config) and "sealed_secret" not in repr(client)


OPEN_REGISTRATION = {"enabled": True, "allowed_redirect_hosts": ["app.example"], "allow_confidential": True}


@pytest.mark.parametrize("config, listed", [
    ({"clients": [*CLIENTS, HMAC_CLIENT], **KEYED}, True),
    ({**KEYED, "registration": OPEN_REGISTRATION}, True),
    (KEYED, False),
    ({"registration": OPEN_REGISTRATION}, False),
    ({**KEYED, "registration": {**OPEN_REGISTRATION, "allow_confidential": False}}, False),
])
@pytest_twisted.ensureDeferred
async def test_discovery_lists_the_method_only_when_it_can_be_used(tmp_path, monkeypatch, secrets_env, config,
                                                                    listed):
    """With the sealing key, and a client that uses the method or may register with it."""
    discovery = await discovery_when(tmp_path, monkeypatch, config)
    for endpoint in ("token_endpoint", "introspection_endpoint", "revocation_endpoint"):
        assert ("client_secret_jwt" in discovery[f"{endpoint}_auth_methods_supported"]) is listed
        algorithms = discovery.get(f"{endpoint}_auth_signing_alg_values_supported", [])
        assert [alg for alg in algorithms if alg.startswith("HS")] == (["HS256", "HS384", "HS512"] if listed else [])


def test_a_client_secret_jwt_client_without_the_key_is_not_advertised():
    """A stored client may keep the method after the operator drops the key; it cannot authenticate then."""
    used = frozenset({"client_secret_jwt", "private_key_jwt"})
    assert advertised_assertion_algs(used, sealing=False, registrable=True) == ("RS256", "PS256", "ES256", "EdDSA")
    assert advertised_assertion_algs(used, sealing=True, registrable=False)[-3:] == ("HS256", "HS384", "HS512")
