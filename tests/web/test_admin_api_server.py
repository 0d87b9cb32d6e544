"""
The admin API on a real server (C{twist authsrv} in a child process), as a
provisioning script uses it: create a client, sign in with it, rotate its
secret and authenticate with both secrets during the overlap and only the
new one after, ban a user and see it at user-access; every step is in the
JSON audit log with the admin credential's name. The API answers only on
the internal listener with its own secret.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
import requests

from conftest import EXAMPLES, free_port
from test_e2e_relying_party import browser_login

from harness import pkce_pair

pytestmark = pytest.mark.slow

REDIRECT_URI = "http://127.0.0.1:9000/callback"
ADMIN_SECRET = secrets.token_urlsafe(32)
INTERNAL_SECRET = "demo-internal-secret"
ACTOR = "provisioning-script"
ALICE_SUB = "a1f0c9e2-5b7d-4c1e-9a3f-6d2b8e4c7a10"
OVERLAP = 4
CLIENT_CACHE = 2.1
"""Seconds a server may answer from its cached copy of a client (flows/clients.py TTL)."""


@pytest.fixture
def server(run_server, tmp_path):
    """The demo with the internal API (and so the admin API) on a listener of its own."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("demo-data"))
    (tmp_path / "examples" / "demo-secrets" / "admin-api-secret").write_text(ADMIN_SECRET)
    config = tmp_path / "examples" / "demo.toml"
    port, internal = free_port(), free_port()
    config.write_text(
        config.read_text()
        .replace('public_url = "http://127.0.0.1:8080"', f'public_url = "http://127.0.0.1:{port}"')
        .replace("tcp:8080:", f"tcp:{port}:")
        .replace("[internal]\n", f'[internal]\nlisten = ["tcp:{internal}:interface=127.0.0.1"]\nserve_on_main = false\n')
        + f'\n[admin]\nsecret_file = "demo-secrets/admin-api-secret"\nname = "{ACTOR}"\n'
    )
    running = run_server(["--log-format", "json", "authsrv", "--config", str(config)], tmp_path, port=port)
    running.internal = f"http://127.0.0.1:{internal}"
    return running


def _admin(server, method: str, path: str, *, secret: str = ADMIN_SECRET, base: str | None = None, **kwargs):
    return requests.request(method, (base or server.internal) + path, timeout=10,
                            headers={"Authorization": f"Bearer {secret}"}, **kwargs)


def _sign_in(server, client_id: str) -> tuple[str, str]:
    """A user's sign-in at the client, up to its redirect: (code, PKCE verifier)."""
    verifier, challenge = pkce_pair()
    url = server.base + "/api/auth/oauth2/authorize?" + urlencode({
        "response_type": "code", "client_id": client_id, "redirect_uri": REDIRECT_URI, "scope": "openid offline_access",
        "state": "st", "code_challenge": challenge, "code_challenge_method": "S256",
    })
    location = browser_login(requests.Session(), url, "alice", "alice-password")
    assert location.startswith(REDIRECT_URI), location
    return parse_qs(urlsplit(location).query)["code"][0], verifier


def _token(server, client_id: str, secret: str, **form) -> requests.Response:
    return requests.post(server.base + "/api/auth/oauth2/token", auth=(client_id, secret), data=form, timeout=10)


def _exchange(server, client_id: str, secret: str) -> requests.Response:
    code, verifier = _sign_in(server, client_id)
    return _token(server, client_id, secret, grant_type="authorization_code", code=code, redirect_uri=REDIRECT_URI,
                  code_verifier=verifier)


def _audit(server) -> list[dict]:
    out, _ = server.stop()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [e for e in lines if "event" in e and "actor" in e]


