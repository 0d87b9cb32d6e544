"""
C{authsrv-admin import better-auth} with the database Better Auth itself made
(tests/fixtures/better_auth), into a SQLite store with the static users file
(then served: old passwords through the login flow, bans at user-access,
chat-token, Better Auth's refresh token at the token endpoint) and into a
PostgreSQL store with the PostgreSQL identity backend in own mode. A dry run
writes nothing; a second run writes nothing new.
"""

from __future__ import annotations

import base64
import json
import sqlite3
import tomllib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2
import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import deferLater

from authsrv.chat.crypto import TokenCipher, key_from_text, new_key_text
from authsrv.configsection import Section
from authsrv.context import PluginContext
from authsrv.identity.passwords import is_better_auth_hash
from authsrv.operations.better_auth import (
    Offer,
    Source,
    SourceUnavailable,
    _source_error,
    import_better_auth,
    plan,
    sha256_hex,
)
from authsrv.records import LinkedAccount
from authsrv.store import postgres as postgres_store
from authsrv.testing.fake_chat import FakeChatUser
from authsrv.testing.identity import portal_login
from authsrv.testing.memory import MemoryStore
from authsrv.tokens import token_hash
from better_auth_fixture import MADE_AT, MANIFEST, USERS, load
from conftest import admin, free_port, ok
from dpop_proofs import ec_key
from flow_client import Browser, location, query_of
from harness import BASE, INTERNAL_SECRET, ISSUER, Harness
from identity.test_identity_postgres import open_backend

INTERNAL = {"Authorization": f"Bearer {INTERNAL_SECRET}", "Content-Type": "application/json"}
SQLITE_TABLES = ("clients", "bans", "linked_accounts", "consents", "grants", "refresh_tokens")


@pytest.fixture
def ba_dsn(postgres):
    dsn = postgres.database()
    load(dsn)
    return dsn


def write_config(folder: Path, key_text: str, store: str = "", identity: str = "") -> str:
    config = folder / "authsrv.toml"
    config.write_text(
        f'[server]\npublic_url = "{BASE}"\n'
        + (identity or '[[identity]]\nplugin = "static"\npath = "users.toml"\n')
        + (store or '[store]\nplugin = "sqlite"\npath = "authsrv.sqlite3"\n')
        + '[chat]\nencryption_key_file = "chat.key"\n'
    )
    (folder / "chat.key").write_text(key_text + "\n")
    return str(config)


def sqlite_rows(path: Path) -> dict:
    with sqlite3.connect(path) as db:
        return {table: sorted(db.execute(f"SELECT * FROM {table}").fetchall()) for table in SQLITE_TABLES}


async def run_import(config: str, dsn: str, cwd: Path, *extra: str) -> dict:
    result = await admin("--config", config, "--json", "import", "better-auth", "--dsn", dsn, *extra, cwd=cwd)
    return json.loads(ok(result)) | {"stderr": result.stderr}


async def internal(h, path: str, sub: str):
    response, raw = await h.request("POST", f"/api/internal/{path}", data=json.dumps({"userId": sub}).encode(),
                                    headers=INTERNAL)
    return response.code, json.loads(raw)


