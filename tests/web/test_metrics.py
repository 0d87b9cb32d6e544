"""
Prometheus metrics as an operator reads them: a server built from its
config in this process, on real ports of 127.0.0.1, its /metrics scraped
over HTTP while a user signs in, a client gets, refreshes, replays and
revokes tokens and runs over its rate; label sets stay bounded whatever
client ids arrive.
"""

from __future__ import annotations

import base64
from http.cookiejar import CookieJar
from urllib.parse import urlencode

import pytest
import pytest_twisted
import treq
from prometheus_client.parser import text_string_to_metric_families
from treq.client import HTTPClient
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.logger import Logger, globalLogPublisher
from twisted.web.client import Agent

from authsrv.config import parse_config
from authsrv.identity.passwords import hash_password
from authsrv.identity.static import add_user
from authsrv.logfile import LineFile
from authsrv.metrics import MAX_CLIENT_LABELS, OTHER, Metrics
from authsrv.service import build
from authsrv.testing.identity import ALICE, PASSWORDS

from conftest import free_port
from flow_client import hidden_fields
from harness import CHEAP, pkce_pair, query_of
from prepared_keys import write_key_file

REDIRECT_URI = "http://127.0.0.1:9000/callback"
SECRETS = {"first": "first-secret", "gateway": "gateway-secret"}


def basic(client_id: str, secret: str) -> dict:
    return {b"authorization": [b"Basic " + base64.b64encode(f"{client_id}:{secret}".encode())]}


def samples(text: str) -> dict[tuple, float]:
    """Every sample of a scrape, by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def value(scraped: dict, name: str, **labels) -> float:
    return scraped.get((name, tuple(sorted(labels.items()))), 0.0)


class Server:
    """authsrv built by L{build} as C{twist authsrv} builds it, started on this process's reactor."""

    def __init__(self, tmp_path, monkeypatch, audit_file: LineFile | None = None):
        for client_id, secret in SECRETS.items():
            monkeypatch.setenv(f"TEST_{client_id.upper()}_SECRET", secret)
        users = tmp_path / "users.toml"
        add_user(users, login=ALICE.login, password_hash=hash_password(PASSWORDS[ALICE.sub], CHEAP), sub=ALICE.sub)
        write_key_file(tmp_path / "keys.jwks.json")
        port, metrics_port = free_port(), free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.issuer = self.base + "/api/auth"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.config = parse_config({
            "server": {"public_url": self.base, "listen": [f"tcp:{port}:interface=127.0.0.1"], "drain_delay": "0s"},
            "metrics": {"listen": [f"tcp:{metrics_port}:interface=127.0.0.1"]},
            "limits": {"refresh_grace": "0s"},
            "identity": [{"plugin": "static", "path": str(users)}],
            "clients": [
                {"client_id": "first", "secret_env": "TEST_FIRST_SECRET", "first_party": True,
                 "redirect_uris": [REDIRECT_URI]},
                {"client_id": "gateway", "secret_env": "TEST_GATEWAY_SECRET", "introspect_any": True,
                 "redirect_uris": [REDIRECT_URI], "rate_limit": "2/m"},
            ],
        }, tmp_path / "authsrv.toml")
        self.service = build(self.config, reactor, audit_file=audit_file)
        self.browser = HTTPClient(Agent(reactor), cookiejar=CookieJar())

    async def ready(self) -> None:
        """Wait until start-up has stored the config's clients (bounded)."""
        for _ in range(500):
            if self.service.readiness_problem() is None:
                return
            await deferLater(reactor, 0.01, lambda: None)
        raise AssertionError(f"not ready: {self.service.readiness_problem()}")

    async def scrape(self) -> dict[tuple, float]:
        response = await treq.get(self.metrics_url)
        assert response.code == 200
        assert response.headers.getRawHeaders(b"content-type")[0].startswith(b"text/plain; version=0.0.4")
        return samples(await response.text())

    async def sign_in(self, password: str) -> tuple[int, dict]:
        """
        Authorize as "first", submit the login form and follow the service's
        redirects; the last status and the query of the redirect to the client.
        """
        verifier, challenge = pkce_pair()
        self.verifier = verifier
        query = urlencode({"response_type": "code", "client_id": "first", "redirect_uri": REDIRECT_URI,
                           "scope": "openid offline_access", "state": "s", "code_challenge": challenge,
                           "code_challenge_method": "S256"})
        page = await (await self.browser.get(f"{self.issuer}/oauth2/authorize?{query}", allow_redirects=False)).content()
        form = {**hidden_fields(page), "username": ALICE.login, "password": password}
        response = await self.browser.post(f"{self.issuer}/login", data=form, allow_redirects=False)
        while response.code in (302, 303) and not self._url(response).startswith(REDIRECT_URI):
            await response.content()
            response = await self.browser.get(self._url(response), allow_redirects=False)
        await response.content()
        return response.code, query_of(self._url(response)) if response.code in (302, 303) else {}

    def _url(self, response) -> str:
        location = response.headers.getRawHeaders(b"location")[0].decode()
        return self.base + location if location.startswith("/") else location

    async def token(self, params: dict, client: str = "first", secret: str | None = None) -> tuple[int, dict]:
        response = await treq.post(f"{self.issuer}/oauth2/token", data=params,
                                   headers=basic(client, secret or SECRETS[client]))
        return response.code, await response.json()

    async def post(self, endpoint: str, params: dict, client: str, secret: str | None = None) -> int:
        response = await treq.post(f"{self.issuer}/oauth2/{endpoint}", data=params,
                                   headers=basic(client, secret or SECRETS[client]))
        await response.content()
        return response.code


