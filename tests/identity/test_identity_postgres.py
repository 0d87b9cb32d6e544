"""
The PostgreSQL identity backend: the conformance suite in both modes (the
project's own table, and an operator's table mapped by queries), bcrypt
hashes and their upgrade to argon2id, checking mapped queries on start,
outages, and the operator command in own mode.
"""

from __future__ import annotations

import json
import socket
import threading

import bcrypt
import psycopg2
import pytest
import pytest_twisted
from argon2 import PasswordHasher, extract_parameters, profiles
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread
from twisted.logger import LogLevel, capturedLogs, formatEvent

from authsrv.configsection import ConfigError, Section
from authsrv.context import PluginContext
from authsrv.identity import postgres
from authsrv.identity.chain import IdentityChain
from authsrv.identity.errors import BackendUnavailable, UnknownUser
from authsrv.identity.passwords import hash_password, is_argon2id_hash
from authsrv.pg.pool import host_lookups
from authsrv.pg.settings import read_settings
from authsrv.plugins import factories
from authsrv.records import User
from authsrv.interfaces import IUserManagement
from authsrv.testing.identity import (
    ALICE,
    BOB,
    PASSWORDS,
    IdentityBackendConformance,
    UserManagementConformance,
    portal_login_fails,
    seed_users,
)

from conftest import admin, free_port

CHEAP = PasswordHasher.from_parameters(profiles.CHEAPEST)

STAFF_TABLE = """
CREATE TABLE staff (
    id serial PRIMARY KEY,
    uuid text NOT NULL UNIQUE,
    username text NOT NULL,
    pw text,
    full_name text,
    avatar text,
    mail varchar(200),
    mail_ok boolean,
    locked_at timestamptz,
    lock_reason text,
    discord text
)
"""

STAFF_COLUMNS = (
    "uuid AS sub, username AS login, pw AS password_hash, full_name AS name, avatar AS picture,"
    " mail AS email, coalesce(mail_ok, false) AS email_verified, locked_at IS NOT NULL AS disabled,"
    " lock_reason AS disabled_reason, discord AS chat_user_id"
)

MAPPED = {
    "mode": "mapped",
    "user_by_login": f"SELECT {STAFF_COLUMNS} FROM staff WHERE lower(username) = lower(%(login)s)",
    "user_by_id": f"SELECT {STAFF_COLUMNS} FROM staff WHERE uuid = %(sub)s",
    "update_password_hash": (
        "UPDATE staff SET pw = %(password_hash)s WHERE uuid = %(sub)s AND pw = %(old_password_hash)s"
    ),
}


def bcrypt_hash(password: str, prefix: str = "$2b$") -> str:
    made = bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()
    return prefix + made[4:]


def execute(dsn: str, statement: str, parameters=()) -> list[tuple]:
    connection = psycopg2.connect(dsn)
    connection.autocommit = True
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement, parameters)
            return cursor.fetchall() if cursor.description else []
    finally:
        connection.close()


def seed_staff(dsn: str, users, hashes=None) -> None:
    execute(dsn, STAFF_TABLE)
    for user, password in users:
        password_hash = (hashes or {}).get(user.sub) or hash_password(password, CHEAP)
        execute(
            dsn,
            "INSERT INTO staff (uuid, username, pw, full_name, avatar, mail, mail_ok, locked_at,"
            " lock_reason, discord) VALUES (%s, %s, %s, %s, %s, %s, %s,"
            " CASE WHEN %s THEN now() END, %s, %s)",
            (user.sub, user.login, password_hash, user.name, user.picture, user.email,
             user.email_verified if user.email else None, user.disabled, user.disabled_reason,
             user.chat_user_id),
        )


def stored_hash(dsn: str, table: str, sub: str) -> str:
    column, key = ("password_hash", "sub") if table == "identity_users" else ("pw", "uuid")
    [(value,)] = execute(dsn, f"SELECT {column} FROM {table} WHERE {key} = %s", (sub,))
    return value


@pytest.fixture
def backends():
    """Backends a test opens; closed after it."""
    made: list = []
    yield made
    for backend in made:
        backend.close()


def direct_backend(dsn: str, context, verifier, *, connect_timeout=5):
    """An own-mode backend over a schema that exists, with a verifier of the test's own."""
    section = Section({"dsn": dsn, "connect_timeout": connect_timeout}, "identity[0]", None)
    settings = read_settings(section, "authsrv-identity")
    pool = postgres.connection_pool(context.reactor, settings, 2, lookups(context))
    return postgres.PostgresIdentityBackend(pool, verifier, postgres.OWN_QUERIES, "own")


def lookups(context):
    return host_lookups(context, 2)


def cheap_verifier(context):
    return postgres.MigratingVerifier(context.reactor, context.threadpool("passwords", 2), CHEAP)


def open_backend(config: dict, context, backends=None):
    backend = postgres.build(Section(dict(config), "identity[0]", context.base_dir), context, CHEAP)
    if backends is not None:
        backends.append(backend)
    return backend


async def add_users(backend, users) -> None:
    for user, password in users:
        await backend.add_user(user, hash_password(password, CHEAP))


async def login(backend, username, password) -> str:
    return await backend.requestAvatarId(UsernamePassword(username, password))


