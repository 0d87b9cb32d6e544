"""
Machine clients against a real listening server (C{twist authsrv}), driven
by Authlib's unmodified OAuth 2 client: client_credentials with a secret and
with private_key_jwt (keys inline and at a jwks_uri served on 127.0.0.1),
introspection and revocation authenticated the same way, and the attacks on
client assertions: replay, wrong audience, expired, wrong or none alg,
iss other than sub, unknown key.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session
from authlib.oauth2.rfc7523 import PrivateKeyJWT
from jwcrypto import jwk, jws, jwt
from joserfc.jwk import ECKey

from conftest import ROOT, free_port

pytestmark = pytest.mark.slow

BOT_SECRET = "reports-bot-secret-Q3v9ZkP2mW7xL4nR8tY6"
API = "https://api.example.test"
ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
JS = ROOT / "tests" / "js"


def public_set(*keys: jwk.JWK) -> str:
    return json.dumps({"keys": [json.loads(key.export_public()) for key in keys]})


class KeyServer:
    """A JWK set served over plain HTTP on 127.0.0.1, counting its requests."""

    def __init__(self, body: str):
        self.body = body.encode()
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests += 1
                self.send_response(200)
                self.send_header("content-type", "application/jwk-set+json")
                self.send_header("content-length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/jwks.json"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def keys():
    return {
        "signer": jwk.JWK.generate(kty="RSA", size=2048, kid="signer-1"),
        "remote": jwk.JWK.generate(kty="EC", crv="P-256", kid="remote-1"),
        "stranger": jwk.JWK.generate(kty="RSA", size=2048, kid="signer-1"),
    }


def server_config(port: int, algorithms: tuple[str, ...] = ("RS256",)) -> str:
    """The server, store, keystore and static users of a test server on C{port}, in its own folder."""
    return f"""
[server]
listen = ["tcp:{port}:interface=127.0.0.1"]

[store]
path = "authsrv.sqlite3"

[keystore]
path = "keys.jwks.json"
algorithms = {json.dumps(list(algorithms))}

[[identity]]
plugin = "static"
path = "users.toml"
"""


@pytest.fixture
def machine(run_server, tmp_path, keys):
    key_server = KeyServer(public_set(keys["remote"]))
    port = free_port()
    (tmp_path / "users.toml").write_text("")
    config = server_config(port) + f"""
[remote_documents]
allow_http = true
allow_private_addresses = true

[[clients]]
client_id = "reports-bot"
secret_env = "REPORTS_BOT_SECRET"
grant_types = ["client_credentials"]
scopes = ["reports.read", "reports.write"]
resources = ["{API}"]

[[clients]]
client_id = "signer"
token_endpoint_auth_method = "private_key_jwt"
jwks = '{public_set(keys["signer"])}'
grant_types = ["client_credentials"]
scopes = ["reports.read"]
resources = ["{API}"]

