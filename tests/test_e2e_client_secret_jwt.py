"""
client_secret_jwt (RFC 7523, OIDC Core section 9) against a real listening
server (C{twist authsrv}) with a C{[client_secrets]} key, driven by
Authlib's and openid-client's unmodified clients: client_credentials,
introspection and revocation authenticated with an HMAC assertion keyed
with the client's secret; discovery lists the method and its algorithms;
and the attacks: a replayed assertion, a wrong secret, a wrong audience, an
asymmetric or none algorithm, the secret sent in plain, an HMAC assertion
for a private_key_jwt client, and a sealed secret copied to another client.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
import uuid

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.rfc7523 import ClientSecretJWT
from jwcrypto import jwk, jwt

from authsrv.sealing import new_key_text

from conftest import ROOT, free_port
from test_e2e_machine_clients import ASSERTION_TYPE, public_set, server_config
from token_helpers import hmac_assertion

pytestmark = pytest.mark.slow

SECRET = "hmac-bot-secret-Vq8wZ3kP9mT4xL7nR2yB-long-enough-for-HS512-6Gz1x"
OTHER_SECRET = "other-bot-secret-Lp4sW8cN1qZ6vH3jK9dF"
JS = ROOT / "tests" / "js"


@pytest.fixture(scope="module")
def signer_key():
    return jwk.JWK.generate(kty="EC", crv="P-256", kid="signer-1")


@pytest.fixture
def hmac_server(run_server, tmp_path, signer_key):
    port = free_port()
    (tmp_path / "users.toml").write_text("")
    (tmp_path / "client-secrets-key").write_text(new_key_text())
    config = server_config(port) + f"""
[client_secrets]
encryption_key_file = "client-secrets-key"

[[clients]]
client_id = "hmac-bot"
secret_env = "HMAC_BOT_SECRET"
token_endpoint_auth_method = "client_secret_jwt"
grant_types = ["client_credentials"]
scopes = ["reports.read"]

[[clients]]
client_id = "other-bot"
secret_env = "OTHER_BOT_SECRET"
token_endpoint_auth_method = "client_secret_jwt"
grant_types = ["client_credentials"]
scopes = ["reports.read"]

