"""
The shipped OpenAPI description (src/authsrv/openapi.json) against the real
server: it is valid OpenAPI 3.1, it lists every route the server serves, and
schemathesis, generating requests from it, gets no 5xx and no answer the
description does not allow (status, content type, body schema, headers).

The server is the demo configuration on a free port, with a chat provider
client pointing at a closed loopback port so the link pages answer too.
Authenticated operations get real credentials part of the time (a
provisioned client's secret, a user's access and ID tokens, the internal
secret, the admin secret with a real user and an operator-made client) so
the checks reach past 401. The admin API is served on the main listener
here ([admin] serve_on_main), so one server answers every described path.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import shutil
from urllib.parse import parse_qs, urlsplit
from importlib.resources import files

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conftest import EXAMPLES, Server, free_port
from fakes import FakeKeystore
from test_e2e_relying_party import browser_login, read_form

from authsrv.config import parse_config
from authsrv.service import _documents
from authsrv.web.public import PublicSite
from authsrv.web.admin import AdminAPI
from authsrv.web.internal import InternalAPI

pytestmark = pytest.mark.slow

DOCUMENT = json.loads(files("authsrv").joinpath("openapi.json").read_text())
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
OPERATIONS = sorted(
    (method.upper(), path) for path, item in DOCUMENT["paths"].items() for method in item if method in METHODS
)
SCHEMA = schemathesis.openapi.from_dict(DOCUMENT)
CHECKS = [
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
EXAMPLES_PER_MODE = 12
EXPECTED_5XX = {("GET", "/api/auth/link/chat/callback"): {502, 503}}
"""The provider of the test's chat client is a closed port, and says so."""

CLIENT = ("demo-app", "demo-app-secret")
GATEWAY = ("api-gateway", "api-gateway-secret")
INTERNAL_SECRET = "demo-internal-secret"
ADMIN_SECRET = secrets.token_urlsafe(32)
ADMIN_CLIENT = "fuzz-made-app"
ALICE_SUB = "a1f0c9e2-5b7d-4c1e-9a3f-6d2b8e4c7a10"
REDIRECT_URI = "http://127.0.0.1:9000/callback"
AUTHORIZE = {
    "response_type": "code", "client_id": CLIENT[0], "redirect_uri": REDIRECT_URI,
    "scope": "openid profile email offline_access",
}
CHAT = """
[chat]
encryption_key_file = "demo-secrets/chat-key"
client_id = "fuzz-chat-app"
client_secret_file = "demo-secrets/chat-secret"
authorize_url = "http://127.0.0.1:{closed}/authorize"
token_url = "http://127.0.0.1:{closed}/token"
user_url = "http://127.0.0.1:{closed}/user"
timeout = "2s"

[admin]
secret_file = "demo-secrets/admin-api-secret"
serve_on_main = true

[[clients]]
client_id = "fuzz-tv"
redirect_uris = ["http://127.0.0.1:9004/callback"]
grant_types = ["urn:ietf:params:oauth:grant-type:device_code"]
"""


def test_the_description_is_valid_openapi_3_1():
    assert DOCUMENT["openapi"].startswith("3.1.")
    validate(DOCUMENT)


def _klein_routes() -> set[tuple[str, str]]:
    """Every route, its variables written as OpenAPI writes them ({name}, not <name>)."""
    return {
        (method, re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule))
        for app in (PublicSite.app, InternalAPI.app, AdminAPI.app)
        for rule in app.url_map.iter_rules()
        for method in rule.methods
        if method != "HEAD"
    }


def test_every_klein_route_is_described():
    """HEAD is left out: Klein answers it for every GET route."""
    described = {(method, path) for method, path in OPERATIONS if method != "HEAD"}
    assert _klein_routes() - described == set()


def test_every_document_path_is_described():
    """Discovery and the JWKS are served as static resources, beside the routes: each of their paths too."""
    config = parse_config({}, None)
    served = {path.decode() for path in _documents(config, FakeKeystore(), (), None)}
    assert served - {path for method, path in OPERATIONS if method == "GET"} == set()


