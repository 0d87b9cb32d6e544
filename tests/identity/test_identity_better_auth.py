"""
The PostgreSQL identity backend in mode "better-auth", against a database
Better Auth itself made (tests/fixtures/better_auth): every user signs in
with the password Better Auth hashed, through a portal and through the real
login flow; bans (one in force, one expired) reach user-access; the Discord
links serve chat-token, refreshed and written back when expired.
"""

from __future__ import annotations

import json

import psycopg2
import pytest
import pytest_twisted

from authsrv.admin.common import plugin_context
from authsrv.chat.crypto import new_key_text
from authsrv.config import parse_config
from authsrv.configsection import ConfigError
from authsrv.context import PluginContext
from authsrv.identity import passwords
from authsrv.identity.errors import UnknownUser
from authsrv.identity.postgres import BetterAuthVerifier
from authsrv.interfaces import IChatLinkSource, IIdentityBackend
from authsrv.testing.fake_chat import FakeChatUser
from authsrv.testing.identity import INJECTION_LOGINS, portal_login, portal_login_fails
from better_auth_fixture import MADE_AT, MANIFEST, USERS, load
from flow_client import Browser, location, query_of
from harness import INTERNAL_SECRET, Harness
from identity.test_identity_postgres import execute, open_backend
from zope.interface.verify import verifyObject

INTERNAL = {"Authorization": f"Bearer {INTERNAL_SECRET}", "Content-Type": "application/json"}


@pytest.fixture
def ba_dsn(pg_dsn):
    load(pg_dsn)
    return pg_dsn


@pytest.fixture
def backend(ba_dsn, context):
    made = open_backend({"dsn": ba_dsn, "mode": "better-auth"}, context)
    yield made
    made.close()


def credential_hash(dsn: str, sub: str) -> str:
    [(value,)] = execute(
        dsn, """SELECT password FROM account WHERE "userId" = %s AND "providerId" = 'credential'""", (sub,)
    )
    return value


@pytest_twisted.ensureDeferred
async def test_every_user_signs_in_with_the_password_better_auth_hashed(backend, ba_dsn):
    assert verifyObject(IIdentityBackend, backend) and verifyObject(IChatLinkSource, backend)
    for who, user in USERS.items():
        before = credential_hash(ba_dsn, user["id"])
        avatar = await portal_login(backend, user["email"], user["password"])
        assert (avatar.sub, avatar.login, avatar.email, avatar.name) == (
            user["id"], user["email"], user["email"], user["name"]
        ), who
        # Better Auth must still verify it: side by side, the hash is never upgraded.
        assert credential_hash(ba_dsn, user["id"]) == before
    alice = await portal_login(backend, "ALICE@Example.COM", USERS["alice"]["password"])
    assert alice.sub == USERS["alice"]["id"]
    assert alice.chat_user_id == MANIFEST["discord"]["alice"]["accountId"]


@pytest_twisted.ensureDeferred
async def test_wrong_passwords_and_unknown_logins(backend):
    alice = USERS["alice"]
    for password in ("wrong", "", USERS["bob"]["password"], alice["password"].upper(), alice["password"] + " "):
        failure = await portal_login_fails(backend, alice["email"], password)
        assert not isinstance(failure, UnknownUser), password
    for login in ("nobody@example.com", "", "alice", alice["id"], *INJECTION_LOGINS):
        failure = await portal_login_fails(backend, login, alice["password"])
        assert isinstance(failure, UnknownUser), login
        assert await backend.user_by_login(login) is None, login
    for sub in ("", "*", "' OR 1=1 --", alice["id"].upper(), "nobody"):
        assert await backend.user_by_id(sub) is None, sub


@pytest_twisted.ensureDeferred
async def test_bans_in_force_and_expired(backend, ba_dsn):
    dave = await backend.user_by_id(USERS["dave"]["id"])
    assert dave.disabled and dave.disabled_reason == MANIFEST["banned"]["dave"]
    erin = await backend.user_by_login(USERS["erin"]["email"])
    assert not erin.disabled and erin.disabled_reason is None
    execute(ba_dsn, """UPDATE "user" SET "banExpires" = now() + interval '1 hour' WHERE id = %s""",
            (USERS["erin"]["id"],))
    erin = await backend.user_by_id(USERS["erin"]["id"])
    assert erin.disabled and erin.disabled_reason == MANIFEST["expired_ban"]["erin"]