class TestOwnConformance(IdentityBackendConformance):
    @pytest.fixture(autouse=True)
    def _setup(self, pg_dsn, context):
        self.dsn = pg_dsn
        self.context = context

    def make_backend(self, users):
        backend = open_backend({"dsn": self.dsn}, self.context)
        return Deferred.fromCoroutine(add_users(backend, users)).addCallback(lambda _: backend)


class TestOwnUserManagement(UserManagementConformance):
    @pytest.fixture(autouse=True)
    def _setup(self, pg_dsn, context):
        self.dsn = pg_dsn
        self.context = context

    def make_backend(self):
        return open_backend({"dsn": self.dsn}, self.context)


class TestMappedConformance(IdentityBackendConformance):
    """An operator's table, with Bob's password still a bcrypt hash from an older system."""

    @pytest.fixture(autouse=True)
    def _setup(self, pg_dsn, context):
        self.dsn = pg_dsn
        self.context = context

    def make_backend(self, users):
        seed_staff(self.dsn, users, {BOB.sub: bcrypt_hash(PASSWORDS[BOB.sub])})
        return open_backend({"dsn": self.dsn, **MAPPED}, self.context)


# --- passwords ----------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["$2a$", "$2b$", "$2y$"])
@pytest_twisted.ensureDeferred
async def test_bcrypt_accepted_and_upgraded_in_own_mode(pg_dsn, context, backends, prefix):
    backend = open_backend({"dsn": pg_dsn}, context, backends)
    await add_users(backend, seed_users())
    old = bcrypt_hash(PASSWORDS[ALICE.sub], prefix)
    execute(pg_dsn, "UPDATE identity_users SET password_hash = %s WHERE sub = %s", (old, ALICE.sub))

    with pytest.raises(UnauthorizedLogin) as failure:
        await login(backend, "alice", "wrong")
    assert not isinstance(failure.value, UnknownUser)
    assert stored_hash(pg_dsn, "identity_users", ALICE.sub) == old

    with capturedLogs() as events:
        assert await login(backend, "ALICE", PASSWORDS[ALICE.sub]) == ALICE.sub
    upgraded = stored_hash(pg_dsn, "identity_users", ALICE.sub)
    assert is_argon2id_hash(upgraded)
    assert CHEAP.verify(upgraded, PASSWORDS[ALICE.sub])
    text = " ".join(formatEvent(e) for e in events)
    assert "upgraded" in text
    assert old not in text and upgraded not in text and PASSWORDS[ALICE.sub] not in text

    assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub
    with pytest.raises(UnauthorizedLogin):
        await login(backend, "alice", "wrong")


@pytest_twisted.ensureDeferred
async def test_bcrypt_in_mapped_mode_upgraded_only_with_an_update_query(pg_dsn, context, backends):
    old = bcrypt_hash(PASSWORDS[ALICE.sub])
    seed_staff(pg_dsn, seed_users(), {ALICE.sub: old})
    read_only = {k: v for k, v in MAPPED.items() if k != "update_password_hash"}
    backend = open_backend({"dsn": pg_dsn, **read_only}, context, backends)
    assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub
    assert stored_hash(pg_dsn, "staff", ALICE.sub) == old

    backend = open_backend({"dsn": pg_dsn, **MAPPED}, context, backends)
    assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub
    assert is_argon2id_hash(stored_hash(pg_dsn, "staff", ALICE.sub))
    assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub


@pytest_twisted.ensureDeferred
async def test_upgrade_never_overwrites_a_hash_changed_meanwhile(pg_dsn, reactor, context, backends):
    await add_users(open_backend({"dsn": pg_dsn}, context, backends), [(ALICE, PASSWORDS[ALICE.sub])])
    old = bcrypt_hash(PASSWORDS[ALICE.sub])
    execute(pg_dsn, "UPDATE identity_users SET password_hash = %s WHERE sub = %s", (old, ALICE.sub))
    changed = hash_password("changed by the operator", CHEAP)

    class OperatorMeanwhile(postgres.MigratingVerifier):
        def rehash(self, password):
            execute(pg_dsn, "UPDATE identity_users SET password_hash = %s WHERE sub = %s", (changed, ALICE.sub))
            return super().rehash(password)

    backend = direct_backend(pg_dsn, context, OperatorMeanwhile(reactor, context.threadpool("passwords", 2), CHEAP))
    backends.append(backend)
    assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub
    assert stored_hash(pg_dsn, "identity_users", ALICE.sub) == changed


@pytest_twisted.ensureDeferred
async def test_bcrypt_long_password_checked_as_its_maker_did(pg_dsn, context, backends):
    backend = open_backend({"dsn": pg_dsn}, context, backends)
    await add_users(backend, [(ALICE, PASSWORDS[ALICE.sub])])
    long_password = "ä" * 50
    made = bcrypt.hashpw(long_password.encode()[:72], bcrypt.gensalt(4)).decode()
    execute(pg_dsn, "UPDATE identity_users SET password_hash = %s WHERE sub = %s", (made, ALICE.sub))
    assert await login(backend, "alice", long_password) == ALICE.sub
    assert CHEAP.verify(stored_hash(pg_dsn, "identity_users", ALICE.sub), long_password)


@pytest.mark.parametrize("damage", [lambda h: h[:-1] + "é", lambda h: h.replace("m=8,", "m=٨,"), lambda h: ""],
                         ids=["non-ascii", "non-ascii-digit", "empty"])