@pytest_twisted.ensureDeferred
async def test_import_into_sqlite_and_the_users_file_then_serve(ba_dsn, tmp_path, monkeypatch):
    h = Harness(tmp_path, monkeypatch, start=MADE_AT + 60)
    key_text = base64.urlsafe_b64encode(h.chat_config.encryption_key).rstrip(b"=").decode()
    config = write_config(tmp_path, key_text)
    users_before = (tmp_path / "users.toml").read_text()
    try:
        await h.start()
        before = sqlite_rows(tmp_path / "authsrv.sqlite3")

        dry = await run_import(config, ba_dsn, tmp_path, "--dry-run")
        assert dry["dry_run"] is True and dry["written"] == {kind: 0 for kind in dry["written"]}
        assert dry["found"] == {"users": 6, "clients": 2, "bans": 1, "linked": 2, "consents": 1, "grants": 1,
                                "refresh_tokens": 1}
        assert sqlite_rows(tmp_path / "authsrv.sqlite3") == before
        assert (tmp_path / "users.toml").read_text() == users_before

        first = await run_import(config, ba_dsn, tmp_path)
        assert first["written"] == first["found"], first
        assert "read 6 users" in first["stderr"] and "one transaction" in first["stderr"]
        assert first["problems"] == []
        for event in ("client.created", "user.banned", "user.created"):
            assert event in first["stderr"], event
        assert first["stderr"].count("client.created") == 2 and first["stderr"].count("user.created") == 6
        after = sqlite_rows(tmp_path / "authsrv.sqlite3")
        users_after = (tmp_path / "users.toml").read_text()
        for secret in (MANIFEST["refresh_token"]["token"], MANIFEST["discord"]["alice"]["accessToken"],
                       MANIFEST["clients"]["third_party"]["client_secret"]):
            assert secret not in repr(after) and secret not in users_after

        second = await run_import(config, ba_dsn, tmp_path)
        assert second["written"] == {kind: 0 for kind in second["written"]}
        assert "client.created" not in second["stderr"] and "user.created" not in second["stderr"]
        assert sqlite_rows(tmp_path / "authsrv.sqlite3") == after
        assert (tmp_path / "users.toml").read_text() == users_after

        def stored_hashes() -> dict:
            users = tomllib.loads((tmp_path / "users.toml").read_text())["users"]
            return {u["sub"]: u["password_hash"] for u in users}

        imported = stored_hashes()
        for who, user in USERS.items():
            assert is_better_auth_hash(imported[user["id"]]), who
        await h.users_reread(120)
        for who in ("alice", "bob", "carol", "erin", "admin"):
            user = USERS[who]
            browser = Browser(h)
            response, _ = await browser.authorize("first")
            response, body = await browser.submit_login(response, user["email"], user["password"])
            assert response.code in (302, 303) and "code" in query_of(location(response)), (who, body)
        # The successful logins replaced the Better Auth hashes by argon2id in the file authsrv owns, written on
        # the file's own thread after the logins answered (a bounded wait for that thread, not for a clock).
        upgraders = [USERS[who]["id"] for who in ("alice", "bob", "carol", "erin", "admin")]
        for _ in range(500):
            upgraded = stored_hashes()
            if all(upgraded[sub].startswith("$argon2id$") for sub in upgraders):
                break
            await deferLater(reactor, 0.01)
        assert {sub: upgraded[sub][:10] for sub in upgraders} == {sub: "$argon2id$" for sub in upgraders}
        browser = Browser(h)
        response, _ = await browser.authorize("first")
        response, body = await browser.submit_login(response, USERS["dave"]["email"],
                                                    USERS["dave"]["password"])
        assert response.code == 403 and b"suspended" in body

        code, answer = await internal(h, "user-access", USERS["dave"]["id"])
        assert code == 200 and answer["banned"] is True and answer["banReason"] == MANIFEST["banned"]["dave"]
        code, answer = await internal(h, "user-access", USERS["erin"]["id"])
        assert code == 200 and answer["banned"] is False

        code, answer = await internal(h, "chat-token", USERS["alice"]["id"])
        assert code == 200 and answer["accessToken"] == MANIFEST["discord"]["alice"]["accessToken"], answer
        bob = MANIFEST["discord"]["bob"]
        h.chat_fake.honour_refresh_token(bob["refreshToken"], FakeChatUser(bob["accountId"], "bob"))
        code, answer = await internal(h, "chat-token", USERS["bob"]["id"])
        assert code == 200 and h.chat_fake.access_valid(answer["accessToken"]), answer

        # Carol's refresh token, issued by Better Auth to Stats Bot, works at the token endpoint.
        client = MANIFEST["clients"]["third_party"]
        refresh = {"grant_type": "refresh_token", "refresh_token": MANIFEST["refresh_token"]["token"],
                   "client_id": client["client_id"], "client_secret": client["client_secret"]}
        response, tokens = await h.json("POST", ISSUER + "/oauth2/token", data=refresh)
        assert response.code == 200, tokens
        assert tokens["refresh_token"] != refresh["refresh_token"] and tokens["access_token"]
        response, userinfo = await h.json(
            "GET", ISSUER + "/oauth2/userinfo", headers={"Authorization": f"Bearer {tokens['access_token']}"}
        )
        assert response.code == 200 and userinfo["sub"] == USERS["carol"]["id"]
        code, answer = await internal(h, "user-access", USERS["carol"]["id"])
        assert answer["allowed"] is True and answer["hasActiveGrant"] is True
        response, error = await h.json("POST", ISSUER + "/oauth2/token",
                                       data={**refresh, "client_secret": "not-the-secret"})
        assert response.code == 401 and error["error"] == "invalid_client"
    finally:
        await h.close()