def without_table(text: str, name: str) -> str:
    """A TOML document's text less its C{[name]} table (this test puts its own in)."""
    return re.sub(rf"^\[{name}\]\n(?:(?!\[).*\n)*", "", text, flags=re.M)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The demo on a free port; stopped after the module."""
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copytree(EXAMPLES, root / "examples", ignore=shutil.ignore_patterns("demo-data"))
    port, closed = free_port(), free_port()
    secrets_dir = root / "examples" / "demo-secrets"
    (secrets_dir / "chat-key").write_text(base64.urlsafe_b64encode(secrets.token_bytes(32)).decode())
    (secrets_dir / "chat-secret").write_text(secrets.token_urlsafe(32))
    (secrets_dir / "admin-api-secret").write_text(ADMIN_SECRET)
    config = root / "examples" / "demo.toml"
    config.write_text(
        without_table(config.read_text(), "chat")
        .replace('public_url = "http://127.0.0.1:8080"', f'public_url = "http://127.0.0.1:{port}"')
        .replace("tcp:8080:", f"tcp:{port}:")
        + CHAT.format(closed=closed)
    )
    running = Server(["authsrv", "--config", str(config)], root, port)
    try:
        running.wait_ready()
        made = requests.post(running.base + "/api/admin/clients", timeout=5, json={
            "client_id": ADMIN_CLIENT, "redirect_uris": [REDIRECT_URI]}, headers={"Authorization": "Bearer " + ADMIN_SECRET})
        assert made.status_code == 201, made.text
        yield running
    finally:
        running.stop()


CHALLENGE = base64.urlsafe_b64encode(hashlib.sha256(b"verifier").digest()).rstrip(b"=").decode()


def _authorize_url(base: str, challenge: str) -> str:
    return requests.Request("GET", base + "/api/auth/oauth2/authorize", params={
        **AUTHORIZE, "state": "s", "nonce": "n", "code_challenge": challenge, "code_challenge_method": "S256",
    }).prepare().url


@pytest.fixture(scope="module")
def alice(server):
    """
    What the fuzzer may substitute: a signed-in browser's cookies, the tokens
    of one code flow for alice, and another browser's pending login form.
    """
    browser = requests.Session()
    verifier = secrets.token_urlsafe(32)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    location = browser_login(browser, _authorize_url(server.base, challenge), "alice", "alice-password")
    code = parse_qs(urlsplit(location).query)["code"][0]
    tokens = requests.post(server.base + "/api/auth/oauth2/token", auth=CLIENT, timeout=5, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": REDIRECT_URI, "code_verifier": verifier,
    })
    assert tokens.status_code == 200, tokens.text
    pending = requests.Session()
    login_page = pending.get(_authorize_url(server.base, challenge), timeout=5)
    form = read_form(login_page.text).fields
    return {
        "cookies": browser.cookies.get_dict(),
        "pending": {"request": form["request"], "csrf": form["csrf"]},
        "device": pending.cookies.get_dict(),
        **tokens.json(),
    }


def test_every_described_operation_is_served(server):
    """The static documents are below Klein; each described operation answers, none is 404 or 405."""
    for method, path in OPERATIONS:
        response = requests.request(method, server.base + path, timeout=5, allow_redirects=False)
        assert response.status_code not in (404, 405), (method, path, response.status_code)


def _basic(client: tuple[str, str]) -> str:
    return "Basic " + base64.b64encode(f"{client[0]}:{client[1]}".encode()).decode()


def _set_body(case, **values) -> None:
    if case.body is None:
        case.body = {}
    if isinstance(case.body, dict):
        case.body = {**case.body, **values}


def _drop_body(case, *names) -> None:
    if isinstance(case.body, dict):
        case.body = {k: v for k, v in case.body.items() if k not in names}


def _set_params(case, **values) -> None:
    """Values in the query of a GET, in the form body of a POST."""
    if case.method == "GET":
        case.query = {**(case.query or {}), **values}
    else:
        _set_body(case, **values)


def _real_values(case, draw, alice) -> dict[str, str]:
    """
    Real credentials and ids in place of generated ones, part of the time (as
    hypothesis draws): without them every answer would be 400 or 401. Returns
    the cookies to send.
    """
    headers = dict(case.headers or {})
    path = case.operation.path
    cookies: dict[str, str] = {}
    if path.endswith(("/oauth2/token", "/oauth2/introspect", "/oauth2/revoke")):
        client = GATEWAY if path.endswith("/introspect") else CLIENT
        how = draw(st.sampled_from(["basic", "post", "generated"]))
        if how == "basic":
            headers["Authorization"] = _basic(client)
            _drop_body(case, "client_id", "client_secret")
        elif how == "post":
            headers.pop("Authorization", None)
            _set_body(case, client_id=client[0], client_secret=client[1])
        if path.endswith("/introspect") and draw(st.booleans()):
            _set_body(case, token=draw(st.sampled_from([alice["access_token"], alice["refresh_token"]])))
    elif path.endswith("/oauth2/device-authorization") and draw(st.booleans()):
        headers.pop("Authorization", None)
        _set_body(case, client_id="fuzz-tv")
        _drop_body(case, "client_secret")
    elif path.endswith("/oauth2/userinfo") and draw(st.booleans()):
        _drop_body(case, "access_token")
        headers["Authorization"] = "Bearer " + alice["access_token"]
    elif path.startswith("/api/internal/") and draw(st.booleans()):
        headers["Authorization"] = "Bearer " + INTERNAL_SECRET
        if draw(st.booleans()):
            case.body = {"userId": ALICE_SUB}
    elif path.startswith("/api/admin/") and draw(st.booleans()):
        headers["Authorization"] = "Bearer " + ADMIN_SECRET
        parameters = dict(case.path_parameters or {})
        if "user_id" in parameters and draw(st.booleans()):
            parameters["user_id"] = ALICE_SUB
        if "client_id" in parameters and draw(st.booleans()):
            parameters["client_id"] = ADMIN_CLIENT
        case.path_parameters = parameters
    elif path.endswith("/end-session") and draw(st.booleans()):
        _set_params(case, id_token_hint=alice["id_token"])
    elif path.endswith("/oauth2/authorize") and draw(st.booleans()):
        _set_params(case, client_id=CLIENT[0], redirect_uri=REDIRECT_URI)
        if draw(st.booleans()):
            _set_params(case, **AUTHORIZE, state="s", code_challenge=CHALLENGE, code_challenge_method="S256")
    elif path.endswith(("/login", "/consent")) and draw(st.booleans()):
        _set_params(case, request=alice["pending"]["request"])
        if case.method == "POST" and draw(st.booleans()):
            _set_body(case, csrf=alice["pending"]["csrf"])
            cookies = alice["device"]
    elif "/link/" in path:
        cookies = alice["cookies"]
    case.headers = headers
    return cookies


def _takes_input(method: str, path: str) -> bool:
    """A body or credentials: inputs that can be sent malformed (any string is a valid query value)."""
    operation = DOCUMENT["paths"][path][method.lower()]
    return "requestBody" in operation or bool(operation.get("security"))


RUNS = [(method, path, GenerationMode.POSITIVE) for method, path in OPERATIONS] + [
    (method, path, GenerationMode.NEGATIVE) for method, path in OPERATIONS if _takes_input(method, path)
]
"""Negative cases only where there is an input to make invalid."""


@pytest.mark.parametrize("method,path,mode", RUNS, ids=[f"{m} {p} {g.value}" for m, p, g in RUNS])
def test_fuzzed_requests_get_described_answers(server, alice, method, path, mode):
    operation = SCHEMA[path][method]

    @settings(max_examples=EXAMPLES_PER_MODE, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case, data):
        cookies = _real_values(case, data.draw, alice)
        response = case.call(base_url=server.base, cookies=cookies, timeout=10)
        case.validate_response(response, checks=CHECKS)
        assert response.status_code < 500 or response.status_code in EXPECTED_5XX.get((method, path), ()), (
            response.status_code, response.text)

    run()
