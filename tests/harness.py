"""
An authsrv in memory for flow tests: the real web root over a real SQLite
store (or PostgreSQL, given a C{postgres_dsn}), a real JWK-file keystore and a real static users file, driven through
StubTreq, with time from a L{Clock} so every expiry is a C{clock.advance}.
The keystore starts from the session's prepared keys (tests/prepared_keys.py).

The plugins still run their blocking work on thread pools of the real
reactor, so tests using this are C{@pytest_twisted.ensureDeferred} and every
request goes through L{Harness.request}, which keeps delivering the in-memory
connection's bytes until the response is complete.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

from argon2 import PasswordHasher, profiles
from treq.testing import StubTreq
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater

from authsrv.config import parse_config
from authsrv.configsection import Section
from authsrv.context import PluginContext
from authsrv.identity.chain import IdentityChain
from authsrv.identity.passwords import PasswordVerifier, hash_password, hasher_of, new_hashes
from authsrv.identity.static import RELOAD_INTERVAL, StaticIdentityBackend, add_user, file_thread
from authsrv.interfaces import IChatLinkSource
from authsrv.keys import jwkfile
from authsrv.remote_documents import RemoteDocuments
from authsrv.service import sync_config_clients, web_root
from authsrv.store import postgres, sqlite
from authsrv.chat.config import ChatConfig
from authsrv.chat.crypto import TokenCipher, key_from_text, new_key_text
from authsrv.chat.provider import ChatProvider
from authsrv.chat.tokens import ChatTokens
from authsrv.testing.fake_chat import FakeChatProvider
from authsrv.testing.identity import ALICE, BOB, MALLORY, PASSWORDS, ZOE
from authsrv.web.internal import InternalAPI

from prepared_keys import write_key_file

BASE = "http://127.0.0.1:8080"
ISSUER = BASE + "/api/auth"
SPOOF = "Your+account+is+locked.+Call+555+0100"
"""A parameter name, as a link that puts words of its own on a page writes it in a query."""
NOW = 1_800_000_000
CHEAP = PasswordHasher.from_parameters(profiles.CHEAPEST)

CLIENTS = [
    {
        "client_id": "first",
        "name": "First-Party App",
        "secret_env": "AUTHSRV_TEST_FIRST_SECRET",
        "first_party": True,
        "redirect_uris": ["http://127.0.0.1:9000/callback"],
        "post_logout_redirect_uris": ["http://127.0.0.1:9000/"],
        "end_session_enabled": True,
        "resources": ["https://api.example.test"],
    },
    {
        "client_id": "partner",
        "name": "Partner App",
        "secret_env": "AUTHSRV_TEST_PARTNER_SECRET",
        "redirect_uris": ["http://127.0.0.1:9001/callback"],
        "post_logout_redirect_uris": ["http://127.0.0.1:9001/"],
        "end_session_enabled": True,
    },
    {
        "client_id": "spa",
        "name": "Single-Page App",
        "redirect_uris": ["http://127.0.0.1:9002/callback"],
    },
    {
        "client_id": "gateway",
        "name": "API Gateway",
        "secret_env": "AUTHSRV_TEST_GATEWAY_SECRET",
        "introspect_any": True,
        "redirect_uris": ["http://127.0.0.1:9003/callback"],
    },
]
SECRETS = {  # strong enough for an https public URL too (128 bits)
    "first": "first-secret-Q3v9ZkP2mW7xL4nR8tY6",
    "partner": "partner-secret-H5j2Nc8Rw4Tq9Lm3Xv7",
    "gateway": "gateway-secret-B6s1Kd9Pf3Yz7Gh2Wq5",
}
ENVIRON = {
    "AUTHSRV_TEST_FIRST_SECRET": SECRETS["first"],
    "AUTHSRV_TEST_PARTNER_SECRET": SECRETS["partner"],
    "AUTHSRV_TEST_GATEWAY_SECRET": SECRETS["gateway"],
}
USERS = (ALICE, BOB, ZOE, MALLORY)
INTERNAL_SECRET = "internal-test-secret"
CHAT_BASE = "https://chat.example.test"


def pkce_pair() -> tuple[str, str]:
    """A fresh (verifier, S256 challenge), as a relying party makes one per attempt."""
    verifier = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def query_of(location: str) -> dict[str, str]:
    """The query parameters of a redirect's Location, one value each."""
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


async def settle(transport, d):
    """
    The result of C{d}, delivering the in-memory connection's bytes
    (C{transport.flush()}) until it fires, while the real reactor runs the
    plugins' threads.
    """
    results: list = []
    d.addBoth(results.append)
    for _ in range(2000):
        if results:
            break
        transport.flush()
        if not results:
            await deferLater(reactor, 0.001, lambda: None)
    else:
        raise AssertionError("no response: the request hangs")
    if hasattr(results[0], "raiseException"):
        results[0].raiseException()
    return results[0]