@pytest_twisted.ensureDeferred
async def test_import_into_postgres_own_mode(ba_dsn, postgres, tmp_path, context):
    store_dsn, identity_dsn = postgres.database(), postgres.database()
    config = write_config(
        tmp_path, new_key_text(),
        store=f'[store]\nplugin = "postgres"\ndsn = "{store_dsn}"\n',
        identity=f'[[identity]]\nplugin = "postgres"\ndsn = "{identity_dsn}"\n',
    )
    dry = await run_import(config, ba_dsn, tmp_path, "--dry-run")
    assert dry["found"]["users"] == 6

    def counts() -> dict:
        with psycopg2.connect(store_dsn) as db, db.cursor() as cursor:
            found = {}
            for table in SQLITE_TABLES:
                cursor.execute(f"SELECT count(*) FROM {table}")
                found[table] = cursor.fetchone()[0]
            return found

    assert set(counts().values()) == {0}
    first = await run_import(config, ba_dsn, tmp_path)
    assert first["written"] == first["found"] and first["problems"] == []
    assert (await run_import(config, ba_dsn, tmp_path))["written"] == {kind: 0 for kind in first["written"]}
    assert counts() == {"clients": 2, "bans": 1, "linked_accounts": 2, "consents": 1, "grants": 1,
                        "refresh_tokens": 1}

    backend = open_backend({"dsn": identity_dsn}, context)
    store = postgres_store.from_config(Section({"dsn": store_dsn}, "store", "."), PluginContext(context.reactor, "."))
    try:
        for who, user in USERS.items():
            avatar = await portal_login(backend, user["email"], user["password"])
            assert avatar.sub == user["id"], who
        found = await store.get_refresh_token(token_hash(MANIFEST["refresh_token"]["token"]))
        assert found is not None and found.sub == USERS["carol"]["id"] and found.user_ban is None
        ban = await store.get_ban(USERS["dave"]["id"], MADE_AT)
        assert ban.reason == MANIFEST["banned"]["dave"] and ban.until is None
        assert await store.get_ban(USERS["erin"]["id"], MADE_AT) is None
        portal = await store.get_client(MANIFEST["clients"]["first_party"]["client_id"])
        assert portal.first_party and portal.redirect_uris == tuple(MANIFEST["clients"]["first_party"]["redirect_uris"])
        assert await store.get_consent(USERS["carol"]["id"], MANIFEST["clients"]["third_party"]["client_id"]) == {
            "openid", "profile", "email", "offline_access"
        }
    finally:
        await store.close()
        backend.close()


def test_better_auth_hashes_are_authsrv_digests():
    digest = base64.urlsafe_b64encode(bytes.fromhex(token_hash("s3cret"))).rstrip(b"=").decode()
    assert sha256_hex(digest) == token_hash("s3cret")
    for stored in (None, "", digest + "A", digest[:-1], "!" * 43, "aGVsbG8", "a" * 86):
        assert sha256_hex(stored) is None, stored


@pytest_twisted.ensureDeferred
async def test_an_unreachable_or_foreign_database_is_one_line(tmp_path, pg_dsn):
    (tmp_path / "users.toml").write_text("")
    config = write_config(tmp_path, new_key_text())
    result = await admin("--config", config, "import", "better-auth", "--dsn", pg_dsn, cwd=tmp_path)
    assert result.returncode == 1 and "cannot read the Better Auth database" in result.stderr
    assert "Traceback" not in result.stderr
    result = await admin("--config", config, "import", "better-auth", "--dsn",
                         f"host=127.0.0.1 port={free_port()} dbname=x", cwd=tmp_path)
    # As every command whose database does not answer: worth trying again later.
    assert result.returncode == 69 and "cannot connect to the Better Auth database" in result.stderr
    assert "try again once it answers" in result.stderr and "Traceback" not in result.stderr