@pytest.fixture
def server(tmp_path, monkeypatch):
    server = Server(tmp_path, monkeypatch)
    server.service.startService()
    pytest_twisted.blockon(Deferred.fromCoroutine(server.ready()))
    yield server
    pytest_twisted.blockon(server.service.stopService())


@pytest_twisted.ensureDeferred
async def test_counters_move_as_users_and_clients_act(server):
    before = await server.scrape()
    assert value(before, "authsrv_logins_total", outcome="success") == 0

    status, _ = await server.sign_in("not the password")
    assert status == 200
    status, query = await server.sign_in(PASSWORDS[ALICE.sub])
    assert status in (302, 303), status
    status, tokens = await server.token({"grant_type": "authorization_code", "code": query["code"],
                                         "redirect_uri": REDIRECT_URI, "code_verifier": server.verifier})
    assert status == 200, tokens
    status, rotated = await server.token({"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]})
    assert status == 200, rotated
    assert await server.post("revoke", {"token": rotated["access_token"]}, "first") == 200
    status, replayed = await server.token({"grant_type": "refresh_token", "refresh_token": tokens["refresh_token"]})
    assert (status, replayed["error"]) == (400, "invalid_grant")
    codes = [await server.post("introspect", {"token": "x"}, "gateway") for _ in range(3)]
    assert codes == [200, 200, 429]

    after = await server.scrape()
    assert value(after, "authsrv_logins_total", outcome="success") == 1
    assert value(after, "authsrv_logins_total", outcome="wrong_password") == 1
    assert value(after, "authsrv_tokens_issued_total", grant_type="authorization_code", client_id="first") == 1
    assert value(after, "authsrv_tokens_issued_total", grant_type="refresh_token", client_id="first") == 1
    assert value(after, "authsrv_reuse_detected_total", kind="refresh") == 1
    assert value(after, "authsrv_revocations_total", kind="access") == 1
    introspect = "/api/auth/oauth2/introspect"
    assert value(after, "authsrv_rate_limited_requests_total", route=introspect) == 1
    assert value(after, "authsrv_http_requests_total", route=introspect, status="200") == 2
    assert value(after, "authsrv_http_requests_total", route=introspect, status="429") == 1
    assert value(after, "authsrv_http_requests_total", route="/api/auth/oauth2/token", status="200") == 2
    assert value(after, "authsrv_http_request_duration_seconds_count", route="/api/auth/login") == 2  # the posts
    assert value(after, "authsrv_http_requests_total", route="/api/auth/oauth2/authorize", status="200") == 2
    assert value(after, "authsrv_store_call_duration_seconds_count", call="rotate_refresh") == 2
    assert value(after, "authsrv_store_call_duration_seconds_count", call="find_code") == 1
    assert value(after, "authsrv_store_call_duration_seconds_count", call="redeem_code") == 1
    assert value(after, "authsrv_identity_call_duration_seconds_count", backend="static",
                 call="requestAvatarId") == 2
    assert ("authsrv_signing_key_age_seconds", (("alg", "RS256"),)) in after
    assert value(after, "process_cpu_seconds_total") > 0


@pytest_twisted.ensureDeferred
async def test_routes_are_patterns_and_documents_never_paths(server):
    for path in ("/api/auth/jwks", "/api/auth/nowhere/secret-looking-path", "/healthz", "/readyz"):
        await (await treq.get(server.base + path)).content()
    scraped = await server.scrape()
    routes = {dict(labels)["route"] for name, labels in scraped if name == "authsrv_http_requests_total"}
    assert routes == {"jwks", OTHER, "/healthz", "/readyz"}


@pytest_twisted.ensureDeferred
async def test_junk_client_ids_add_no_series(server):
    await server.post("introspect", {"token": "x"}, "gateway")
    before = await server.scrape()
    for n in range(40):
        assert (await server.token({"grant_type": "refresh_token", "refresh_token": "x"}, f"junk-{n}", "x"))[0] == 401
        assert await server.post("revoke", {"token": "x"}, f"junk-{n}", "x") == 401
    after = await server.scrape()
    assert not any("junk" in repr(key) for key in after)
    new = {(name, labels) for name, labels in set(after) - set(before) if name == "authsrv_http_requests_total"}
    assert new == {
        ("authsrv_http_requests_total", (("route", "/api/auth/oauth2/token"), ("status", "401"))),
        ("authsrv_http_requests_total", (("route", "/api/auth/oauth2/revoke"), ("status", "401"))),
    }
    assert not {name for name, _ in set(after) - set(before) if name.startswith(("authsrv_tokens", "authsrv_rev"))}


@pytest_twisted.ensureDeferred
async def test_audit_lines_a_full_disk_loses_are_counted(tmp_path, monkeypatch):
    path = tmp_path / "audit.log"
    path.symlink_to("/dev/full")
    audit = LineFile(str(path))
    server = Server(tmp_path, monkeypatch, audit_file=audit)
    server.service.startService()
    try:
        await server.ready()
        for _ in range(3):
            audit.write("{}\n")
        # The first waits in the file's buffer, for the file to take it again.
        assert value(await server.scrape(), "authsrv_log_lines_dropped_total", log="audit") == 2
    finally:
        await server.service.stopService()


def test_client_labels_are_capped():
    metrics = Metrics()
    audit = Logger(namespace="authsrv.audit")
    globalLogPublisher.addObserver(metrics.audit_observer)
    try:
        for n in range(MAX_CLIENT_LABELS + 50):
            audit.info("issued", event="token.issued", sub="s", client_id=f"client-{n}", grant_id="g",
                       grant_type="authorization_code", token_fp="f")
        Logger(namespace="elsewhere").info("not audit", event="token.issued", client_id="outsider")
    finally:
        globalLogPublisher.removeObserver(metrics.audit_observer)
    series = {s.labels["client_id"]: s.value for family in metrics.registry.collect()
              if family.name == "authsrv_tokens_issued" for s in family.samples if s.name.endswith("_total")}
    assert len(series) == MAX_CLIENT_LABELS + 1
    assert series[OTHER] == 50
    assert "outsider" not in series


@pytest_twisted.ensureDeferred
async def test_only_metrics_on_the_metrics_listener(server):
    response = await treq.get(server.metrics_url.replace("/metrics", "/api/auth/jwks"))
    assert response.code == 404
    await response.content()
    response = await treq.get(server.base + "/metrics")
    assert response.code == 404
    await response.content()


def test_metrics_are_off_unless_configured():
    assert parse_config({}, None).metrics_listen == ()