def test_a_database_without_better_auth_tables_is_refused(pg_dsn, context):
    with pytest.raises(ConfigError, match="is not a Better Auth database"):
        open_backend({"dsn": pg_dsn, "mode": "better-auth"}, context)


def test_mapped_queries_are_refused(ba_dsn, context):
    with pytest.raises(ConfigError, match='mode "better-auth" knows its tables'):
        open_backend({"dsn": ba_dsn, "mode": "better-auth", "user_by_id": "SELECT 1"}, context)


@pytest_twisted.ensureDeferred
async def test_chat_link_and_compare_and_swap(backend, ba_dsn):
    alice = MANIFEST["discord"]["alice"]
    link = await backend.chat_link(USERS["alice"]["id"], "discord")
    assert (link.provider_user_id, link.access_token, link.refresh_token) == (
        alice["accountId"], alice["accessToken"], alice["refreshToken"]
    )
    assert link.scope == "identify email guilds.join"
    assert "accessToken" not in repr(link) and alice["accessToken"] not in repr(link)
    assert await backend.chat_link(USERS["carol"]["id"], "discord") is None
    assert await backend.chat_link(USERS["alice"]["id"], "slack") is None
    assert await backend.save_chat_tokens(link.link_id, link.version, "new", None, "identify", MADE_AT + 60)
    assert not await backend.save_chat_tokens(link.link_id, link.version, "lost", "lost", "identify", 1)
    [(access, refresh, scope)] = execute(
        ba_dsn, """SELECT "accessToken", "refreshToken", scope FROM account WHERE id = %s""", (link.link_id,)
    )
    assert (access, refresh, scope) == ("new", alice["refreshToken"], "identify")


@pytest_twisted.ensureDeferred
async def test_chat_user_id_follows_the_configured_chat_provider(ba_dsn, reactor, tmp_path):
    """chat_user_id read the "discord" rows whatever [chat] provider named, so it disagreed with chat-token."""
    execute(ba_dsn, """UPDATE account SET "providerId" = 'chatplat' WHERE "providerId" = 'discord'""")
    context = PluginContext(reactor, tmp_path, link_provider="chatplat")
    backend = open_backend({"dsn": ba_dsn, "mode": "better-auth"}, context)
    try:
        alice = await backend.user_by_id(USERS["alice"]["id"])
        assert alice.chat_user_id == MANIFEST["discord"]["alice"]["accountId"]
        assert (await backend.chat_link(alice.sub, "chatplat")).provider_user_id == alice.chat_user_id
        assert (await backend.user_by_login(alice.login)).chat_user_id == alice.chat_user_id
    finally:
        backend.close()
        context.stop()


@pytest_twisted.ensureDeferred
async def test_the_operator_command_builds_plugins_with_the_chat_provider(reactor, tmp_path, monkeypatch):
    monkeypatch.setenv("CHAT_KEY", new_key_text())
    config = parse_config({"chat": {"provider": "chatplat", "encryption_key_env": "CHAT_KEY"}}, tmp_path / "a.toml")
    async with plugin_context(reactor, config) as context:
        assert context.link_provider == "chatplat"
    async with plugin_context(reactor, parse_config({}, tmp_path / "a.toml")) as context:
        assert context.link_provider is None


# --- through the service --------------------------------------------------------


@pytest.fixture
def server(ba_dsn, context, tmp_path, monkeypatch):
    identity = open_backend({"dsn": ba_dsn, "mode": "better-auth"}, context)
    return Harness(tmp_path, monkeypatch, identity=identity, start=MADE_AT + 60)


async def internal(h, path: str, sub: str):
    response, raw = await h.request("POST", f"/api/internal/{path}", data=json.dumps({"userId": sub}).encode(),
                                    headers=INTERNAL)
    return response.code, json.loads(raw)