def test_a_source_that_stops_answering_is_unavailable_one_that_refuses_is_not():
    lost = _source_error(psycopg2.OperationalError("server closed the connection unexpectedly"), "read")
    assert isinstance(lost, SourceUnavailable) and str(lost).startswith("cannot read the Better Auth database: server")
    refused = _source_error(psycopg2.ProgrammingError('relation "user" does not exist'), "read")
    assert not isinstance(refused, SourceUnavailable)


def test_a_picture_the_admin_api_would_refuse_is_left_out_and_reported():
    """An image of any size went into every ID token and UserInfo answer: a data: URL of megabytes."""
    images = {"shown": "https://cdn.example/a.png", "inline": "data:image/png;base64," + "A" * 3_000_000,
              "long": "https://cdn.example/" + "a" * 3000, "empty": "", "none": None}
    source = Source(
        users=[{"id": who, "email": f"{who}@example.com", "image": image} for who, image in images.items()],
        accounts=[{"userId": who, "providerId": "credential", "password": "0" * 32 + ":" + "0" * 128}
                  for who in images],
        clients=[], consents=[], refresh_tokens=[],
    )
    found = plan(source, now=1_800_000_000, provider="discord", cipher=None, secret_key=b"k" * 32)
    pictures = {user.sub: user.picture for user, _ in found.users}
    assert pictures == {"shown": images["shown"], "inline": None, "long": None, "empty": None, "none": None}
    assert sorted(found.problems) == [
        "user inline (inline@example.com): imported without a picture: its image is not an http(s) URL",
        "user long (long@example.com): imported without a picture: its image is over 2048 characters",
    ]


def test_a_client_is_imported_only_with_what_the_rules_of_every_client_allow():
    """An import stored redirect URIs unchecked: one a browser reads as another host got a victim's code."""
    source = Source(users=[], accounts=[], consents=[], refresh_tokens=[], clients=[
        {"clientId": "shop", "redirectUris": json.dumps(["https://shop.example/cb", "http://evil.example\\@127.0.0.1/cb",
                                                          "javascript:alert(1)"]),
         "postLogoutRedirectUris": ["https://shop.example/bye", "https://u:p@shop.example/"],
         "backchannelLogoutUri": "https://169.254.169.254/logout", "createdAt": None},
        {"clientId": "bad id", "redirectUris": ["https://x.example/cb"], "createdAt": None},
        {"clientId": "eu/shop", "redirectUris": ["https://x.example/cb"], "createdAt": None},
    ])
    found = plan(source, now=1_800_000_000, provider="discord", cipher=None, secret_key=b"k" * 32)
    [shop] = found.batch.clients
    assert shop.redirect_uris == ("https://shop.example/cb",)
    assert shop.post_logout_redirect_uris == ("https://shop.example/bye",)
    assert shop.backchannel_logout_uri is None
    assert sum(line.startswith("client shop:") for line in found.problems) == 4
    assert any("'bad id'" in line for line in found.problems) and any("'eu/shop'" in line for line in found.problems)


