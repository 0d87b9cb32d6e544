"""
Real C{twist authsrv} processes on the tests' PostgreSQL, and the demo's
relying party and a user's browser talking to them over HTTP (requests),
for the several-instances and outage tests.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
import shutil
from html import unescape
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import requests

from conftest import EXAMPLES
from prepared_keys import write_key_file

CLIENT = ("demo-app", "demo-app-secret")
GATEWAY = ("api-gateway", "api-gateway-secret")
INTERNAL_SECRET = "demo-internal-secret"
REDIRECT_URI = "http://127.0.0.1:9000/callback"
ALICE = "a1f0c9e2-5b7d-4c1e-9a3f-6d2b8e4c7a10"
TIMEOUT = 15

_HIDDEN = re.compile(r'<input type="hidden" name="(\w+)" value="([^"]*)"')


def pg_config(folder: Path, dsn: str, port: int, public_port: int, timeout: int = 2) -> Path:
    """
    The demo config in C{folder} on PostgreSQL, listening on C{port}, its
    issuer on C{public_port}, with C{timeout} seconds as the store's connect
    and statement timeouts; every config made in one folder shares its
    users file, secrets and key file (the session's prepared keys).
    """
    if not (folder / "demo-users.toml").exists():
        shutil.copytree(EXAMPLES, folder, ignore=shutil.ignore_patterns("demo-data"), dirs_exist_ok=True)
        write_key_file(folder / "shared-keys" / "keys.jwks.json", ("RS256", "ES256", "EdDSA"))
    text = (EXAMPLES / "demo.toml").read_text()
    for old, new in (
        ("[server]\n", f'[server]\npublic_url = "http://127.0.0.1:{public_port}"\n'),
        ("tcp:8080:", f"tcp:{port}:"),
        (
            'plugin = "sqlite"\npath = "demo-data/authsrv.sqlite3"',
            f'plugin = "postgres"\ndsn = "{dsn}"\nstatement_timeout = "{timeout}s"\nconnect_timeout = "{timeout}s"',
        ),
        ('path = "demo-data/keys.jwks.json"', 'path = "shared-keys/keys.jwks.json"'),
    ):
        assert old in text, f"examples/demo.toml changed: {old!r} is gone"
        text = text.replace(old, new)
    path = folder / f"authsrv-{port}.toml"
    path.write_text(text)
    return path


def pkce_pair() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(32)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def query_of(location: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


class NotRedirected(Exception):
    """The authorization request ended elsewhere than at the client (an error page)."""

    def __init__(self, status: int, body: str):
        super().__init__(f"{status}: {body[:200]}")
        self.status = status
        self.body = body


class Browser:
    """One user's browser: its own cookies, and it signs in when asked to."""

    def __init__(self, login: str = "alice", password: str = "alice-password"):
        self.session = requests.Session()
        self.login = login
        self.password = password

    def authorize(self, base: str, scope: str = "openid profile offline_access") -> tuple[str, str]:
        """Through the login form if needed, to the client's redirect: (code, PKCE verifier)."""
        verifier, challenge = pkce_pair()
        state = secrets.token_urlsafe(8)
        response = self.session.get(
            base + "/api/auth/oauth2/authorize",
            params={
                "client_id": CLIENT[0], "redirect_uri": REDIRECT_URI, "response_type": "code", "scope": scope,
                "state": state, "code_challenge": challenge, "code_challenge_method": "S256",
            },
            allow_redirects=False, timeout=TIMEOUT,
        )
        if response.status_code == 200 and 'name="password"' in response.text:
            fields = {name: unescape(value) for name, value in _HIDDEN.findall(response.text)}
            response = self.session.post(
                base + "/api/auth/login", data={**fields, "username": self.login, "password": self.password},
                allow_redirects=False, timeout=TIMEOUT,
            )
        if response.status_code not in (302, 303):
            raise NotRedirected(response.status_code, response.text)
        location = response.headers["location"]
        assert location.startswith(REDIRECT_URI), location
        returned = query_of(location)
        assert returned["state"] == state, returned
        return returned["code"], verifier


def token(base: str, **form) -> requests.Response:
    return requests.post(
        base + "/api/auth/oauth2/token", data={**form, "client_id": CLIENT[0], "client_secret": CLIENT[1]},
        timeout=TIMEOUT,
    )


def exchange(base: str, code: str, verifier: str) -> requests.Response:
    return token(base, grant_type="authorization_code", code=code, redirect_uri=REDIRECT_URI, code_verifier=verifier)


def refresh(base: str, refresh_token: str) -> requests.Response:
    return token(base, grant_type="refresh_token", refresh_token=refresh_token)


def introspect(base: str, token_value: str) -> requests.Response:
    return requests.post(base + "/api/auth/oauth2/introspect", data={"token": token_value}, auth=GATEWAY,
                         timeout=TIMEOUT)


def userinfo(base: str, access_token: str) -> requests.Response:
    return requests.get(base + "/api/auth/oauth2/userinfo", headers={"authorization": f"Bearer {access_token}"},
                        timeout=TIMEOUT)


def user_access(base: str, sub: str) -> requests.Response:
    return requests.post(
        base + "/api/internal/user-access", json={"userId": sub},
        headers={"authorization": f"Bearer {INTERNAL_SECRET}"}, timeout=TIMEOUT,
    )