[[clients]]
client_id = "signer"
token_endpoint_auth_method = "private_key_jwt"
jwks = '{public_set(signer_key)}'
grant_types = ["client_credentials"]
scopes = ["reports.read"]
"""
    (tmp_path / "authsrv.toml").write_text(config)
    server = run_server(["authsrv", "--config", str(tmp_path / "authsrv.toml")], tmp_path, port=port,
                        env={"HMAC_BOT_SECRET": SECRET, "OTHER_BOT_SECRET": OTHER_SECRET})
    server.issuer = server.base + "/api/auth"
    server.token_endpoint = server.issuer + "/oauth2/token"
    server.folder = tmp_path
    return server


def keyed(secret: str, server, *, iss="hmac-bot", **claims) -> str:
    return hmac_assertion(secret, iss, server.issuer, int(time.time()), **claims)


def token_request(server, assertion: str, **extra) -> requests.Response:
    return requests.post(server.token_endpoint, data={
        "grant_type": "client_credentials", "client_assertion_type": ASSERTION_TYPE, "client_assertion": assertion,
        **extra,
    }, timeout=5)


def test_discovery_lists_both_assertion_methods_and_their_algorithms(hmac_server):
    discovery = requests.get(hmac_server.issuer + "/.well-known/openid-configuration", timeout=5).json()
    for endpoint in ("token_endpoint", "introspection_endpoint", "revocation_endpoint"):
        assert {"private_key_jwt", "client_secret_jwt"} <= set(discovery[f"{endpoint}_auth_methods_supported"])
        algorithms = discovery[f"{endpoint}_auth_signing_alg_values_supported"]
        assert {"HS256", "HS384", "HS512", "ES256"} <= set(algorithms) and "none" not in algorithms


def test_client_secret_jwt_with_authlib(hmac_server):
    session = OAuth2Session("hmac-bot", SECRET,
                            token_endpoint_auth_method=ClientSecretJWT(hmac_server.token_endpoint))
    token = session.fetch_token(hmac_server.token_endpoint, grant_type="client_credentials")
    assert token["scope"] == "reports.read" and "refresh_token" not in token
    introspect = hmac_server.issuer + "/oauth2/introspect"
    answer = session.introspect_token(introspect, token=token["access_token"]).json()
    assert answer["active"] is True and answer["client_id"] == "hmac-bot"
    session.revocation_endpoint_auth_method = ClientSecretJWT(hmac_server.token_endpoint, alg="HS512")
    revoked = session.revoke_token(hmac_server.issuer + "/oauth2/revoke", token=token["access_token"])
    assert revoked.status_code == 200, revoked.text
    assert session.introspect_token(introspect, token=token["access_token"]).json() == {"active": False}


def test_client_secret_jwt_with_openid_client(hmac_server):
    """openid-client from npm (scripts/test.sh installs it); skipped only outside CI without node or the package."""
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "openid-client").is_dir():
        if os.environ.get("CI"):
            pytest.fail("CI must run openid-client: node and tests/js/node_modules (scripts/test.sh) are missing")
        pytest.skip("node or openid-client (npm install in tests/js) is not installed here")
    result = subprocess.run([node, str(JS / "machine_client.mjs"), hmac_server.issuer, "hmac-bot", "client_secret_jwt",
                             SECRET],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["token_type"].lower() == "bearer" and got["scope"] == "reports.read"
    assert got["has_refresh_token"] is False
    assert got["introspection"]["active"] is True and got["introspection"]["client_id"] == "hmac-bot"


def test_a_replayed_assertion_is_invalid_client(hmac_server):
    once = keyed(SECRET, hmac_server)
    assert token_request(hmac_server, once).status_code == 200
    again = token_request(hmac_server, once)
    assert again.status_code == 401 and again.json()["error"] == "invalid_client"
    assert "already used" in again.json()["error_description"]


@pytest.mark.parametrize("case, words", [
    ("wrong secret", "does not verify"),
    ("another client's secret", "does not verify"),
    ("wrong audience", "aud"),
    ("RS256", "'RS256'"),
])
def test_bad_assertions_are_invalid_client(hmac_server, case, words):
    issuer = hmac_server.issuer
    if case == "wrong secret":
        assertion = keyed("not-the-secret", hmac_server)
    elif case == "another client's secret":
        assertion = keyed(OTHER_SECRET, hmac_server)
    elif case == "wrong audience":
        assertion = keyed(SECRET, hmac_server, aud="https://elsewhere.example")
    else:
        key = jwk.JWK.generate(kty="RSA", size=2048)
        now = int(time.time())
        token = jwt.JWT(header={"alg": "RS256"}, claims={
            "iss": "hmac-bot", "sub": "hmac-bot", "aud": issuer, "exp": now + 60, "jti": uuid.uuid4().hex})
        token.make_signed_token(key)
        assertion = token.serialize()
    answer = token_request(hmac_server, assertion)
    assert answer.status_code == 401 and answer.json()["error"] == "invalid_client", answer.text
    assert words in answer.json()["error_description"]


def test_a_secret_shorter_than_the_hash_is_refused_with_the_reason(hmac_server):
    answer = token_request(hmac_server, keyed(OTHER_SECRET, hmac_server, iss="other-bot", alg="HS384"))
    assert answer.status_code == 401 and "HS384 needs a client secret of at least 48 bytes" in answer.text
    assert token_request(hmac_server, keyed(OTHER_SECRET, hmac_server, iss="other-bot")).ok


def test_none_and_plain_secrets_are_refused(hmac_server):
    answer = token_request(hmac_server, keyed(SECRET, hmac_server, alg="none"))
    assert answer.status_code == 401 and answer.json()["error"] == "invalid_client"
    plain = requests.post(hmac_server.token_endpoint, auth=("hmac-bot", SECRET),
                          data={"grant_type": "client_credentials"}, timeout=5)
    assert plain.status_code == 401 and "client_secret_jwt assertion" in plain.json()["error_description"]


def test_an_hmac_assertion_does_not_authenticate_a_private_key_jwt_client(hmac_server, signer_key):
    public_as_secret = signer_key.export_to_pem().decode()
    answer = token_request(hmac_server, keyed(public_as_secret, hmac_server, iss="signer"))
    assert answer.status_code == 401 and "'HS256'" in answer.json()["error_description"]


def test_the_store_holds_the_secret_sealed_and_bound_to_its_client(hmac_server):
    with sqlite3.connect(hmac_server.folder / "authsrv.sqlite3") as db:
        rows = dict(db.execute("SELECT client_id, sealed_secret FROM clients"))
        assert rows["signer"] is None
        assert SECRET.encode() not in rows["hmac-bot"] and OTHER_SECRET.encode() not in rows["other-bot"]
        db.execute("UPDATE clients SET sealed_secret = ? WHERE client_id = 'other-bot'", (rows["hmac-bot"],))
    for _ in range(20):  # the client cache keeps a lookup two seconds: try for up to ten
        answer = token_request(hmac_server, keyed(SECRET, hmac_server, iss="other-bot"))
        if "cannot be read" in answer.text:
            break
        time.sleep(0.5)
    assert answer.status_code == 401 and "cannot be read" in answer.json()["error_description"]