@pytest_twisted.ensureDeferred
async def test_a_discord_account_is_imported_for_one_user_only():
    """
    Better Auth let several users link one Discord account; here it links
    one, or their chat_user_id claims would name the same account.
    """
    store = MemoryStore()
    cipher = TokenCipher(key_from_text(new_key_text()))
    await store.link_account(LinkedAccount(
        account_id="here", sub="user-here", provider="discord", provider_user_id="111",
        access_token_enc=b"sealed", refresh_token_enc=None, scope="identify", expires_at=0, updated_at=0,
    ))
    made = datetime(2030, 1, 1, tzinfo=timezone.utc)

    def account(link_id, user, discord_id, updated):
        return {"id": link_id, "userId": user, "providerId": "discord", "accountId": discord_id,
                "accessToken": f"token-{link_id}", "updatedAt": made + timedelta(minutes=updated)}

    source = Source(
        users=[{"id": user, "email": f"{user}@example.com"} for user in ("user-a", "user-b", "user-c")],
        accounts=[account("older", "user-a", "222", 1), account("newer", "user-b", "222", 2),
                  account("elsewhere", "user-c", "111", 3)],
        clients=[], consents=[], refresh_tokens=[],
    )
    report = await import_better_auth(source, store=store, identity=None, cipher=cipher, provider="discord",
                                      now=1_800_000_000, dry_run=False, progress=lambda line: None, actor="test")

    assert (report.found["linked"], report.written["linked"]) == (2, 1)
    assert (await store.get_linked_account("user-b", "discord")).account_id == "newer"
    assert await store.get_linked_account("user-a", "discord") is None
    assert await store.get_linked_account("user-c", "discord") is None
    assert (await store.get_linked_account("user-here", "discord")).account_id == "here"
    linked_problems = [line for line in report.problems if "one chat account links one user" in line]
    assert len(linked_problems) == 2
    assert "link older of user user-a: discord account 222 is linked to user user-b too" in linked_problems[0]
    assert "link elsewhere of user user-c: discord account 111 is linked to another user here" in linked_problems[1]


def _client_row(client_id: str, **fields) -> dict:
    return {"clientId": client_id, "redirectUris": [f"https://{client_id}.example/cb"], "createdAt": None, **fields}


def test_a_private_key_jwt_client_keeps_its_keys_and_never_becomes_public():
    """
    Better Auth stores no secret for a private_key_jwt client: the import took
    it for a public one, so anyone knowing its client_id could use it, and
    spend its users' refresh tokens, without its key.
    """
    keys = json.dumps({"keys": [ec_key().export_public(as_dict=True)]})
    signed = {"tokenEndpointAuthMethod": "private_key_jwt", "clientSecret": None}
    source = Source(users=[], accounts=[], consents=[], refresh_tokens=[], clients=[
        _client_row("signer", jwks=keys, **signed),
        _client_row("fetched", jwksUri="https://fetched.example/jwks.json", **signed),
        _client_row("keyless", **signed),
        _client_row("inner", jwksUri="https://10.1.2.3/jwks.json", **signed),
        _client_row("private", jwks=json.dumps({"keys": [ec_key().export(as_dict=True)]}), **signed),
        _client_row("secretless", tokenEndpointAuthMethod="client_secret_basic", clientSecret=None),
        _client_row("exotic", tokenEndpointAuthMethod="tls_client_auth", clientSecret=None),
        _client_row("spa", tokenEndpointAuthMethod="none", clientSecret=None),
    ])
    found = plan(source, now=1_800_000_000, provider="discord", cipher=None, secret_key=b"k" * 32)
    clients = {client.client_id: client for client in found.batch.clients}
    assert set(clients) == {"signer", "fetched", "secretless", "spa"}, found.problems
    assert clients["signer"].token_endpoint_auth_method == "private_key_jwt" and clients["signer"].jwks == keys
    assert clients["fetched"].jwks_uri == "https://fetched.example/jwks.json"
    assert not clients["signer"].is_public and not clients["fetched"].is_public
    assert not clients["secretless"].is_public and clients["spa"].is_public
    for client_id in ("keyless", "inner", "private", "exotic", "secretless"):
        assert any(line.startswith(f"client {client_id}") for line in found.problems), client_id


