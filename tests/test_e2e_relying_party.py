"""
The whole code flow against a real listening server, driven by relying-party
code written by others: Authlib's OAuth 2 client for the protocol, jwcrypto
for verifying the ID token against the published JWKS, and a plain requests
session standing in for the user's browser on the login form.
"""

from __future__ import annotations

import shutil
import secrets
from html.parser import HTMLParser
from urllib.parse import parse_qs, parse_qsl, urlencode, urlsplit

import pytest
import requests
from authlib.integrations.requests_client import OAuth2Session
from jwcrypto import jwk, jwt

from conftest import EXAMPLES, free_port

pytestmark = pytest.mark.slow

REDIRECT_URI = "http://127.0.0.1:9000/callback"


class FormReader(HTMLParser):
    """The fields and action of the first form on a page, as a browser would submit it."""

    def __init__(self):
        super().__init__()
        self.action = None
        self.fields: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "form" and self.action is None:
            self.action = attrs.get("action", "")
        elif tag in ("input", "button") and attrs.get("name") and attrs.get("type") in ("hidden", "submit", None):
            self.fields.setdefault(attrs["name"], attrs.get("value", ""))


def read_form(html: str) -> FormReader:
    reader = FormReader()
    reader.feed(html)
    assert reader.action is not None, html
    return reader