@pytest_twisted.ensureDeferred
async def test_a_damaged_hash_is_a_logged_wrong_password_not_an_outage(pg_dsn, context, backends, damage):
    backend = open_backend({"dsn": pg_dsn}, context, backends)
    await add_users(backend, [(ALICE, PASSWORDS[ALICE.sub])])
    damaged = damage(stored_hash(pg_dsn, "identity_users", ALICE.sub))
    execute(pg_dsn, "UPDATE identity_users SET password_hash = %s WHERE sub = %s", (damaged, ALICE.sub))
    with capturedLogs() as events:
        failure = await portal_login_fails(IdentityChain([backend]), "alice", PASSWORDS[ALICE.sub])
    assert type(failure) is UnauthorizedLogin
    assert "stored password hash of 'alice' is malformed" in [formatEvent(e) for e in events]
    assert stored_hash(pg_dsn, "identity_users", ALICE.sub) == damaged


@pytest_twisted.ensureDeferred
async def test_password_checks_run_off_the_reactor_thread(pg_dsn, context, backends, monkeypatch):
    backend = open_backend({"dsn": pg_dsn}, context, backends)
    await add_users(backend, [(ALICE, PASSWORDS[ALICE.sub])])
    execute(pg_dsn, "UPDATE identity_users SET password_hash = %s", (bcrypt_hash(PASSWORDS[ALICE.sub]),))
    threads = []
    check = postgres.MigratingVerifier._check

    def recording(self, password, stored):
        threads.append(threading.current_thread())
        return check(self, password, stored)

    monkeypatch.setattr(postgres.MigratingVerifier, "_check", recording)
    await login(backend, "alice", PASSWORDS[ALICE.sub])
    with pytest.raises(UnknownUser):
        await login(backend, "nobody", "x")
    assert len(threads) == 2 and threading.main_thread() not in threads


# --- logins no user can have ------------------------------------------------


@pytest.mark.parametrize("mode", ["own", "mapped"])
@pytest_twisted.ensureDeferred
async def test_nul_and_undecodable_logins_are_unknown(pg_dsn, context, backends, mode):
    if mode == "own":
        backend = open_backend({"dsn": pg_dsn}, context, backends)
        await add_users(backend, seed_users())
    else:
        seed_staff(pg_dsn, seed_users())
        backend = open_backend({"dsn": pg_dsn, **MAPPED}, context, backends)
    for bad in ("alice\x00", "\x00", "al\x00ice", b"alic\xe9", "alice\ud800"):
        with pytest.raises(UnknownUser):
            await login(backend, bad, PASSWORDS[ALICE.sub])
        assert await backend.user_by_login(bad) is None
    assert await backend.user_by_id(ALICE.sub + "\x00") is None
    assert await backend.user_by_id("\ud800") is None
    assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub


# --- checking mapped queries on start ---------------------------------------


@pytest.mark.parametrize(
    "change, key, message",
    [
        ({"user_by_login": f"SELECT {STAFF_COLUMNS} FROM staff"}, "user_by_login",
         "must use %(login)s or %(login_key)s"),
        ({"user_by_id": f"SELECT {STAFF_COLUMNS} FROM staff WHERE uuid = %(id)s"}, "user_by_id",
         "must use %(sub)s"),
        ({"user_by_id": f"SELECT {STAFF_COLUMNS} FROM staff WHERE uuid = %(sub)s OR username = %(login)s"},
         "user_by_id", "uses %(login)s, which it does not get; its parameters are %(sub)s"),
        ({"user_by_login": f"SELEC {STAFF_COLUMNS} FROM staff WHERE username = %(login)s"}, "user_by_login",
         'does not run: syntax error at or near "SELEC"'),
        ({"user_by_login": f"SELECT {STAFF_COLUMNS} FROM staf WHERE username = %(login)s"}, "user_by_login",
         'does not run: relation "staf" does not exist'),
        ({"user_by_login": "SELECT uuid AS sub, username AS login, pw AS password_hash, mail AS emial"
                           " FROM staff WHERE username = %(login)s"}, "user_by_login",
         "returns a column 'emial'; name each one of: sub, login, password_hash"),
        ({"user_by_login": "SELECT uuid AS sub, username AS login FROM staff WHERE username = %(login)s"},
         "user_by_login", "must return a column named password_hash (... AS password_hash)"),
        ({"user_by_id": "SELECT uuid AS sub, full_name AS name FROM staff WHERE uuid = %(sub)s"},
         "user_by_id", "must return a column named login (... AS login)"),
        ({"user_by_id": "SELECT id AS sub, username AS login FROM staff WHERE uuid = %(sub)s"},
         "user_by_id", "column sub must be text, not int4 (cast it: ...::text AS sub)"),
        ({"user_by_id": "SELECT uuid AS sub, username AS login, mail AS email_verified FROM staff"
                        " WHERE uuid = %(sub)s"}, "user_by_id", "column email_verified must be a boolean, not varchar"),
        ({"user_by_id": "SELECT uuid AS sub, username AS login FROM staff WHERE id = %(sub)s"}, "user_by_id",
         "does not run: invalid input syntax for type integer"),
        ({"user_by_login": f"SELECT {STAFF_COLUMNS} FROM staff WHERE username LIKE 'a%' || %(login)s"},
         "user_by_login", "cannot take its parameters: write them %(name)s, and a literal % as %%"),
        ({"user_by_login": f"WITH gone AS (DELETE FROM staff RETURNING uuid) SELECT {STAFF_COLUMNS}"
                           " FROM staff WHERE username = %(login)s"}, "user_by_login",
         "in a read-only transaction"),
        ({"user_by_login": "UPDATE staff SET pw = 'x' WHERE username = %(login)s"}, "user_by_login",
         "does not run: cannot execute UPDATE in a read-only transaction"),
        ({"update_password_hash": "UPDATE staff SET passwd = %(password_hash)s WHERE uuid = %(sub)s"
                                  " AND pw = %(old_password_hash)s"},
         "update_password_hash", 'does not run: column "passwd" of relation "staff" does not exist'),
        ({"update_password_hash": "UPDATE staff SET pw = 'x' WHERE uuid = %(sub)s"},
         "update_password_hash", "must use %(password_hash)s"),
        ({"update_password_hash": "UPDATE staff SET pw = %(password_hash)s WHERE uuid = %(sub)s"},
         "update_password_hash", "must use %(old_password_hash)s (... AND pw = %(old_password_hash)s), so that"
         " a password changed while a login upgrades its hash is not set back"),
        ({"user_by_id": None}, "user_by_id", "is required"),
    ],
)
def test_mapped_queries_checked_on_start(pg_dsn, context, change, key, message):
    seed_staff(pg_dsn, [])
    config = {"dsn": pg_dsn, **MAPPED, **change}
    config = {k: v for k, v in config.items() if v is not None}
    with pytest.raises(ConfigError) as raised:
        open_backend(config, context)
    assert raised.value.key == f"identity[0].{key}"
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert execute(pg_dsn, "SELECT count(*) FROM staff") == [(0,)]


