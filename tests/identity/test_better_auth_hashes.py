"""
Better Auth's scrypt password hashes: checked against vectors that Better
Auth itself made, malformed ones refused without a traceback, and replaced by
argon2id at the first successful login where authsrv owns the users (static
file, PostgreSQL own mode).
"""

from __future__ import annotations

import psycopg2
import pytest
import pytest_twisted
from argon2 import PasswordHasher, profiles
from argon2.exceptions import VerifyMismatchError
from attrs import evolve
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.logger import LogLevel, capturedLogs, formatEvent

from authsrv.configsection import ConfigError, Section
from authsrv.identity import postgres
from authsrv.identity.errors import UnknownUser
from authsrv.identity.passwords import PasswordVerifier, is_argon2id_hash, is_better_auth_hash
from authsrv.identity.static import StaticIdentityBackend, add_user, file_thread
from authsrv.testing.identity import ALICE

CHEAP = PasswordHasher.from_parameters(profiles.CHEAPEST)

# Made by better-auth 1.7.25 from npm: `hashPassword` of `better-auth/crypto`.
VECTORS = {
    "correct horse battery staple": (
        "0914facee084f98a142016488557f120:1bf0077480f3ad31a3388d1b1c4f185eaabe279dc2b94463a1c5f74c"
        "d5d97f30c3fb33eb479c84f064862023fb7d9364ef56349e833fdde7cc8db11e1e2ebef6"
    ),
    "\ufb01sh \u2126 k\u00e9y": (
        "d6215b435a5bdb899cfda1c724f82f89:dc9733397f78f3b21566dcbca15abef4ec637171f7253efc2e25c25b9c"
        "e70da2974e9da0fb2042e8cf5e2d0abdee1d241f236461cda311657f42216546074b43"
    ),
}
PASSWORD = "correct horse battery staple"
HASH = VECTORS[PASSWORD]

MALFORMED = [
    pytest.param(HASH.replace(":", ""), id="no-colon"),
    pytest.param("$" + HASH, id="dollar"),
    pytest.param(HASH[2:], id="short-salt"),
    pytest.param(HASH[:-2], id="short-key"),
    pytest.param(HASH + "00", id="long-key"),
    pytest.param("z" + HASH[1:], id="non-hex-salt"),
    pytest.param(HASH[:-1] + "g", id="non-hex-key"),
    pytest.param(HASH + ":00", id="two-colons"),
    pytest.param(":" + HASH.split(":")[1], id="empty-salt"),
    pytest.param(HASH.split(":")[0] + ":", id="empty-key"),
]


class RecordingVerifier(PasswordVerifier):
    """Notes each hash a password is checked against (None: the dummy)."""

    def __init__(self, context):
        super().__init__(context.reactor, context.threadpool("passwords", 2), CHEAP)
        self.checked: list[str | None] = []

    def _check(self, password, stored_hash):
        self.checked.append(stored_hash)
        return super()._check(password, stored_hash)


@pytest.fixture
def verifier(context):
    return RecordingVerifier(context)


def login(backend, username, password):
    return backend.requestAvatarId(UsernamePassword(username, password))


def log_text(events) -> str:
    return " ".join(formatEvent(e) for e in events)


# --- the verifier -------------------------------------------------------------


@pytest.mark.parametrize(("password", "stored"), VECTORS.items(), ids=["ascii", "nfkc"])
@pytest_twisted.ensureDeferred
async def test_better_auth_vectors_match(verifier, password, stored):
    assert is_better_auth_hash(stored)
    assert await verifier.verify("alice", password, stored)
    assert await verifier.verify("alice", password.encode(), stored)
    assert not await verifier.verify("alice", password + " ", stored)
    assert verifier.needs_rehash(stored)


@pytest_twisted.ensureDeferred
async def test_the_password_is_compared_in_nfkc(verifier):
    """Better Auth normalises to NFKC: the ligature and the Ohm sign match their plain forms."""
    assert await verifier.verify("alice", "fish \u03a9 ke\u0301y", VECTORS["\ufb01sh \u2126 k\u00e9y"])


@pytest_twisted.ensureDeferred
async def test_a_password_that_is_not_unicode_matches_nothing(verifier):
    assert not await verifier.verify("alice", b"\xff\xfe", HASH)
    assert not await verifier.verify("alice", "\udcff", HASH)