@pytest.fixture
def demo(run_server, tmp_path):
    """The demo config with its port moved to a free one."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("demo-data"))
    config = tmp_path / "examples" / "demo.toml"
    port = free_port()
    config.write_text(
        config.read_text()
        .replace('public_url = "http://127.0.0.1:8080"', f'public_url = "http://127.0.0.1:{port}"')
        .replace("tcp:8080:", f"tcp:{port}:")
    )
    return run_server(["authsrv", "--config", str(config)], tmp_path, port=port)


def browser_login(browser: requests.Session, url: str, username: str, password: str) -> str:
    """Follow the authorization request through the login form; the redirect back to the client."""
    response = browser.get(url, allow_redirects=True)
    assert response.status_code == 200, response.text
    assert response.headers["x-frame-options"] == "DENY"
    form = read_form(response.text)
    fields = {**form.fields, "username": username, "password": password}
    action = requests.compat.urljoin(response.url, form.action or response.url)
    answer = browser.post(action, data=fields, allow_redirects=False)
    assert answer.status_code in (302, 303), answer.text
    return answer.headers["location"]


def test_code_flow_refresh_userinfo_introspection_revocation_end_session(demo):
    discovery = requests.get(demo.base + "/.well-known/openid-configuration", timeout=5).json()
    issuer = discovery["issuer"]
    assert issuer == demo.base + "/api/auth"
    keyset = jwk.JWKSet.from_json(requests.get(discovery["jwks_uri"], timeout=5).content)

    client = OAuth2Session(
        client_id="demo-app",
        client_secret="demo-app-secret",
        scope="openid profile email offline_access",
        redirect_uri=REDIRECT_URI,
        code_challenge_method="S256",
        token_endpoint_auth_method="client_secret_post",
    )
    verifier = secrets.token_urlsafe(32)
    nonce = secrets.token_urlsafe(16)
    url, state = client.create_authorization_url(
        discovery["authorization_endpoint"], code_verifier=verifier, nonce=nonce
    )
    browser = requests.Session()
    location = browser_login(browser, url, "alice", "alice-password")
    assert location.startswith(REDIRECT_URI)
    returned = {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}
    assert returned["state"] == state and returned["iss"] == issuer

    token = client.fetch_token(
        discovery["token_endpoint"], authorization_response=location, code_verifier=verifier
    )
    assert token["token_type"].lower() == "bearer" and token["refresh_token"] and token["expires_in"] > 0

    id_token = jwt.JWT(
        jwt=token["id_token"], key=keyset,
        check_claims={"iss": issuer, "aud": "demo-app", "exp": None, "nonce": nonce},
    )
    claims = jwt.json_decode(id_token.claims)
    assert claims["name"] and claims["email"] == "alice@demo.test" and claims["email_verified"] is True
    assert claims["chat_user_id"] == "80351110224678912"

    userinfo = client.get(discovery["userinfo_endpoint"]).json()
    assert userinfo["sub"] == claims["sub"] and userinfo["chat_user_id"] == "80351110224678912"

    gateway = ("api-gateway", "api-gateway-secret")
    introspected = requests.post(discovery["introspection_endpoint"], data={"token": token["access_token"]},
                                 auth=gateway, timeout=5).json()
    assert introspected["active"] is True and introspected["sub"] == claims["sub"]
    assert introspected["client_id"] == "demo-app"

    refreshed = client.refresh_token(discovery["token_endpoint"], refresh_token=token["refresh_token"])
    assert refreshed["refresh_token"] != token["refresh_token"]
    assert refreshed["access_token"] != token["access_token"]

    client.revoke_token(discovery["revocation_endpoint"], token=refreshed["refresh_token"],
                        token_type_hint="refresh_token")
    for revoked in (refreshed["access_token"], refreshed["refresh_token"]):
        answer = requests.post(discovery["introspection_endpoint"], data={"token": revoked}, auth=gateway, timeout=5)
        assert answer.json() == {"active": False}

    ended = browser.get(
        discovery["end_session_endpoint"],
        params={"id_token_hint": token["id_token"], "post_logout_redirect_uri": "http://127.0.0.1:9000/",
                "state": "bye"},
        allow_redirects=False,
        timeout=5,
    )
    assert ended.status_code == 302
    assert ended.headers["location"] == "http://127.0.0.1:9000/?state=bye"
    again = browser.get(client.create_authorization_url(discovery["authorization_endpoint"],
                                                        code_verifier=verifier)[0], timeout=5)
    assert 'name="password"' in again.text, "the browser session outlived end-session"


def test_authlib_pushes_its_request_then_completes_the_code_flow(demo):
    """
    RFC 9126 with Authlib's own request building and client authentication:
    the request pushed with client_secret_basic, the browser sent with
    client_id and request_uri only, the code redeemed; the request_uri then
    works no more, and an unauthenticated push is refused.
    """
    discovery = requests.get(demo.base + "/api/auth/.well-known/oauth-authorization-server", timeout=5).json()
    par_endpoint = discovery["pushed_authorization_request_endpoint"]
    assert par_endpoint == discovery["issuer"] + "/oauth2/par"
    assert discovery["require_pushed_authorization_requests"] is False

    client = OAuth2Session(
        client_id="demo-app", client_secret="demo-app-secret", scope="openid profile offline_access",
        redirect_uri=REDIRECT_URI, code_challenge_method="S256", token_endpoint_auth_method="client_secret_basic",
    )
    verifier = secrets.token_urlsafe(48)
    url, state = client.create_authorization_url(discovery["authorization_endpoint"], code_verifier=verifier,
                                                 nonce="n-e2e")
    request_params = dict(parse_qsl(urlsplit(url).query))
    del request_params["client_id"]
    pushed = client.post(par_endpoint, data=request_params, auth=client.client_auth("client_secret_basic"),
                         withhold_token=True, timeout=5)
    assert pushed.status_code == 201, pushed.text
    request_uri = pushed.json()["request_uri"]
    assert request_uri.startswith("urn:ietf:params:oauth:request_uri:") and pushed.json()["expires_in"] == 60

    by_reference = discovery["authorization_endpoint"] + "?" + urlencode(
        {"client_id": "demo-app", "request_uri": request_uri})
    browser = requests.Session()
    location = browser_login(browser, by_reference, "alice", "alice-password")
    returned = dict(parse_qsl(urlsplit(location).query))
    assert returned["state"] == state and returned["iss"] == discovery["issuer"]
    token = client.fetch_token(discovery["token_endpoint"], authorization_response=location, code_verifier=verifier)
    assert token["id_token"] and token["refresh_token"]

    again = browser.get(by_reference, allow_redirects=False, timeout=5)
    assert again.status_code == 400 and "location" not in again.headers
    assert "invalid_request_uri" in again.text

    anonymous = requests.post(par_endpoint, data={**request_params, "client_id": "demo-app"}, timeout=5)
    assert anonymous.status_code == 401 and anonymous.json()["error"] == "invalid_client"