def test_mapped_query_too_slow_on_start(pg_dsn, context):
    seed_staff(pg_dsn, [(ALICE, PASSWORDS[ALICE.sub])])
    slow = f"SELECT {STAFF_COLUMNS} FROM staff WHERE username = %(login)s OR pg_sleep(3) IS NULL"
    with pytest.raises(ConfigError) as raised:
        open_backend({"dsn": pg_dsn, **MAPPED, "user_by_login": slow, "statement_timeout": 1}, context)
    assert str(raised.value) == "identity[0].user_by_login: did not finish within statement_timeout"


@pytest_twisted.ensureDeferred
async def test_read_only_pool_refuses_writes(pg_dsn, reactor, context):
    seed_staff(pg_dsn, seed_users())
    settings = read_settings(Section({"dsn": pg_dsn}, "identity[0]", None), "test")

    def write(connection):
        return connection.cursor().execute("DELETE FROM staff")

    read_only = postgres.connection_pool(reactor, settings, 1, lookups(context), read_only=True)
    with pytest.raises(BackendUnavailable, match="cannot execute DELETE in a read-only transaction"):
        await read_only.run(write, "delete")
    read_only.close()
    assert execute(pg_dsn, "SELECT count(*) FROM staff") == [(4,)]
    writable = postgres.connection_pool(reactor, settings, 1, lookups(context))
    await writable.run(write, "delete")
    writable.close()
    assert execute(pg_dsn, "SELECT count(*) FROM staff") == [(0,)]


@pytest.mark.parametrize(
    "config, key, message",
    [
        ({}, "dsn", "is required (or dsn_env, dsn_file when it holds a password)"),
        ({"dsn": "host=db password=s3cret"}, "dsn", "holds a password: put the DSN in dsn_env or dsn_file"),
        ({"dsn": "postgresql://app:s3cret@db/users"}, "dsn", "holds a password"),
        ({"dsn": "host=db", "dsn_file": "x"}, "dsn_file", "give one of dsn, dsn_env, dsn_file"),
        ({"dsn": "host=db s3cret"}, "dsn", "is not a libpq connection string or postgresql:// URI"),
        ({"dsn_env": "AUTHSRV_NO_SUCH_VARIABLE"}, "dsn_env", "is not set or empty"),
        ({"dsn": "host=db", "mode": "ldap"}, "mode", "must be one of 'own', 'mapped'"),
        ({"dsn": "host=db", "pool_size": 0}, "pool_size", "must be at least 1"),
        ({"dsn": "host=db", "connect_timeout": 0}, "connect_timeout", "must be at least 1s"),
        ({"dsn": "host=db", "user_by_login": "SELECT 1"}, "user_by_login", 'is for mode = "mapped"'),
        ({"dsn": "host=db", "mode": "mapped", "user_by_id": "SELECT 1"}, "user_by_login", "is required"),
        ({"dsn": "host=db", "table": "users"}, "table", "unknown key"),
    ],
)
def test_config_errors(context, config, key, message):
    with pytest.raises(ConfigError) as raised:
        postgres.from_config(Section(config, "identity[0]", context.base_dir), context)
    assert raised.value.key == f"identity[0].{key}"
    assert message in str(raised.value)
    assert "s3cret" not in str(raised.value)


@pytest_twisted.ensureDeferred
async def test_dsn_from_a_file_or_the_environment(pg_dsn, context, backends, tmp_path, monkeypatch):
    (tmp_path / "dsn").write_text(pg_dsn + " password=s3cret\n")
    from_file = open_backend({"dsn_file": "dsn"}, context, backends)
    await add_users(from_file, [(ALICE, PASSWORDS[ALICE.sub])])
    monkeypatch.setenv("IDENTITY_DSN", pg_dsn)
    from_environment = open_backend({"dsn_env": "IDENTITY_DSN"}, context, backends)
    assert await from_environment.user_by_login("alice") == ALICE
    settings = read_settings(Section({"dsn_file": "dsn"}, "identity[0]", tmp_path), "x")
    assert "s3cret" not in repr(settings)


