"""
DPoP (RFC 9449) with pushed requests and private_key_jwt against a real
listening server, driven by openid-client from npm, unmodified
(tests/js/dpop_code_flow.mjs): the request pushed with a proof, the user
signing in through the real login and consent forms (requests standing in
for the browser), the code redeemed, the tokens refreshed, UserInfo called
and the token introspected, all DPoP-bound to the client's key; those
tokens are then refused at UserInfo as Bearer tokens and with proofs by
another key, for another token, URL or method. Then the same for a client held to the FAPI 2.0 profile, and what that profile
refuses over plain HTTP: a request not pushed, a token request without a
proof, an RS256 assertion, a push without PKCE.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from urllib.parse import parse_qsl, urlencode, urljoin, urlsplit

import pytest
import requests
from jwcrypto import jwk

from conftest import EXAMPLES, ROOT, free_port
from dpop_proofs import ec_key, proof
from pg_servers import pkce_pair
from prepared_keys import write_key_file
from test_e2e_machine_clients import ASSERTION_TYPE, assertion, public_set, server_config
from test_e2e_relying_party import read_form

pytestmark = pytest.mark.slow

REDIRECT_URI = "http://127.0.0.1:9000/callback"
TIMEOUT = 15
FLOW = ROOT / "tests" / "js" / "dpop_code_flow.mjs"


def now() -> int:
    return int(time.time())


@pytest.fixture(scope="module")
def keys():
    return {
        "dpop-app": jwk.JWK.generate(kty="EC", crv="P-256", kid="dpop-app-1"),
        "fapi-app": jwk.JWK.generate(kty="EC", crv="P-256", kid="fapi-app-1"),
        "fapi-rsa": jwk.JWK.generate(kty="RSA", size=2048, kid="fapi-app-rsa"),
    }


@pytest.fixture
def server(run_server, tmp_path, keys):
    """DPoP and PAR offered; a private_key_jwt client free to use DPoP, and a FAPI 2.0 one."""
    port = free_port()
    shutil.copy(EXAMPLES / "demo-users.toml", tmp_path / "users.toml")
    write_key_file(tmp_path / "keys.jwks.json", ("RS256", "ES256"))
    (tmp_path / "authsrv.toml").write_text(server_config(port, ("RS256", "ES256")) + f"""
[par]
enabled = true

[dpop]
enabled = true

[[clients]]
client_id = "dpop-app"
token_endpoint_auth_method = "private_key_jwt"
jwks = '{public_set(keys["dpop-app"])}'
redirect_uris = ["{REDIRECT_URI}"]
id_token_signed_response_alg = "ES256"