[[clients]]
client_id = "remote-signer"
token_endpoint_auth_method = "private_key_jwt"
jwks_uri = "{key_server.url}"
grant_types = ["client_credentials"]
scopes = ["reports.read"]
"""
    (tmp_path / "authsrv.toml").write_text(config)
    server = run_server(["authsrv", "--config", str(tmp_path / "authsrv.toml")], tmp_path, port=port,
                        env={"REPORTS_BOT_SECRET": BOT_SECRET})
    server.issuer = server.base + "/api/auth"
    server.token_endpoint = server.issuer + "/oauth2/token"
    server.key_server = key_server
    yield server
    key_server.close()


def assertion(key: jwk.JWK, *, iss="signer", sub=None, aud=None, exp_in=60, alg="RS256", jti=None, kid=True,
              issuer="") -> str:
    claims = {"iss": iss, "sub": sub or iss, "aud": aud or issuer, "iat": int(time.time()),
              "exp": int(time.time()) + exp_in, "jti": jti or uuid.uuid4().hex}
    header = {"alg": alg, **({"kid": key.kid} if kid else {})}
    token = jwt.JWT(header=header, claims=claims)
    token.make_signed_token(key)
    return token.serialize()


def token_request(server, client_assertion: str, **extra) -> requests.Response:
    return requests.post(server.token_endpoint, data={
        "grant_type": "client_credentials", "client_assertion_type": ASSERTION_TYPE,
        "client_assertion": client_assertion, **extra,
    }, timeout=5)


def test_discovery_lists_the_grant_and_the_method_in_use(machine):
    discovery = requests.get(machine.issuer + "/.well-known/openid-configuration", timeout=5).json()
    assert "client_credentials" in discovery["grant_types_supported"]
    assert "private_key_jwt" in discovery["token_endpoint_auth_methods_supported"]
    assert "private_key_jwt" in discovery["introspection_endpoint_auth_methods_supported"]
    assert discovery["token_endpoint_auth_signing_alg_values_supported"] == ["RS256", "PS256", "ES256", "EdDSA"]
    assert "none" not in discovery["token_endpoint_auth_signing_alg_values_supported"]


def test_client_credentials_with_a_secret(machine):
    session = OAuth2Session("reports-bot", BOT_SECRET, token_endpoint_auth_method="client_secret_basic")
    token = session.fetch_token(machine.token_endpoint, grant_type="client_credentials", scope="reports.read")
    assert token["token_type"] == "Bearer" and token["scope"] == "reports.read"
    assert "refresh_token" not in token and "id_token" not in token

    userinfo = requests.get(machine.issuer + "/oauth2/userinfo",
                            headers={"Authorization": f"Bearer {token['access_token']}"}, timeout=5)
    assert userinfo.status_code == 401 and 'error="invalid_token"' in userinfo.headers["www-authenticate"]

    answer = session.introspect_token(machine.issuer + "/oauth2/introspect", token=token["access_token"]).json()
    assert answer["active"] is True and answer["client_id"] == "reports-bot" and answer["sub"] == "reports-bot"
    session.revoke_token(machine.issuer + "/oauth2/revoke", token=token["access_token"])
    answer = session.introspect_token(machine.issuer + "/oauth2/introspect", token=token["access_token"]).json()
    assert answer == {"active": False}

    wider = requests.post(machine.token_endpoint, auth=("reports-bot", BOT_SECRET),
                          data={"grant_type": "client_credentials", "scope": "reports.admin"}, timeout=5)
    assert wider.status_code == 400 and wider.json()["error"] == "invalid_scope"
    user_scope = requests.post(machine.token_endpoint, auth=("reports-bot", BOT_SECRET),
                               data={"grant_type": "client_credentials", "scope": "openid"}, timeout=5)
    assert user_scope.json()["error"] == "invalid_scope"


def test_client_credentials_with_a_resource_gives_a_jwt_for_it(machine):
    session = OAuth2Session("reports-bot", BOT_SECRET, token_endpoint_auth_method="client_secret_post")
    token = session.fetch_token(machine.token_endpoint, grant_type="client_credentials", resource=API)
    assert set(token["scope"].split()) == {"reports.read", "reports.write"}
    keyset = jwk.JWKSet.from_json(requests.get(machine.issuer + "/jwks", timeout=5).text)
    verified = jwt.JWT(jwt=token["access_token"], key=keyset, expected_type="JWS")
    assert verified.token.jose_header["typ"] == "at+jwt"
    claims = json.loads(verified.claims)
    assert (claims["sub"], claims["client_id"], claims["aud"], claims["iss"]) == (
        "reports-bot", "reports-bot", API, machine.issuer)
    refused = requests.post(machine.token_endpoint, auth=("reports-bot", BOT_SECRET),
                            data={"grant_type": "client_credentials", "resource": "https://other.example"}, timeout=5)
    assert refused.status_code == 400 and refused.json()["error"] == "invalid_target"


def test_private_key_jwt_with_authlib(machine, keys):
    private = json.loads(keys["signer"].export_private())
    session = OAuth2Session("signer", private, token_endpoint_auth_method=PrivateKeyJWT(machine.token_endpoint))
    token = session.fetch_token(machine.token_endpoint, grant_type="client_credentials")
    assert token["scope"] == "reports.read" and "refresh_token" not in token
    answer = session.introspect_token(machine.issuer + "/oauth2/introspect", token=token["access_token"]).json()
    assert answer["active"] is True and answer["client_id"] == "signer"
    session.revocation_endpoint_auth_method = PrivateKeyJWT(machine.token_endpoint)
    session.revoke_token(machine.issuer + "/oauth2/revoke", token=token["access_token"])
    assert session.introspect_token(machine.issuer + "/oauth2/introspect",
                                    token=token["access_token"]).json() == {"active": False}


def test_private_key_jwt_with_keys_at_a_jwks_uri(machine, keys):
    private = ECKey.import_key(json.loads(keys["remote"].export_private()))
    session = OAuth2Session("remote-signer", private,
                            token_endpoint_auth_method=PrivateKeyJWT(machine.token_endpoint, alg="ES256"))
    for _ in range(3):
        assert session.fetch_token(machine.token_endpoint, grant_type="client_credentials")["scope"] == "reports.read"
    assert machine.key_server.requests == 1  # cached


def test_a_replayed_assertion_is_invalid_client(machine, keys):
    once = assertion(keys["signer"], issuer=machine.issuer)
    assert token_request(machine, once).status_code == 200
    replay = token_request(machine, once)
    assert replay.status_code == 401 and replay.json()["error"] == "invalid_client"
    assert "already used" in replay.json()["error_description"]


@pytest.mark.parametrize("case, changes, words", [
    ("wrong audience", {"aud": "https://elsewhere.example/token"}, "aud"),
    ("expired", {"exp_in": -120}, "expired"),
    ("too long-lived", {"exp_in": 7200}, "expire within"),
    ("iss other than sub", {"sub": "reports-bot"}, "iss and sub"),
    ("another client's name", {"iss": "reports-bot"}, "does not authenticate with a client assertion"),
])
def test_bad_assertions_are_invalid_client(machine, keys, case, changes, words):
    answer = token_request(machine, assertion(keys["signer"], issuer=machine.issuer, **changes))
    assert answer.status_code == 401, case
    assert answer.json()["error"] == "invalid_client" and words in answer.json()["error_description"]


def test_an_assertion_signed_by_an_unknown_key_is_invalid_client(machine, keys):
    forged = assertion(keys["stranger"], issuer=machine.issuer)
    answer = token_request(machine, forged)
    assert answer.status_code == 401 and "does not verify" in answer.json()["error_description"]
    unknown_kid = jwk.JWK.generate(kty="RSA", size=2048, kid="nobody")
    answer = token_request(machine, assertion(unknown_kid, issuer=machine.issuer))
    assert answer.status_code == 401 and answer.json()["error"] == "invalid_client"


def test_hmac_and_none_algorithms_are_refused(machine, keys):
    public_as_secret = jwk.JWK(kty="oct", k=jws.base64url_encode(keys["signer"].export_to_pem()))
    answer = token_request(machine, assertion(public_as_secret, issuer=machine.issuer, alg="HS256", kid=False))
    assert answer.status_code == 401 and "'HS256'" in answer.json()["error_description"]
    header = jws.base64url_encode(json.dumps({"alg": "none"}))
    claims = jws.base64url_encode(json.dumps({
        "iss": "signer", "sub": "signer", "aud": machine.issuer, "exp": int(time.time()) + 60, "jti": "x"}))
    answer = token_request(machine, f"{header}.{claims}.")
    assert answer.status_code == 401 and answer.json()["error"] == "invalid_client"


def test_a_secret_does_not_authenticate_a_private_key_jwt_client(machine):
    answer = requests.post(machine.token_endpoint, auth=("signer", "anything"),
                           data={"grant_type": "client_credentials"}, timeout=5)
    assert answer.status_code == 401 and answer.json()["error"] == "invalid_client"
    answer = requests.post(machine.token_endpoint, data={"grant_type": "client_credentials", "client_id": "signer"},
                           timeout=5)
    assert answer.status_code == 401


def test_private_key_jwt_with_openid_client(machine, keys):
    """openid-client from npm (scripts/test.sh installs it); skipped only outside CI without node or the package."""
    node = shutil.which("node")
    if node is None or not (JS / "node_modules" / "openid-client").is_dir():
        if os.environ.get("CI"):
            pytest.fail("CI must run openid-client: node and tests/js/node_modules (scripts/test.sh) are missing")
        pytest.skip("node or openid-client (npm install in tests/js) is not installed here")
    result = subprocess.run(
        [node, str(JS / "machine_client.mjs"), machine.issuer, "remote-signer", "private_key_jwt",
         keys["remote"].export_private()],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["token_type"].lower() == "bearer" and got["scope"] == "reports.read"
    assert got["has_refresh_token"] is False
    assert got["introspection"]["active"] is True and got["introspection"]["client_id"] == "remote-signer"