def test_the_dropin_ships_it(pg_dsn, context, backends):
    factory = factories("identity")["postgres"]
    backend = factory.from_config(Section({"dsn": pg_dsn}, "identity[0]", context.base_dir), context)
    backends.append(backend)
    assert backend.mode == "own"


# --- own-mode schema ----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_instances_starting_together_migrate_once(pg_dsn, context, backends):
    opened = await gatherResults([deferToThread(open_backend, {"dsn": pg_dsn}, context) for _ in range(4)])
    backends.extend(opened)
    assert execute(pg_dsn, "SELECT version FROM identity_schema_version") == [(1,)]
    await add_users(opened[0], [(ALICE, PASSWORDS[ALICE.sub])])
    assert await opened[3].user_by_login("alice") == ALICE


def test_schema_newer_than_the_code_refused(pg_dsn, context, backends):
    backends.append(open_backend({"dsn": pg_dsn}, context))
    execute(pg_dsn, "INSERT INTO identity_schema_version (version) VALUES (999)")
    with pytest.raises(ConfigError) as raised:
        open_backend({"dsn": pg_dsn}, context)
    assert raised.value.key == "identity[0].dsn"
    assert "newer than this authsrv knows" in str(raised.value)


def test_a_step_that_fails_is_one_line_and_changes_nothing(pg_dsn, context):
    """A table of that name already in the database (not authsrv's) stopped the start with a traceback."""
    execute(pg_dsn, "CREATE TABLE identity_users (id integer)")
    with pytest.raises(ConfigError) as raised:
        open_backend({"dsn": pg_dsn}, context)
    assert raised.value.key == "identity[0].dsn"
    assert raised.value.problem == (
        "its identity schema step 001_users.sql failed: relation \"identity_users\" already exists;"
        " the schema stays at version 0"
    )
    assert execute(pg_dsn, "SELECT to_regclass('identity_schema_version')") == [(None,)]


def test_check_only_creates_nothing(pg_dsn, reactor, tmp_path):
    context = PluginContext(reactor, tmp_path, check_only=True)
    try:
        assert postgres.from_config(Section({"dsn": pg_dsn}, "identity[0]", tmp_path), context) is None
        unreachable = f"host=127.0.0.1 port={free_port()}"
        assert postgres.from_config(Section({"dsn": unreachable}, "identity[0]", tmp_path), context) is None
        seed_staff(pg_dsn, [])
        section = Section({"dsn": pg_dsn, **MAPPED, "user_by_id": "SELECT 1"}, "identity[0]", tmp_path)
        with pytest.raises(ConfigError, match="user_by_id: must use"):
            postgres.from_config(section, context)
    finally:
        context.stop()
    assert execute(pg_dsn, "SELECT to_regclass('identity_users')") == [(None,)]


@pytest_twisted.ensureDeferred
async def test_add_user_refuses_what_the_table_cannot_hold(pg_dsn, context, backends):
    backend = open_backend({"dsn": pg_dsn}, context, backends)
    good = hash_password("pw", CHEAP)
    for user, message in [
        (User(sub="é", login="carol"), "sub must be 1 to 255 printable ASCII characters"),
        (User(sub="carol", login="car\x00ol"), "login must be non-empty text"),
    ]:
        with pytest.raises(ValueError, match="^" + message.replace("(", r"\(")):
            await backend.add_user(user, good)
    with pytest.raises(ValueError, match="^password_hash must be an argon2id hash"):
        await backend.add_user(User(sub="carol", login="carol"), bcrypt_hash("pw"))
    assert await backend.list_users() == []


def test_mapped_mode_is_not_managed_here(pg_dsn, context, backends):
    seed_staff(pg_dsn, [])
    mapped = open_backend({"dsn": pg_dsn, **MAPPED}, context, backends)
    own = open_backend({"dsn": pg_dsn}, context, backends)
    assert not IUserManagement.providedBy(mapped) and IUserManagement.providedBy(own)


@pytest_twisted.ensureDeferred
async def test_a_login_matching_two_rows_is_an_outage_not_a_user(pg_dsn, context, backends):
    seed_staff(pg_dsn, [(ALICE, PASSWORDS[ALICE.sub])])
    execute(pg_dsn, "INSERT INTO staff (uuid, username, pw) VALUES ('x', 'Alice', 'x')")
    backend = open_backend({"dsn": pg_dsn, **MAPPED}, context, backends)
    with capturedLogs() as events:
        with pytest.raises(BackendUnavailable):
            await login(backend, "alice", PASSWORDS[ALICE.sub])
    assert any("found 2 users for one login" in formatEvent(e) for e in events)