[[clients]]
client_id = "fapi-app"
profile = "fapi2"
token_endpoint_auth_method = "private_key_jwt"
jwks = '{public_set(keys["fapi-app"], keys["fapi-rsa"])}'
redirect_uris = ["{REDIRECT_URI}"]
dpop_bound_access_tokens = true
id_token_signed_response_alg = "ES256"
access_token_signed_response_alg = "ES256"
""")
    running = run_server(["authsrv", "--config", str(tmp_path / "authsrv.toml")], tmp_path, port=port)
    running.issuer = running.base + "/api/auth"
    return running


@pytest.fixture(scope="module")
def node():
    """node and openid-client (scripts/test.sh installs both): a missing one fails, never skips."""
    path = shutil.which("node")
    assert path is not None, "node is missing: scripts/test.sh installs it"
    assert (ROOT / "tests" / "js" / "node_modules" / "openid-client").is_dir(), "npm ci --prefix tests/js"
    return path


def sign_in(url: str) -> str:
    """A browser through the login and consent forms as alice; the URL it is sent back to the client with."""
    browser = requests.Session()
    page = browser.get(url, timeout=TIMEOUT)
    for _ in range(3):
        assert page.status_code == 200, page.text
        form = read_form(page.text)
        login = 'name="password"' in page.text
        fields = {**form.fields, **({"username": "alice", "password": "alice-password"} if login
                                    else {"action": "approve"})}
        answer = browser.post(urljoin(page.url, form.action), data=fields, allow_redirects=False, timeout=TIMEOUT)
        assert answer.status_code in (302, 303), answer.text
        location = answer.headers["location"]
        if location.startswith(REDIRECT_URI):
            return location
        page = browser.get(urljoin(answer.url, location), timeout=TIMEOUT)
    raise AssertionError("the sign-in never came back to the client")


def run_openid_client(node: str, server, client_id: str, client_key: jwk.JWK, dpop_key: jwk.JWK) -> dict:
    """The openid-client flow, with the sign-in done here between its two halves; what it printed at the end."""
    process = subprocess.Popen(
        [node, str(FLOW), server.issuer, client_id, client_key.export_private(), dpop_key.export_private(),
         REDIRECT_URI],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = process.stdout.readline()
        assert first, process.communicate(timeout=TIMEOUT)[1]
        authorization_url = json.loads(first)["authorization_url"]
        sent = dict(parse_qsl(urlsplit(authorization_url).query))
        assert set(sent) == {"client_id", "request_uri"}, "openid-client pushed the request"
        out, err = process.communicate(sign_in(authorization_url) + "\n", timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    return json.loads(out)


def assert_bound(got: dict, dpop_key: jwk.JWK, server, client_id: str) -> None:
    """What openid-client got is DPoP-bound to C{dpop_key}, and the binding holds against a Bearer replay."""
    assert got["refused"]["other_iss"] and got["refused"]["no_iss"], "openid-client checks iss (RFC 9207)"
    assert (got["token_type"], got["refreshed_token_type"]) == ("dpop", "dpop")
    assert got["userinfo"]["sub"] == got["sub"]
    introspection = got["introspection"]
    assert introspection["active"] is True and introspection["client_id"] == client_id
    assert introspection["token_type"] == "DPoP"
    assert introspection["cnf"] == {"jkt": dpop_key.thumbprint()}
    userinfo_url = server.issuer + "/oauth2/userinfo"
    for token in (got["access_token"], got["refreshed_access_token"]):
        stolen = requests.get(userinfo_url, headers={"Authorization": f"Bearer {token}"}, timeout=TIMEOUT)
        assert stolen.status_code == 401 and stolen.headers["www-authenticate"].startswith("DPoP ")
    token = got["refreshed_access_token"]
    attacks = {
        "another key": proof(ec_key(), "GET", userinfo_url, now(), access_token=token),
        "ath of another token": proof(dpop_key, "GET", userinfo_url, now(), access_token=got["access_token"]),
        "another URL": proof(dpop_key, "GET", server.issuer + "/oauth2/token", now(), access_token=token),
        "another method": proof(dpop_key, "POST", userinfo_url, now(), access_token=token),
    }
    for name, attack in attacks.items():
        refused = requests.get(userinfo_url, headers={"Authorization": f"DPoP {token}", "DPoP": attack},
                               timeout=TIMEOUT)
        assert refused.status_code == 401, name
        assert 'error="invalid_dpop_proof"' in refused.headers["www-authenticate"], name
    own = proof(dpop_key, "GET", userinfo_url, now(), access_token=token)
    answer = requests.get(userinfo_url, headers={"Authorization": f"DPoP {token}", "DPoP": own}, timeout=TIMEOUT)
    assert answer.status_code == 200 and answer.json()["sub"] == got["sub"], answer.text


def test_openid_client_code_flow_with_dpop_par_and_private_key_jwt(server, node, keys):
    dpop_key = ec_key()
    got = run_openid_client(node, server, "dpop-app", keys["dpop-app"], dpop_key)
    assert_bound(got, dpop_key, server, "dpop-app")
    assert got["userinfo"]["name"] == "Alice Liddell"


def test_openid_client_completes_the_fapi2_flow(server, node, keys):
    dpop_key = ec_key()
    got = run_openid_client(node, server, "fapi-app", keys["fapi-app"], dpop_key)
    assert_bound(got, dpop_key, server, "fapi-app")


def client_auth(server, key: jwk.JWK, client_id: str, alg: str = "ES256") -> dict:
    return {"client_assertion_type": ASSERTION_TYPE,
            "client_assertion": assertion(key, iss=client_id, alg=alg, issuer=server.issuer)}


def push(server, client_id: str, key: jwk.JWK, *, pkce: bool = True, alg: str = "ES256", headers=None,
         **params) -> tuple[requests.Response, str]:
    """A pushed request (RFC 9126) authenticated with private_key_jwt: the answer and the PKCE verifier."""
    verifier, challenge = pkce_pair()
    form = {"response_type": "code", "redirect_uri": REDIRECT_URI, "scope": "openid", "state": "s",
            **({"code_challenge": challenge, "code_challenge_method": "S256"} if pkce else {}),
            **params, **client_auth(server, key, client_id, alg)}
    return requests.post(server.issuer + "/oauth2/par", data=form, headers=headers or {}, timeout=TIMEOUT), verifier


def code_of(server, client_id: str, request_uri: str) -> str:
    location = sign_in(server.issuer + "/oauth2/authorize?" + urlencode(
        {"client_id": client_id, "request_uri": request_uri}))
    returned = dict(parse_qsl(urlsplit(location).query))
    assert returned["iss"] == server.issuer
    return returned["code"]


def redeem(server, client_id: str, key: jwk.JWK, code: str, verifier: str, dpop: str | None = None,
           alg: str = "ES256") -> requests.Response:
    return requests.post(server.issuer + "/oauth2/token", data={
        "grant_type": "authorization_code", "code": code, "code_verifier": verifier, "redirect_uri": REDIRECT_URI,
        **client_auth(server, key, client_id, alg)}, headers={"DPoP": dpop} if dpop else {}, timeout=TIMEOUT)


def test_fapi2_refusals_over_http(server, keys):
    fapi, rsa = keys["fapi-app"], keys["fapi-rsa"]
    _, challenge = pkce_pair()
    plain = requests.get(server.issuer + "/oauth2/authorize", params={
        "client_id": "fapi-app", "redirect_uri": REDIRECT_URI, "response_type": "code", "scope": "openid",
        "state": "s", "code_challenge": challenge, "code_challenge_method": "S256"},
        allow_redirects=False, timeout=TIMEOUT)
    returned = dict(parse_qsl(urlsplit(plain.headers["location"]).query))
    assert (plain.status_code, returned["error"], returned["iss"]) == (302, "invalid_request", server.issuer)
    assert "must push its authorization requests" in returned["error_description"]

    unprotected, _ = push(server, "fapi-app", fapi, pkce=False)
    assert (unprotected.status_code, unprotected.json()["error"]) == (400, "invalid_request"), unprotected.text
    assert "code_challenge" in unprotected.json()["error_description"]
    rs256, _ = push(server, "fapi-app", rsa, alg="RS256")
    assert (rs256.status_code, rs256.json()["error"]) == (401, "invalid_client"), rs256.text
    assert "'RS256'" in rs256.json()["error_description"]

    pushed, verifier = push(server, "fapi-app", fapi)
    assert pushed.status_code == 201, pushed.text
    code = code_of(server, "fapi-app", pushed.json()["request_uri"])
    token_url = server.issuer + "/oauth2/token"
    no_proof = redeem(server, "fapi-app", fapi, code, verifier)
    assert (no_proof.status_code, no_proof.json()["error"]) == (400, "invalid_dpop_proof"), no_proof.text
    key = ec_key()
    rs256 = redeem(server, "fapi-app", rsa, code, verifier, proof(key, "POST", token_url, now()), alg="RS256")
    assert (rs256.status_code, rs256.json()["error"]) == (401, "invalid_client"), rs256.text
    issued = redeem(server, "fapi-app", fapi, code, verifier, proof(key, "POST", token_url, now()))
    assert (issued.status_code, issued.json()["token_type"]) == (200, "DPoP"), "the refusals left the code unused"


def test_a_proof_sent_with_the_push_binds_the_code(server, keys):
    """RFC 9449 section 10.1: the push's proof is the code's dpop_jkt; a dpop_jkt naming another key is refused."""
    key, other = ec_key(), ec_key()
    par_url, token_url = server.issuer + "/oauth2/par", server.issuer + "/oauth2/token"
    mismatch, _ = push(server, "dpop-app", keys["dpop-app"], dpop_jkt=other.thumbprint(),
                       headers={"DPoP": proof(key, "POST", par_url, now())})
    assert (mismatch.status_code, mismatch.json()["error"]) == (400, "invalid_dpop_proof"), mismatch.text
    wrong_url, _ = push(server, "dpop-app", keys["dpop-app"], headers={"DPoP": proof(key, "POST", token_url, now())})
    assert (wrong_url.status_code, wrong_url.json()["error"]) == (400, "invalid_dpop_proof")

    for signer, outcome in ((other, "invalid_grant"), (key, "DPoP")):
        pushed, verifier = push(server, "dpop-app", keys["dpop-app"],
                                headers={"DPoP": proof(key, "POST", par_url, now())})
        assert pushed.status_code == 201, pushed.text
        code = code_of(server, "dpop-app", pushed.json()["request_uri"])
        answer = redeem(server, "dpop-app", keys["dpop-app"], code, verifier, proof(signer, "POST", token_url, now()))
        assert answer.json().get("error", answer.json().get("token_type")) == outcome, answer.text