class Harness:
    """
    One server; see the module docstring. With C{fetch_documents}, client
    ID metadata documents are fetched over real connections on the real
    reactor (timed by the test's clock).
    """

    def __init__(self, tmp_path: Path, monkeypatch, config: dict | None = None, identity=None, start: int = NOW, *,
                 fetch_documents: bool = False, postgres_dsn: str | None = None):
        for name, value in ENVIRON.items():
            monkeypatch.setenv(name, value)
        self.clock = Clock()
        self.clock.advance(start)
        users = tmp_path / "users.toml"
        for user in USERS:
            add_user(
                users,
                login=user.login,
                password_hash=hash_password(PASSWORDS[user.sub], CHEAP),
                sub=user.sub,
                name=user.name,
                email=user.email,
                email_verified=user.email_verified,
                picture=user.picture,
                chat_user_id=user.chat_user_id,
                disabled=user.disabled,
                disabled_reason=user.disabled_reason,
            )
        self.config = parse_config({"clients": CLIENTS, **(config or {})}, tmp_path / "authsrv.toml")
        self.context = PluginContext(reactor, tmp_path, self.config.limits.max_token_lifetime,
                                     password_hasher=hasher_of(self.config))
        if postgres_dsn is None:
            self.store = sqlite.from_config(Section({}, "store", tmp_path), self.context)
        else:
            self.store = postgres.from_config(Section({"dsn": postgres_dsn}, "store", tmp_path), self.context)
        algorithms = tuple((config or {}).get("keystore", {}).get("algorithms", ("RS256", "ES256", "EdDSA")))
        write_key_file(tmp_path / "keys.jwks.json", algorithms, start)
        self.keystore = jwkfile.from_config(
            Section({"algorithms": list(algorithms)}, "keystore", tmp_path), self.context
        )
        verifier = PasswordVerifier(reactor, self.context.threadpool("passwords", 2), CHEAP)
        self.hash_password = new_hashes(self.context)
        self.identity = identity or StaticIdentityBackend(users, self.clock, verifier, file_thread(self.context))
        self.chat_fake = FakeChatProvider(self.clock)
        self.chat_config = ChatConfig(
            encryption_key=key_from_text(new_key_text()), client_secret=self.chat_fake.client_secret,
            **self.chat_fake.endpoints(CHAT_BASE),
        )
        self.chat_cipher = TokenCipher(self.chat_config.encryption_key)
        provider = ChatProvider(self.clock, self.chat_fake.memory_client(), self.chat_config)
        self.chat_tokens = ChatTokens(
            self.clock, self.store, self.identity, provider, self.chat_cipher, self.chat_config,
            self.identity if IChatLinkSource.providedBy(self.identity) else None,
        )
        self.internal = InternalAPI(
            reactor=self.clock, secret=INTERNAL_SECRET, store=self.store, identity=self.identity,
            chat_tokens=self.chat_tokens,
        )
        self.root = web_root(
            self.config, self.clock, self.store, self.keystore, IdentityChain([self.identity], ("static",)),
            lambda: None, self.internal.resource(), hash_password=self.hash_password,
            documents=RemoteDocuments(reactor, self.config.remote_documents, clock=self.clock)
            if fetch_documents else None,
        )
        self.http = StubTreq(self.root)

    async def start(self) -> "Harness":
        await sync_config_clients(self.store, self.config.clients)
        return self

    async def users_reread(self, seconds: float = RELOAD_INTERVAL) -> None:
        """
        Let C{seconds} pass, so the users file is looked at again, and wait
        for the reload that look starts on the file's one thread.
        """
        self.clock.advance(seconds)
        await self.identity.user_by_id("")
        await file_thread(self.context)(lambda: None)

    async def close(self) -> None:
        await self.store.close()
        await self.identity.close()
        self.context.stop()

    def now(self) -> int:
        return int(self.clock.seconds())

    async def request(self, method: str, path: str, **kwargs):
        """
        (response, body bytes) of a request to C{path} (relative to the base
        URL, or absolute); redirects are not followed.
        """
        url = path if path.startswith("http") else BASE + path
        kwargs.setdefault("allow_redirects", False)
        d = self.http.request(method, url, **kwargs)
        response = await self._settle(d)
        body = await self._settle(response.content())
        return response, body

    async def _settle(self, d):
        return await settle(self.http, d)

    async def get(self, path: str, **kwargs):
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, data: dict | None = None, **kwargs):
        return await self.request("POST", path, data=data, **kwargs)

    async def json(self, method: str, path: str, **kwargs):
        response, body = await self.request(method, path, **kwargs)
        return response, json.loads(body) if body else None

    def authorize_url(self, client_id="first", redirect_uri=None, scope="openid profile email offline_access",
                      challenge=None, state="st4te", **extra) -> str:
        """An authorization request as a relying party builds it."""
        redirect_uri = redirect_uri or next(c["redirect_uris"][0] for c in CLIENTS if c["client_id"] == client_id)
        params = {
            "response_type": "code",
            "client_id": client_id,
            "redirect_uri": redirect_uri,
            "scope": scope,
            "state": state,
            "code_challenge": challenge or pkce_pair()[1],
            "code_challenge_method": "S256",
            **extra,
        }
        return ISSUER + "/oauth2/authorize?" + urlencode({k: v for k, v in params.items() if v is not None})


async def discovery_when(tmp_path: Path, monkeypatch, config: dict) -> dict:
    """The OpenID discovery document of a server started with C{config} (the test clients' plus its own)."""
    h = await Harness(tmp_path, monkeypatch, config).start()
    try:
        _, document = await h.json("GET", ISSUER + "/.well-known/openid-configuration")
        return document
    finally:
        await h.close()