@pytest.mark.parametrize("sub", ["zoë-1", "a" * 256, "carol\nsub=admin"], ids=["non-ascii", "too-long", "newline"])
@pytest_twisted.ensureDeferred
async def test_a_row_whose_sub_no_token_may_carry_is_no_user(pg_dsn, context, backends, sub):
    """
    OIDC Core 2: a sub is at most 255 ASCII characters. A mapped table's own
    ids may be anything; a row with one that is not printable ASCII, or too
    long, is logged and no one, as the other backends treat such a record.
    """
    seed_staff(pg_dsn, [(ALICE, PASSWORDS[ALICE.sub])])
    execute(pg_dsn, "UPDATE staff SET uuid = %s", (sub,))
    backend = open_backend({"dsn": pg_dsn, **MAPPED}, context, backends)
    with capturedLogs() as events:
        failure = await portal_login_fails(IdentityChain([backend]), "alice", PASSWORDS[ALICE.sub])
        assert await backend.user_by_login("alice") is None
        assert await backend.user_by_id(sub) is None
    assert type(failure) is UnknownUser
    logged = [formatEvent(e) for e in events if e["log_level"] == LogLevel.error]
    assert logged and all("not 1 to 255 printable ASCII characters" in line and sub not in line for line in logged)


# --- outages ----------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_database_down_is_unavailable_never_a_wrong_password(reactor, context, backends, monkeypatch):
    from pgcluster import Cluster

    cluster = Cluster(local=True)
    try:
        dsn = cluster.database()
        monkeypatch.setenv("IDENTITY_DSN", dsn + " password=hunter2-secret")
        section = Section({"dsn_env": "IDENTITY_DSN", "connect_timeout": 2, "statement_timeout": 2},
                          "identity[0]", context.base_dir)
        backend = postgres.build(section, context, CHEAP)
        backends.append(backend)
        await add_users(backend, seed_users())
        assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub

        with capturedLogs() as events:
            cluster.stop()
            await deferLater(reactor, 0.2, lambda: None)
            for attempt in range(2):
                with pytest.raises(BackendUnavailable):
                    await login(backend, "alice", PASSWORDS[ALICE.sub])
                with pytest.raises(BackendUnavailable):
                    await login(backend, "alice", "wrong")
                with pytest.raises(BackendUnavailable):
                    await backend.user_by_id(ALICE.sub)
                with pytest.raises(BackendUnavailable):
                    await backend.user_by_login("alice")
            cluster.start()
            assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub
            assert await backend.user_by_id(BOB.sub) == BOB
        messages = [formatEvent(e) for e in events]
        assert len([m for m in messages if "identity database unavailable" in m]) == 1
        assert len([m for m in messages if "identity database reachable again" in m]) == 1
        assert not [m for m in messages if "hunter2" in m or PASSWORDS[ALICE.sub] in m]
        assert not [e for e in events if "log_failure" in e or e.get("isError")]
    finally:
        cluster.destroy()


@pytest_twisted.ensureDeferred
async def test_a_server_that_never_answers_times_out(reactor, context, backends):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        dsn = f"host=127.0.0.1 port={silent.getsockname()[1]} dbname=x"
        backend = direct_backend(dsn, context, cheap_verifier(context), connect_timeout=1)
        backends.append(backend)
        started = reactor.seconds()
        with pytest.raises(BackendUnavailable, match="cannot connect: no answer within 1 s"):
            await backend.user_by_id(ALICE.sub)
        assert reactor.seconds() - started < 3
    finally:
        silent.close()


@pytest_twisted.ensureDeferred
async def test_the_next_server_is_tried_when_the_first_is_silent(pg_dsn, reactor, context, backends):
    """A powered-off primary named first leaves time for the standby named next, found by its name."""
    await add_users(open_backend({"dsn": pg_dsn}, context, backends), [(ALICE, PASSWORDS[ALICE.sub])])
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        parameters = dict(item.split("=", 1) for item in pg_dsn.split())
        parameters |= {"host": "127.0.0.1,localhost", "port": f"{silent.getsockname()[1]},{parameters['port']}"}
        dsn = " ".join(f"{key}={value}" for key, value in parameters.items())
        backend = direct_backend(dsn, context, cheap_verifier(context), connect_timeout=1)
        backends.append(backend)
        started = reactor.seconds()
        assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub
        assert 1 <= reactor.seconds() - started < 3
    finally:
        silent.close()


@pytest_twisted.ensureDeferred
async def test_a_blocked_query_times_out(pg_dsn, reactor, context, backends):
    seed_staff(pg_dsn, seed_users())
    backend = open_backend({"dsn": pg_dsn, **MAPPED, "statement_timeout": 1}, context, backends)
    assert await backend.user_by_id(ALICE.sub) == ALICE
    blocker = psycopg2.connect(pg_dsn)
    try:
        with blocker.cursor() as cursor:
            cursor.execute("LOCK TABLE staff IN ACCESS EXCLUSIVE MODE")
        started = reactor.seconds()
        with pytest.raises(BackendUnavailable, match="cancelled by the server"):
            await login(backend, "alice", PASSWORDS[ALICE.sub])
        assert reactor.seconds() - started < 3
    finally:
        blocker.close()
    assert await backend.user_by_id(ALICE.sub) == ALICE


@pytest_twisted.ensureDeferred
async def test_pool_bounds_connections(pg_dsn, context, backends):
    backend = open_backend({"dsn": pg_dsn, "pool_size": 2}, context, backends)
    await add_users(backend, seed_users())
    found = await gatherResults([backend.user_by_id(user.sub) for user, _ in seed_users() * 5])
    assert found == [user for user, _ in seed_users() * 5]
    [(connections,)] = execute(
        pg_dsn,
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'authsrv-identity'"
        " AND datname = current_database()",
    )
    assert 1 <= connections <= 2