@pytest_twisted.ensureDeferred
async def test_login_flow_bans_and_chat_tokens(server, ba_dsn):
    h = await server.start()
    try:
        for who in ("alice", "bob", "carol", "erin", "admin"):
            user = USERS[who]
            browser = Browser(h)
            response, _ = await browser.authorize("first")
            response, body = await browser.submit_login(response, user["email"], user["password"])
            assert response.code in (302, 303), (who, body)
            assert "code" in query_of(location(response)), who
        browser = Browser(h)
        response, _ = await browser.authorize("first")
        response, body = await browser.submit_login(response, USERS["dave"]["email"], USERS["dave"]["password"])
        assert response.code == 403 and b"suspended" in body, (response.code, body)

        code, answer = await internal(h, "user-access", USERS["dave"]["id"])
        assert code == 200 and answer["banned"] is True and answer["allowed"] is False
        assert answer["banReason"] == MANIFEST["banned"]["dave"]
        code, answer = await internal(h, "user-access", USERS["erin"]["id"])
        assert code == 200 and answer["banned"] is False and answer["banReason"] is None

        alice = MANIFEST["discord"]["alice"]
        code, answer = await internal(h, "chat-token", USERS["alice"]["id"])
        assert code == 200, answer
        assert answer["accessToken"] == alice["accessToken"]
        [(record_id,)] = execute(ba_dsn, """SELECT id FROM account WHERE "accountId" = %s""", (alice["accountId"],))
        assert answer["accountId"] == record_id
        assert set(answer["scope"].split()) == {"identify", "email", "guilds.join"}
        assert h.chat_fake.refreshes == 0

        # Bob's token expired before the move: refreshed at the platform, written back for Better Auth.
        bob = MANIFEST["discord"]["bob"]
        h.chat_fake.honour_refresh_token(bob["refreshToken"], FakeChatUser(bob["accountId"], "bob"))
        code, answer = await internal(h, "chat-token", USERS["bob"]["id"])
        assert code == 200, answer
        assert h.chat_fake.refreshes == 1 and h.chat_fake.access_valid(answer["accessToken"])
        [(access, refresh, expires)] = execute(
            ba_dsn, """SELECT "accessToken", "refreshToken", extract(epoch FROM "accessTokenExpiresAt")::bigint
                       FROM account WHERE "accountId" = %s""", (bob["accountId"],),
        )
        assert access == answer["accessToken"] and refresh != bob["refreshToken"]
        assert expires == h.now() + h.chat_fake.expires_in
        code, again = await internal(h, "chat-token", USERS["bob"]["id"])
        assert code == 200 and again["accessToken"] == access and h.chat_fake.refreshes == 1

        code, answer = await internal(h, "chat-token", USERS["carol"]["id"])
        assert code == 404 and answer["error"] == "chat_not_linked"
    finally:
        await h.close()


def test_the_fixture_was_made_by_better_auth(ba_dsn):
    """The dump holds what the manifest says, in Better Auth's own shapes."""
    rows = execute(ba_dsn, """SELECT id, email, banned FROM "user" ORDER BY email""")
    assert {r[0] for r in rows} == {u["id"] for u in USERS.values()}
    [(password,)] = execute(
        ba_dsn, """SELECT password FROM account WHERE "userId" = %s AND "providerId" = 'credential'""",
        (USERS["alice"]["id"],),
    )
    salt, key = password.split(":")
    assert len(salt) == 32 and len(key) == 128
    with pytest.raises(psycopg2.Error):
        execute(ba_dsn, "SELECT * FROM identity_users")


@pytest_twisted.ensureDeferred
async def test_unknown_logins_cost_a_scrypt_check(backend, monkeypatch):
    """Every user's hash stays scrypt in this mode, so an unknown login is checked against scrypt too."""
    checked = []
    real = passwords.check_better_auth_hash
    monkeypatch.setattr(passwords, "check_better_auth_hash", lambda *a: checked.append(a[1]) or real(*a))
    await portal_login_fails(backend, "nobody@example.com", "some password")
    await portal_login_fails(backend, USERS["alice"]["email"], "some password")
    assert len(checked) == 2 and checked[0] == BetterAuthVerifier.DUMMY and checked[1] != checked[0]
    failure = await portal_login_fails(backend, "nobody@example.com", BetterAuthVerifier.DUMMY)
    assert isinstance(failure, UnknownUser)


@pytest_twisted.ensureDeferred
async def test_bytes_credentials(backend):
    carol = USERS["carol"]
    avatar = await portal_login(backend, carol["email"].encode(), carol["password"].encode("utf-8"))
    assert avatar.sub == carol["id"]