@pytest.mark.parametrize("stored", MALFORMED)
@pytest_twisted.ensureDeferred
async def test_malformed_hashes_are_a_logged_refusal(verifier, stored):
    assert not is_better_auth_hash(stored)
    with capturedLogs() as events:
        assert not await verifier.verify("alice", PASSWORD, stored)
    [error] = [formatEvent(e) for e in events if e["log_level"] == LogLevel.error]
    assert error == "stored password hash of 'alice' is malformed"
    assert not any(e.get("log_failure") for e in events)


class UnusedHasher(PasswordHasher):
    """A cheap hasher that notes each hash it is asked to check, and checks none (a mismatch)."""

    def __init__(self):
        super().__init__(time_cost=1, memory_cost=8, parallelism=1, hash_len=16, salt_len=16)
        self.checked: list[str] = []

    def verify(self, hash, password):
        self.checked.append(hash)
        raise VerifyMismatchError()


COSTLY = [
    pytest.param("$argon2id$v=19$m=4194304,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", id="argon2-4GiB"),
    pytest.param("$argon2id$v=19$m=65536,t=1000000,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", id="argon2-passes"),
    pytest.param("$argon2id$v=19$m=65536,t=1,p=255$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", id="argon2-lanes"),
    pytest.param("$2b$31$" + "a" * 53, id="bcrypt-31"),
]


@pytest.mark.parametrize("stored", COSTLY)
@pytest_twisted.ensureDeferred
async def test_a_stored_hash_asking_for_absurd_work_is_refused_unchecked(context, monkeypatch, stored):
    """
    A stored hash sets its own cost: one with gigabytes or millions of passes
    (in a Better Auth database read side by side, or an operator's table)
    held a thread of the two-thread password pool for hours per login.
    """
    hasher = UnusedHasher()
    verifier = postgres.BetterAuthVerifier(context.reactor, context.threadpool("passwords", 2), hasher)
    monkeypatch.setattr(postgres.bcrypt, "checkpw", lambda *args: pytest.fail("bcrypt ran"))
    with capturedLogs() as events:
        assert not await verifier.verify("alice", PASSWORD, stored)
    assert hasher.checked == []
    [error] = [formatEvent(e) for e in events if e["log_level"] == LogLevel.error]
    assert error.startswith("stored password hash of 'alice' asks for more work than a check may take")


@pytest_twisted.ensureDeferred
async def test_a_stored_hash_of_the_configured_costs_is_checked(context):
    """The bound never refuses what the configured hasher itself makes, however costly the operator chose."""
    costly = PasswordHasher(time_cost=12, memory_cost=160, parallelism=20, hash_len=16, salt_len=16)
    verifier = PasswordVerifier(context.reactor, context.threadpool("passwords", 2), costly)
    assert await verifier.verify("alice", PASSWORD, costly.hash(PASSWORD))


# --- the static file ----------------------------------------------------------


@pytest.fixture
def users_file(tmp_path):
    path = tmp_path / "users.toml"
    add_user(path, login=ALICE.login, password_hash=HASH, sub=ALICE.sub)
    return path


@pytest_twisted.ensureDeferred
async def test_static_file_upgrades_a_better_auth_hash(users_file, context, verifier):
    backend = StaticIdentityBackend(users_file, context.reactor, verifier, file_thread(context))
    with pytest.raises(UnauthorizedLogin) as failure:
        await login(backend, "alice", "wrong")
    assert not isinstance(failure.value, UnknownUser)
    assert HASH in users_file.read_text()

    with capturedLogs() as events:
        assert await login(backend, "ALICE", PASSWORD) == ALICE.sub
        await backend.close()  # the upgrade is written after the login answered
    stored = backend._by_login("alice").password_hash
    assert is_argon2id_hash(stored) and CHEAP.verify(stored, PASSWORD)
    assert HASH not in users_file.read_text() and stored in users_file.read_text()
    text = log_text(events)
    assert "upgraded to the configured argon2id parameters" in text
    assert HASH not in text and stored not in text and PASSWORD not in text

    verifier.checked.clear()
    assert await login(backend, "alice", PASSWORD) == ALICE.sub
    assert verifier.checked == [stored]


@pytest_twisted.ensureDeferred
async def test_static_file_keeps_a_hash_the_operator_changed_meanwhile(users_file, context, verifier):
    backend = StaticIdentityBackend(users_file, context.reactor, verifier, file_thread(context))
    operators = CHEAP.hash("set by the operator")
    account = backend._by_login("alice")
    users_file.write_text(users_file.read_text().replace(HASH, operators))
    assert await backend._upgrade(account, PASSWORD) == ALICE.sub
    await backend.close()
    assert operators in users_file.read_text()


