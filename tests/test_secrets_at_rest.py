"""
Secrets at rest: client secret hashes keyed with the store's server key
(the legacy plain SHA-256 still verifies), strong configured secrets outside
loopback demos, private database and key files whatever the umask, and a
Server header that names no version.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import time
from contextlib import contextmanager
from email.utils import parsedate_to_datetime
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.logger import globalLogPublisher
from twisted.web.http import datetimeToString

from authsrv.config import ConfigFileError, load_config, parse_config
from authsrv.configsection import ConfigError, Section
from authsrv.context import PluginContext
from authsrv.embedded import prepare_data_dir
from authsrv.keys import jwkfile, pem
from authsrv.protocol.clientauth import ClientCredentials, authenticate
from authsrv.protocol.errors import InvalidClient
from authsrv.records import Client
from authsrv.service import sync_config_clients
from authsrv.store import sqlite
from authsrv.testing.memory import MemoryStore
from authsrv.tokens import (
    CLIENT_SECRET_KEY,
    KEYED_PREFIX,
    client_secret_hash,
    entropy_bits,
    keyed_form,
    new_token,
    secret_matches,
    token_hash,
)
from authsrv.web.request import DateOfThisSecond

from harness import SECRETS, Harness
from wire import Listener, parse, request_head

KEY = bytes(range(32))
STRONG = new_token(32)
REVOKE = "/api/auth/oauth2/revoke"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@contextmanager
def warnings():
    """The text of every log event with level warn while inside."""
    seen: list[str] = []

    def observe(event):
        if event.get("log_level") is not None and event["log_level"].name == "warn":
            seen.append(event["log_format"].format(**event))

    globalLogPublisher.addObserver(observe)
    try:
        yield seen
    finally:
        globalLogPublisher.removeObserver(observe)


# --- keyed client secret hashes ---------------------------------------------


def test_keyed_hash_is_marked_and_needs_the_key():
    stored = client_secret_hash("s3cret", KEY)
    assert stored.startswith(KEYED_PREFIX) and token_hash("s3cret") not in stored
    assert secret_matches("s3cret", [stored], KEY) == [True]
    assert secret_matches("s3cret!", [stored], KEY) == [False]
    assert secret_matches("s3cret", [stored], bytes(32)) == [False]
    assert client_secret_hash("s3cret", bytes(32)) != stored


def test_one_secret_against_several_hashes_of_either_form():
    """A client's current and previous secret: each hash answered in its place, whatever its form."""
    keyed, other = client_secret_hash("s3cret", KEY), client_secret_hash("other", KEY)
    legacy = token_hash("s3cret")
    assert secret_matches("s3cret", [keyed, other, legacy, token_hash("other")], KEY) == [True, False, True, False]
    assert secret_matches("other", [keyed, other], KEY) == [False, True]
    assert secret_matches("s3cret", [], KEY) == []


def test_legacy_plain_hash_still_verifies_and_converts_without_the_secret():
    legacy = token_hash("s3cret")
    assert secret_matches("s3cret", [legacy], KEY) == [True]
    assert secret_matches("other", [legacy], KEY) == [False]
    assert keyed_form(legacy, KEY) == client_secret_hash("s3cret", KEY)
    assert keyed_form(keyed_form(legacy, KEY), KEY) == keyed_form(legacy, KEY)


def test_authenticate_checks_either_form_with_the_key():
    for stored in (token_hash("s3cret"), client_secret_hash("s3cret", KEY)):
        client = Client(client_id="web", secret_hash=stored, redirect_uris=["https://a.example/cb"])
        assert authenticate(client, ClientCredentials("web", "s3cret", "client_secret_post"), KEY, 0) is client
        with pytest.raises(InvalidClient):
            authenticate(client, ClientCredentials("web", "wrong", "client_secret_post"), KEY, 0)
    keyed = Client(client_id="web", secret_hash=client_secret_hash("s3cret", KEY), redirect_uris=["https://a.example/cb"])
    with pytest.raises(InvalidClient):
        authenticate(keyed, ClientCredentials("web", "s3cret", "client_secret_post"), bytes(32), 0)


@pytest_twisted.ensureDeferred
async def test_config_clients_are_stored_keyed_with_the_stores_key():
    store = MemoryStore()
    declared = [
        Client(client_id="web", secret_hash=token_hash("s3cret"), redirect_uris=["https://a.example/cb"], source="config"),
        Client(client_id="spa", secret_hash=None, redirect_uris=["https://a.example/cb"], source="config"),
    ]
    await sync_config_clients(store, declared)
    key = await store.server_key(CLIENT_SECRET_KEY)
    stored = await store.get_client("web")
    assert stored.secret_hash == client_secret_hash("s3cret", key)
    assert (await store.get_client("spa")).secret_hash is None
    await sync_config_clients(MemoryStore(store.tables), declared)
    assert (await store.get_client("web")).secret_hash == stored.secret_hash