def test_a_provisioning_script(server):
    made = _admin(server, "POST", "/api/admin/clients", json={
        "client_id": "script-app", "name": "Script App", "redirect_uris": [REDIRECT_URI], "first_party": True,
    })
    assert made.status_code == 201, made.text
    first_secret = made.json()["client_secret"]

    tokens = _exchange(server, "script-app", first_secret)
    assert tokens.status_code == 200, tokens.text
    assert {"access_token", "id_token", "refresh_token"} <= set(tokens.json())

    rotated = _admin(server, "POST", "/api/admin/clients/script-app/secret", json={"overlap": OVERLAP})
    assert rotated.status_code == 200, rotated.text
    second_secret = rotated.json()["client_secret"]
    assert second_secret != first_secret
    ends = rotated.json()["previous_secret_until"]
    time.sleep(CLIENT_CACHE)
    assert time.time() < ends
    assert _exchange(server, "script-app", first_secret).status_code == 200
    refreshed = _token(server, "script-app", second_secret, grant_type="refresh_token",
                       refresh_token=tokens.json()["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text

    time.sleep(max(0.0, ends - time.time()) + 0.2)
    refused = _exchange(server, "script-app", first_secret)
    assert refused.status_code == 401 and refused.json()["error"] == "invalid_client"
    assert _exchange(server, "script-app", second_secret).status_code == 200

    banned = _admin(server, "PUT", f"/api/admin/users/{ALICE_SUB}/ban", json={"reason": "abuse"})
    assert banned.status_code == 200 and banned.json()["sub"] == ALICE_SUB, banned.text
    access = requests.post(server.internal + "/api/internal/user-access", json={"userId": ALICE_SUB}, timeout=10,
                           headers={"Authorization": f"Bearer {INTERNAL_SECRET}"})
    assert access.json()["banned"] is True and access.json()["banReason"] == "abuse"

    for secret in (None, "wrong", INTERNAL_SECRET):
        answer = requests.get(server.internal + "/api/admin/clients", timeout=10,
                              headers={"Authorization": f"Bearer {secret}"} if secret else {})
        assert answer.status_code == 401 and answer.json()["error"] == "unauthorized"
    public = _admin(server, "GET", "/api/admin/clients", base=server.base)
    assert public.status_code == 404 and "script-app" not in public.text

    events = _audit(server)
    by_admin = [(e["event"], e.get("client_id") or e.get("sub")) for e in events if e.get("actor") == ACTOR]
    assert by_admin == [
        ("client.created", "script-app"), ("client.secret_rotated", "script-app"), ("user.banned", ALICE_SUB),
    ]
    issued = [e for e in events if e["event"] == "token.issued" and e["client_id"] == "script-app"]
    assert [e["grant_type"] for e in issued] == ["authorization_code", "authorization_code", "refresh_token",
                                                 "authorization_code"]


def test_an_admin_listener_of_its_own(run_server, tmp_path):
    """With [admin] listen, the admin API answers there only: not on the internal or the public listener."""
    shutil.copytree(EXAMPLES, tmp_path / "examples", ignore=shutil.ignore_patterns("demo-data"))
    (tmp_path / "examples" / "demo-secrets" / "admin-api-secret").write_text(ADMIN_SECRET)
    config = tmp_path / "examples" / "demo.toml"
    port, internal, admin = free_port(), free_port(), free_port()
    config.write_text(
        config.read_text()
        .replace('public_url = "http://127.0.0.1:8080"', f'public_url = "http://127.0.0.1:{port}"')
        .replace("tcp:8080:", f"tcp:{port}:")
        .replace("[internal]\n", f'[internal]\nlisten = ["tcp:{internal}:interface=127.0.0.1"]\n')
        + f'\n[admin]\nsecret_file = "demo-secrets/admin-api-secret"\nlisten = ["tcp:{admin}:interface=127.0.0.1"]\n'
    )
    server = run_server(["authsrv", "--config", str(config)], tmp_path, port=port)
    listed = _admin(server, "GET", "/api/admin/clients", base=f"http://127.0.0.1:{admin}")
    assert listed.status_code == 200 and "demo-app" in [c["client_id"] for c in listed.json()["clients"]]
    for base in (f"http://127.0.0.1:{internal}", server.base):
        assert _admin(server, "GET", "/api/admin/clients", base=base).status_code == 404
    elsewhere = _admin(server, "GET", "/api/internal/user-access", base=f"http://127.0.0.1:{admin}")
    assert elsewhere.status_code == 404 and elsewhere.json()["error"] == "not_found"