def test_dpop_and_resource_bindings_carry_over():
    """
    The import dropped a refresh token's DPoP binding (so a stolen one worked
    without the key), a client's DPoP requirement and a grant's resources.
    """
    made = datetime(2030, 1, 1, tzinfo=timezone.utc)

    def token(token_id: str, **fields) -> dict:
        digest = base64.urlsafe_b64encode(bytes.fromhex(token_hash(token_id))).rstrip(b"=").decode()
        return {"id": token_id, "token": digest, "clientId": "app", "userId": "u1", "scopes": ["openid"],
                "createdAt": made, "expiresAt": made + timedelta(days=30), **fields}

    source = Source(
        users=[{"id": "u1", "email": "u1@example.com"}], accounts=[], consents=[],
        clients=[_client_row("app", tokenEndpointAuthMethod="none", dpopBoundAccessTokens=True)],
        refresh_tokens=[
            token("bound", confirmation={"jkt": "j" * 43}, resources=["https://api.example/"]),
            token("bound-text", confirmation=json.dumps({"jkt": "t" * 43})),
            token("mtls", confirmation={"x5t#S256": "x" * 43}),
            token("plain"),
        ],
    )
    found = plan(source, now=1_800_000_000, provider="discord", cipher=None, secret_key=b"k" * 32,
                 offer=Offer(dpop=True))
    [app] = found.batch.clients
    assert app.dpop_bound_access_tokens
    tokens = {t.grant_id.removeprefix("better-auth-"): t for t in found.batch.refresh_tokens}
    assert set(tokens) == {"bound", "bound-text", "plain"}
    assert (tokens["bound"].jkt, tokens["bound-text"].jkt, tokens["plain"].jkt) == ("j" * 43, "t" * 43, None)
    grants = {g.grant_id: g for g in found.batch.grants}
    assert grants["better-auth-bound"].resource == ("https://api.example/",)
    assert grants["better-auth-plain"].resource == ()
    assert app.resources == ("https://api.example/",), "so that its refresh tokens' access tokens are still for it"
    assert any(line.startswith("refresh token mtls") and "x5t#S256" in line for line in found.problems)

    # With [dpop] off nothing bound to a DPoP key could be used: it is reported, never imported unbound.
    off = plan(source, now=1_800_000_000, provider="discord", cipher=None, secret_key=b"k" * 32)
    assert not off.batch.clients and not off.batch.refresh_tokens
    assert any(line.startswith("client app: dpop_bound_access_tokens") for line in off.problems)
    unbound = Source(users=source.users, accounts=[], consents=[], clients=[_client_row("app")],
                     refresh_tokens=source.refresh_tokens)
    off = plan(unbound, now=1_800_000_000, provider="discord", cipher=None, secret_key=b"k" * 32)
    assert [t.grant_id for t in off.batch.refresh_tokens] == ["better-auth-plain"]
    assert sum(line.startswith("refresh token bound") for line in off.problems) == 2


@pytest.mark.parametrize(("table", "column"), [("user", "email"), ("account", "password"),
                                               ("oauthRefreshToken", "token"), ("oauthConsent", "clientId")])
@pytest_twisted.ensureDeferred
async def test_a_schema_without_a_column_the_import_reads_is_one_line(ba_dsn, tmp_path, table, column):
    """A schema whose columns were renamed (an adapter's snake_case) ended the import in a KeyError traceback."""
    with psycopg2.connect(ba_dsn) as db, db.cursor() as cursor:
        cursor.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{column}" TO renamed')
    (tmp_path / "users.toml").write_text("")
    config = write_config(tmp_path, new_key_text())
    result = await admin("--config", config, "import", "better-auth", "--dsn", ba_dsn, "--dry-run", cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert f'table "{table}" has no column "{column}"' in result.stderr, result.stderr


@pytest_twisted.ensureDeferred
async def test_clients_of_the_older_oidc_provider_plugin_are_a_problem_not_a_silence(ba_dsn, tmp_path):
    """
    A deployment on Better Auth's older oidcProvider plugin keeps its clients
    in oauthApplication: the import read no clients and said only, on
    standard error, that there was no OAuth provider plugin.
    """
    with psycopg2.connect(ba_dsn) as db, db.cursor() as cursor:
        cursor.execute('DROP TABLE "oauthClient", "oauthConsent", "oauthRefreshToken", "oauthAccessToken" CASCADE')
        cursor.execute('CREATE TABLE "oauthApplication" (id text PRIMARY KEY, "clientId" text, "clientSecret" text,'
                       ' "redirectURLs" text)')
        cursor.execute("""INSERT INTO "oauthApplication" VALUES ('a1', 'legacy-app', 'plain-secret',
                          'https://legacy.example/cb')""")
    (tmp_path / "users.toml").write_text("")
    config = write_config(tmp_path, new_key_text())
    report = await run_import(config, ba_dsn, tmp_path, "--dry-run")
    assert report["found"]["clients"] == 0
    [line] = [line for line in report["problems"] if "oauthApplication" in line]
    assert line.startswith("1 clients of Better Auth's older oidcProvider plugin") and "plain-secret" not in line