@pytest_twisted.ensureDeferred
async def test_server_key_survives_a_restart_of_the_sqlite_store(tmp_path):
    path = tmp_path / "authsrv.sqlite3"
    store = sqlite.open_store(reactor, path)
    key = await store.server_key(CLIENT_SECRET_KEY)
    await store.close()
    store = sqlite.open_store(reactor, path)
    try:
        assert await store.server_key(CLIENT_SECRET_KEY) == key
    finally:
        await store.close()


def _basic(client_id: str, secret: str) -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()}


@pytest_twisted.ensureDeferred
async def test_token_endpoints_accept_keyed_and_legacy_secrets(tmp_path, monkeypatch):
    h = await Harness(tmp_path, monkeypatch).start()
    try:
        first = await h.store.get_client("first")
        assert first.secret_hash.startswith(KEYED_PREFIX)
        await h.store.put_client(Client(
            client_id="old", secret_hash=token_hash("old-secret"), redirect_uris=["https://a.example/cb"],
        ))
        for client_id, secret in (("first", SECRETS["first"]), ("old", "old-secret")):
            response, _ = await h.request("POST", REVOKE, data={"token": "x"}, headers=_basic(client_id, secret))
            assert response.code == 200, client_id
            response, body = await h.request("POST", REVOKE, data={"token": "x"}, headers=_basic(client_id, "no"))
            assert (response.code, json.loads(body)["error"]) == (401, "invalid_client")
    finally:
        await h.close()


# --- secret strength ------------------------------------------------------------


def test_entropy_estimate_is_length_times_the_classes_used():
    assert entropy_bits("") == 0
    assert entropy_bits("aaaa") == pytest.approx(4 * 4.7004, rel=1e-3)
    assert entropy_bits(new_token(12)) < 128 <= entropy_bits(new_token(32))
    assert entropy_bits(os.urandom(16).hex()) >= 128


def _config(public_url: str, **sections) -> dict:
    return {"server": {"public_url": public_url}, **sections}


CLIENT = {"client_id": "web", "secret_env": "WEB_SECRET", "redirect_uris": ["https://shop.example/cb"]}


def test_weak_client_secret_refused_outside_loopback(monkeypatch):
    monkeypatch.setenv("WEB_SECRET", "web-secret-2024")
    with pytest.raises(ConfigError) as e:
        parse_config(_config("https://id.example", clients=[CLIENT]), None)
    message = str(e.value)
    assert "\n" not in message and message.startswith("clients[0].secret_env: is too weak")
    assert 'python3 -c "import secrets; print(secrets.token_urlsafe(32))"' in message
    monkeypatch.setenv("WEB_SECRET", STRONG)
    (client,) = parse_config(_config("https://id.example", clients=[CLIENT]), None).clients
    assert secret_matches(STRONG, [client.secret_hash], KEY) == [True]


def test_weak_internal_secret_from_a_file_refused_outside_loopback(tmp_path):
    (tmp_path / "internal").write_text("changeme\n")
    with pytest.raises(ConfigError, match=r"^internal\.secret_file: is too weak \(about \d+ bits"):
        parse_config(_config("https://id.example", internal={"secret_file": "internal"}), tmp_path / "a.toml")
    (tmp_path / "internal").write_text(STRONG)
    assert parse_config(_config("https://id.example", internal={"secret_file": "internal"}),
                        tmp_path / "a.toml").internal_secret == STRONG


@pytest.mark.parametrize("public_url", ["http://127.0.0.1:8080", "http://localhost:8080", "http://[::1]:8080"])
def test_loopback_demo_allows_weak_secrets(monkeypatch, public_url):
    monkeypatch.setenv("WEB_SECRET", "web")
    monkeypatch.setenv("INTERNAL", "internal")
    config = parse_config(_config(public_url, clients=[CLIENT], internal={"secret_env": "INTERNAL"}), None)
    assert config.internal_secret == "internal"


def test_the_demo_config_loads():
    config = load_config(Path(__file__).parent.parent / "examples" / "demo.toml")
    assert config.internal_secret and any(c.secret_hash for c in config.clients)


def test_weak_secret_in_a_config_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("WEB_SECRET", "short")
    path = tmp_path / "authsrv.toml"
    path.write_text(
        '[server]\npublic_url = "https://id.example"\n'
        '[[clients]]\nclient_id = "web"\nsecret_env = "WEB_SECRET"\nredirect_uris = ["https://shop.example/cb"]\n'
    )
    with pytest.raises(ConfigFileError) as e:
        load_config(path)
    assert "\n" not in str(e.value) and "clients[0].secret_env: is too weak" in str(e.value)