@pytest_twisted.ensureDeferred
async def test_sign_ins_right_after_pg_terminate_backend_succeed(pg_dsn, context, backends):
    """
    The backend's sessions ended by an operator (a restart, a failover,
    pg_terminate_backend), their goodbyes still on the way: a sign-in's
    lookup runs once more on a new connection rather than failing it.
    """
    backend = open_backend({"dsn": pg_dsn, "pool_size": 2}, context, backends)
    await add_users(backend, seed_users())
    for _ in range(10):
        await gatherResults([backend.user_by_id(ALICE.sub), backend.user_by_id(BOB.sub)])
        execute(pg_dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE application_name = 'authsrv-identity' AND datname = current_database()")
        assert await login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE.sub


@pytest_twisted.ensureDeferred
async def test_a_busy_pool_answers_in_bounded_time(pg_dsn, reactor, context, backends):
    seed_staff(pg_dsn, seed_users())
    config = {"dsn": pg_dsn, **MAPPED, "pool_size": 1, "connect_timeout": 1, "statement_timeout": 3}
    backend = open_backend(config, context, backends)
    blocker = psycopg2.connect(pg_dsn)
    try:
        with blocker.cursor() as cursor:
            cursor.execute("LOCK TABLE staff IN ACCESS EXCLUSIVE MODE")
        stuck = backend.user_by_id(ALICE.sub)
        started = reactor.seconds()
        with pytest.raises(BackendUnavailable, match="no connection free within 1 s"):
            await backend.user_by_id(BOB.sub)
        assert reactor.seconds() - started < 2
        blocker.rollback()
        assert await stuck == ALICE
    finally:
        blocker.close()


def test_unreachable_database_on_start(context, monkeypatch):
    monkeypatch.setenv("IDENTITY_DSN", f"host=127.0.0.1 port={free_port()} password=hunter2-secret")
    with pytest.raises(ConfigError) as raised:
        postgres.from_config(Section({"dsn_env": "IDENTITY_DSN"}, "identity[0]", context.base_dir), context)
    assert raised.value.key == "identity[0].dsn_env"
    assert str(raised.value).startswith("identity[0].dsn_env: cannot use the database: ")
    assert "hunter2" not in str(raised.value) and "\n" not in str(raised.value)


# --- the operator command -----------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_operator_manages_users_in_own_mode(pg_dsn, tmp_path, monkeypatch):
    from authsrv.embedded import prepare_data_dir

    config, _ = prepare_data_dir(tmp_path / "data")
    text = config.read_text().replace(
        '[[identity]]\nplugin = "static"\npath = "users.toml"',
        '[[identity]]\nplugin = "postgres"\ndsn_env = "AUTHSRV_IDENTITY_DSN"',
    )
    config.write_text(text)
    monkeypatch.setenv("AUTHSRV_IDENTITY_DSN", pg_dsn)

    async def run(*args, stdin=None):
        return await admin("--config", str(config), *args, cwd=tmp_path, stdin=stdin)

    added = await run("user", "add", "alice", "--name", "Alice", "--email", "alice@example.com",
                      "--email-verified", "--chat-user-id", "80351110224678912", "--password-stdin",
                      stdin="correct horse\n")
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("added user alice (sub ")
    [(sub, login, password_hash, name, verified, chat)] = execute(
        pg_dsn, "SELECT sub, login, password_hash, name, email_verified, chat_user_id FROM identity_users"
    )
    assert (login, name, verified, chat) == ("alice", "Alice", True, "80351110224678912")
    assert PasswordHasher().verify(password_hash, "correct horse")

    again = await run("user", "add", "ALICE", "--password-stdin", stdin="x\n")
    assert again.returncode == 1 and "login 'alice' is already taken" in again.stderr

    assert (await run("user", "disable", "alice", "--reason", "left")).returncode == 0
    assert execute(pg_dsn, "SELECT disabled, disabled_reason FROM identity_users") == [(True, "left")]
    assert (await run("user", "enable", "Alice")).returncode == 0
    assert (await run("user", "passwd", "alice", "--password-stdin", stdin="battery staple\n")).returncode == 0
    [(new_hash,)] = execute(pg_dsn, "SELECT password_hash FROM identity_users")
    assert PasswordHasher().verify(new_hash, "battery staple")
    missing = await run("user", "disable", "bob", "--reason", "x")
    assert missing.returncode == 1 and "no user 'bob' (by id or login)" in missing.stderr

    banned = await run("ban", "alice", "--reason", "spam")
    assert banned.returncode == 0, banned.stderr
    assert sub in banned.stdout


@pytest_twisted.ensureDeferred
async def test_operator_leaves_mapped_users_to_their_owner(pg_dsn, tmp_path):
    seed_staff(pg_dsn, [(ALICE, PASSWORDS[ALICE.sub])])
    config = tmp_path / "authsrv.toml"
    mapped = "\n".join(f"{key} = {json.dumps(value)}" for key, value in MAPPED.items())
    config.write_text(f'[[identity]]\nplugin = "postgres"\ndsn = {json.dumps(pg_dsn)}\n{mapped}\n')
    for args in (["user", "add", "bob", "--password-stdin"], ["user", "disable", "alice", "--reason", "x"]):
        refused = await admin("--config", str(config), *args, cwd=tmp_path, stdin="pw\n")
        assert refused.returncode == 1
        assert refused.stderr.startswith("authsrv-admin: no [[identity]] backend in the config can write users")
    assert execute(pg_dsn, "SELECT locked_at FROM staff") == [(None,)]


# --- equal work for unknown users and wrong passwords --------------------------


class CountingPool:
    """The backend's pool, noting each statement sent to the database under the label of its call."""

    def __init__(self, pool):
        self._pool = pool
        self.statements: list[str] = []

    def run(self, work, label="", **options):
        return self._pool.run(lambda connection: work(_CountingConnection(connection, self, label)), label, **options)

    def close(self):
        self._pool.close()


class _CountingConnection:
    def __init__(self, connection, pool: CountingPool, label: str):
        self._connection, self._pool, self._label = connection, pool, label

    def cursor(self):
        return _CountingCursor(self._connection.cursor(), self._pool, self._label)


class _CountingCursor:
    def __init__(self, cursor, pool: CountingPool, label: str):
        self._cursor, self._pool, self._label = cursor, pool, label

    def execute(self, *args, **kwargs):
        self._pool.statements.append(self._label)
        return self._cursor.execute(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._cursor, name)


class CountingVerifier(postgres.MigratingVerifier):
    """Notes the pool thread and the argon2 parameters of every hash a password is checked against."""

    def __init__(self, context, hasher):
        super().__init__(context.reactor, context.threadpool("passwords", 2), hasher)
        self.checks: list[tuple] = []

    def _check(self, password, stored_hash):
        checked = self._dummy if stored_hash is None else stored_hash
        self.checks.append((threading.current_thread().name.rstrip("0123456789"), extract_parameters(checked)))
        return super()._check(password, stored_hash)


@pytest_twisted.ensureDeferred
async def test_unknown_user_and_wrong_password_do_the_same_work(pg_dsn, context, backends):
    """
    Through the login path (a portal over the identity chain): one
    statement, then one check on the password pool against a hash of the
    configured parameters, either way.
    """
    await add_users(open_backend({"dsn": pg_dsn}, context, backends), seed_users())
    settings = read_settings(Section({"dsn": pg_dsn}, "identity[0]", None), "authsrv-identity")
    pool = CountingPool(postgres.connection_pool(context.reactor, settings, 2, lookups(context)))
    verifier = CountingVerifier(context, CHEAP)
    backend = postgres.PostgresIdentityBackend(pool, verifier, postgres.OWN_QUERIES, "own")
    backends.append(backend)
    chain = IdentityChain([backend])
    work = {}
    for login, failure in (("nobody", UnknownUser), ("alice", UnauthorizedLogin)):
        assert type(await portal_login_fails(chain, login, "wrong")) is failure
        work[login] = (pool.statements[:], verifier.checks[:])
        pool.statements.clear()
        verifier.checks.clear()
    assert work["nobody"] == work["alice"] == (
        ["user_by_login"],
        [("PoolThread-authsrv-passwords-", extract_parameters(hash_password("x", CHEAP)))],
    )


@pytest_twisted.ensureDeferred
async def test_hash_of_other_parameters_upgraded_at_login(pg_dsn, context, backends):
    """Its wrong passwords would cost another time than an unknown login, until replaced."""
    other = PasswordHasher(time_cost=2, memory_cost=16, parallelism=1)
    backend = open_backend({"dsn": pg_dsn}, context, backends)
    await backend.add_user(ALICE, hash_password(PASSWORDS[ALICE.sub], other))
    assert CHEAP.check_needs_rehash(stored_hash(pg_dsn, "identity_users", ALICE.sub))
    assert await login(backend, b"alice", PASSWORDS[ALICE.sub].encode()) == ALICE.sub
    assert not CHEAP.check_needs_rehash(stored_hash(pg_dsn, "identity_users", ALICE.sub))


@pytest_twisted.ensureDeferred
async def test_two_logins_at_once_upgrade_the_hash_once(pg_dsn, reactor, context, backends):
    """Both read the old hash; the second's write finds it replaced, writes nothing and says nothing."""
    other = PasswordHasher(time_cost=2, memory_cost=16, parallelism=1)
    await open_backend({"dsn": pg_dsn}, context, backends).add_user(ALICE, hash_password(PASSWORDS[ALICE.sub], other))
    arrived: list[Deferred] = []

    class BothRead(postgres.MigratingVerifier):
        def rehash(self, password):
            arrived.append(Deferred())
            if len(arrived) == 2:
                for waiting in arrived:
                    waiting.callback(None)
            return arrived[-1].addCallback(lambda _: super(BothRead, self).rehash(password))

    backend = direct_backend(pg_dsn, context, BothRead(reactor, context.threadpool("passwords", 2), CHEAP))
    backends.append(backend)
    with capturedLogs() as events:
        subs = await gatherResults([Deferred.fromCoroutine(login(backend, "alice", PASSWORDS[ALICE.sub]))
                                    for _ in range(2)])
    assert subs == [ALICE.sub, ALICE.sub]
    assert [formatEvent(e) for e in events if "upgraded" in formatEvent(e)] == [
        "password hash of 'alice' upgraded to the configured argon2id parameters"]
    upgraded = stored_hash(pg_dsn, "identity_users", ALICE.sub)
    assert not CHEAP.check_needs_rehash(upgraded) and CHEAP.verify(upgraded, PASSWORDS[ALICE.sub])