@pytest_twisted.ensureDeferred
async def test_static_file_login_succeeds_when_the_upgrade_cannot_be_written(users_file, context, verifier):
    """An operator's broken edit (not yet reloaded) stops the upgrade, not the login."""
    backend = StaticIdentityBackend(users_file, context.reactor, verifier, file_thread(context))
    broken = users_file.read_text() + "[[users]]\nlogin = 3\n"
    users_file.write_text(broken)
    with capturedLogs() as events:
        assert await login(backend, "alice", PASSWORD) == ALICE.sub
        await backend.close()
    assert users_file.read_text() == broken
    assert "not upgraded to the configured argon2id parameters" in log_text(events)


@pytest_twisted.ensureDeferred
async def test_unknown_login_costs_one_argon2id_check(users_file, context, verifier):
    """As before: only the dummy, never a scrypt, for a login nobody has."""
    backend = StaticIdentityBackend(users_file, context.reactor, verifier, file_thread(context))
    with pytest.raises(UnknownUser):
        await login(backend, "nobody", PASSWORD)
    assert verifier.checked == [None]


@pytest.mark.parametrize("stored", MALFORMED)
def test_static_file_refuses_a_malformed_better_auth_hash(tmp_path, context, verifier, stored):
    path = tmp_path / "users.toml"
    path.write_text(f'[[users]]\nsub = "{ALICE.sub}"\nlogin = "alice"\npassword_hash = "{stored}"\n')
    with pytest.raises(ConfigError) as error:
        StaticIdentityBackend(path, context.reactor, verifier, file_thread(context))
    assert "users[0].password_hash" in str(error.value)
    assert stored not in str(error.value)


# --- PostgreSQL, own mode -----------------------------------------------------


def stored_hash(dsn: str, sub: str) -> str:
    connection = psycopg2.connect(dsn)
    try:
        with connection, connection.cursor() as cursor:
            cursor.execute("SELECT password_hash FROM identity_users WHERE sub = %s", (sub,))
            [(value,)] = cursor.fetchall()
            return value
    finally:
        connection.close()


def set_stored_hash(dsn: str, sub: str, value: str) -> None:
    connection = psycopg2.connect(dsn)
    try:
        with connection, connection.cursor() as cursor:
            cursor.execute("UPDATE identity_users SET password_hash = %s WHERE sub = %s", (value, sub))
    finally:
        connection.close()


@pytest.fixture
def own_backend(pg_dsn, context):
    backend = postgres.build(Section({"dsn": pg_dsn}, "identity[0]", context.base_dir), context, CHEAP)
    yield backend
    backend.close()


@pytest_twisted.ensureDeferred
async def test_postgres_own_mode_upgrades_a_better_auth_hash(pg_dsn, own_backend):
    await own_backend.add_user(ALICE, CHEAP.hash("placeholder"))
    set_stored_hash(pg_dsn, ALICE.sub, HASH)
    with pytest.raises(UnauthorizedLogin) as failure:
        await login(own_backend, "alice", "wrong")
    assert not isinstance(failure.value, UnknownUser)
    assert stored_hash(pg_dsn, ALICE.sub) == HASH

    with capturedLogs() as events:
        assert await login(own_backend, "alice", PASSWORD) == ALICE.sub
    upgraded = stored_hash(pg_dsn, ALICE.sub)
    assert is_argon2id_hash(upgraded) and CHEAP.verify(upgraded, PASSWORD)
    text = log_text(events)
    assert "upgraded" in text and HASH not in text and PASSWORD not in text
    assert await login(own_backend, "alice", PASSWORD) == ALICE.sub


@pytest_twisted.ensureDeferred
async def test_postgres_own_mode_nfkc_vector_and_malformed_hash(pg_dsn, own_backend):
    bob = evolve(ALICE, sub="bob-sub", login="bob")
    await own_backend.add_user(ALICE, CHEAP.hash("placeholder"))
    await own_backend.add_user(bob, CHEAP.hash("placeholder"))
    set_stored_hash(pg_dsn, ALICE.sub, VECTORS["\ufb01sh \u2126 k\u00e9y"])
    set_stored_hash(pg_dsn, bob.sub, HASH[:-1] + "g")
    assert await login(own_backend, "alice", "fish \u03a9 k\u00e9y") == ALICE.sub
    assert is_argon2id_hash(stored_hash(pg_dsn, ALICE.sub))
    with pytest.raises(UnauthorizedLogin):
        await login(own_backend, "bob", PASSWORD)
    assert stored_hash(pg_dsn, bob.sub) == HASH[:-1] + "g"