# --- private files ------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_sqlite_files_are_0600_whatever_the_umask(tmp_path):
    path = tmp_path / "db" / "authsrv.sqlite3"
    path.parent.mkdir()
    with umask(0):
        store = sqlite.open_store(reactor, path)
        try:
            await store.server_key(CLIENT_SECRET_KEY)
            files = [path.with_name(path.name + suffix) for suffix in ("", "-wal", "-shm")]
            assert all(f.exists() for f in files)
            assert {f.name: _mode(f) for f in files} == {f.name: 0o600 for f in files}
        finally:
            await store.close()


@pytest_twisted.ensureDeferred
async def test_sqlite_files_readable_by_others_are_narrowed_with_a_warning(tmp_path):
    path = tmp_path / "authsrv.sqlite3"
    store = sqlite.open_store(reactor, path)
    await store.server_key(CLIENT_SECRET_KEY)
    await store.close()
    path.chmod(0o644)
    wal = path.with_name(path.name + "-wal")
    wal.write_bytes(b"")
    wal.chmod(0o664)
    with warnings() as seen:
        store = sqlite.open_store(reactor, path)
    try:
        assert _mode(path) == _mode(wal) == 0o600
        assert any(str(path) in line and "0644" in line for line in seen), seen
        assert any(str(wal) in line and "0664" in line for line in seen), seen
        assert await store.server_key(CLIENT_SECRET_KEY)
    finally:
        await store.close()


@pytest.fixture
def context(tmp_path):
    context = PluginContext(reactor, tmp_path, max_token_lifetime=3600)
    yield context
    context.stop()


def test_key_files_are_0600_whatever_the_umask(tmp_path, context):
    with umask(0):
        jwkfile.from_config(Section({}, "keystore", tmp_path), context)
        pem.from_config(Section({"directory": "pem"}, "keystore", tmp_path), context)
    assert _mode(tmp_path / "keys.jwks.json") == 0o600
    written = list((tmp_path / "pem").iterdir())
    assert written and all(_mode(f) == 0o600 for f in written)


def test_embedded_default_secrets_are_0600_whatever_the_umask(tmp_path):
    with umask(0):
        config, created = prepare_data_dir(tmp_path / "data")
    assert created is not None
    assert _mode(config) == _mode(tmp_path / "data" / "internal-api-secret") == 0o600


# --- Server and Date headers -----------------------------------------------------


@pytest.mark.parametrize("path", ["/healthz", "/api/auth/jwks", "/nowhere", "/api/auth/oauth2/token"])
def test_every_response_names_a_generic_server(path):
    _, transport = Listener().send(request_head("GET", path))
    status, headers, _ = parse(transport)
    assert headers["server"] == "authsrv", (status, headers)


def test_every_response_is_dated_now():
    _, transport = Listener().send(request_head("GET", "/healthz"))
    _, headers, _ = parse(transport)
    sent = parsedate_to_datetime(headers["date"]).timestamp()
    assert abs(sent - time.time()) < 5, headers["date"]


def test_the_date_is_formatted_once_a_second_and_anew_the_next():
    formatted = []
    now = [1_900_000_000.25]

    def format_date(seconds):
        formatted.append(seconds)
        return datetimeToString(seconds)

    date = DateOfThisSecond(format_date, clock=lambda: now[0])
    assert date() == date() == b"Sun, 17 Mar 2030 17:46:40 GMT"
    now[0] = 1_900_000_000.99
    assert date() == b"Sun, 17 Mar 2030 17:46:40 GMT"
    now[0] = 1_900_000_001.01
    assert date() == b"Sun, 17 Mar 2030 17:46:41 GMT"
    assert date(0) == b"Thu, 01 Jan 1970 00:00:00 GMT"
    assert formatted == [1_900_000_000, 1_900_000_001, 0]


def test_refusals_below_the_request_layer_name_a_generic_server():
    listener = Listener({"max_header_count": 10})
    _, transport = listener.send(request_head("GET", "/healthz", {f"X-{n}": "v" for n in range(20)}))
    status, headers, _ = parse(transport)
    assert (status, headers["server"]) == (431, "authsrv")
    listener = Listener({"max_connections": 1})
    listener.connect(host="192.0.2.1")
    _, refused = listener.connect(host="192.0.2.2")
    status, headers, _ = parse(refused)
    assert (status, headers["server"]) == (503, "authsrv")
