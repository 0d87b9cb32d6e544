"""
The static-file identity backend: the conformance suite, reloading, strict
validation of the users file, L{add_user}, and password checks kept off the
reactor thread.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import threading
import tomllib
from pathlib import Path

import pytest
from attrs import asdict
import pytest_twisted
from argon2 import PasswordHasher, extract_parameters, profiles
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import Portal
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.internet.task import Clock
from twisted.logger import LogLevel, capturedLogs, formatEvent
from twisted.python.failure import Failure
from twisted.python.threadable import isInIOThread
from twisted.python.threadpool import ThreadPool

from authsrv.configsection import ConfigError, Section
from authsrv.identity.chain import IdentityChain
from authsrv.identity.credentials import MAX_PASSWORD_BYTES
from authsrv.identity.errors import UnknownUser
from authsrv.identity.passwords import (
    DEFAULT_HASHER,
    PasswordVerifier,
    argon2id_hasher,
    dummy_hash,
    hash_password,
    pool_size,
)
from authsrv.identity.realm import UserRealm
from authsrv.identity import static
from authsrv.identity.static import (
    RELOAD_INTERVAL,
    StaticIdentityBackend,
    add_user,
    create_users_file,
    file_thread,
    from_config,
    login_key,
    toml_string,
)
from authsrv.interfaces import IUser
from authsrv.records import User
from authsrv.testing.identity import (
    ALICE,
    PASSWORDS,
    IdentityBackendConformance,
    UserManagementConformance,
    portal_login_fails,
)

from conftest import file_work_here, no_file_work

CHEAP = PasswordHasher.from_parameters(profiles.CHEAPEST)
# A fixed salt: the hash is part of parametrized test ids, which every pytest-xdist worker must agree on.
CHEAP_HASH = CHEAP.hash("secret", salt=b"testsalt")


class RecordingHasher(PasswordHasher):
    """A cheap hasher that records the thread each check runs in, and the hash it checks against."""

    def __init__(self):
        super().__init__(
            time_cost=CHEAP.time_cost,
            memory_cost=CHEAP.memory_cost,
            parallelism=CHEAP.parallelism,
            hash_len=CHEAP.hash_len,
            salt_len=CHEAP.salt_len,
        )
        self.checks: list[tuple[threading.Thread, bool]] = []
        self.hashes: list[str] = []

    def verify(self, hash, password):
        self.checks.append((threading.current_thread(), isInIOThread()))
        self.hashes.append(hash)
        return super().verify(hash, password)


@pytest.fixture
def users_file(tmp_path) -> Path:
    path = tmp_path / "users.toml"
    add_user(path, login=ALICE.login, password_hash=hash_password(PASSWORDS[ALICE.sub], CHEAP), sub=ALICE.sub)
    return path


def seed_file(path: Path, users) -> None:
    for user, password in users:
        add_user(path, password_hash=hash_password(password, CHEAP), **asdict(user))


def errors(events) -> list[str]:
    return [formatEvent(e) for e in events if e["log_level"] == LogLevel.error]


class TestStaticConformance(IdentityBackendConformance):
    @pytest.fixture(autouse=True)
    def _setup(self, tmp_path, context):
        self.path = tmp_path / "users.toml"
        self.context = context

    def make_backend(self, users):
        seed_file(self.path, users)
        pool = self.context.threadpool("passwords", 2)
        return StaticIdentityBackend(
            self.path, self.context.reactor, PasswordVerifier(self.context.reactor, pool, CHEAP),
            file_thread(self.context),
        )


class TestStaticUserManagement(UserManagementConformance):
    @pytest.fixture(autouse=True)
    def _setup(self, tmp_path, context):
        self.path = tmp_path / "users.toml"
        self.context = context

    def make_backend(self):
        create_users_file(self.path)
        pool = self.context.threadpool("passwords", 2)
        return StaticIdentityBackend(
            self.path, self.context.reactor, PasswordVerifier(self.context.reactor, pool, CHEAP),
            file_thread(self.context),
        )


# --- building from config -------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_from_config(users_file, context):
    section = Section({"path": "users.toml"}, "identity[0]", users_file.parent)
    backend = from_config(section, context)
    portal = Portal(UserRealm(backend), [backend])
    _, user, _ = await portal.login(UsernamePassword("alice", PASSWORDS[ALICE.sub]), None, IUser)
    assert user.sub == ALICE.sub
    await backend.close()


def test_from_config_default_path(users_file, context):
    backend = from_config(Section({}, "identity[0]", users_file.parent), context)
    assert backend.user_by_login("alice").result.sub == ALICE.sub


def test_from_config_unknown_key(tmp_path, context):
    with pytest.raises(ConfigError) as info:
        from_config(Section({"file": "x"}, "identity[0]", tmp_path), context)
    assert str(info.value) == "identity[0].file: unknown key"


def test_missing_file_names_the_path_key(tmp_path, context):
    section = Section({"path": "missing.toml"}, "identity[0]", tmp_path)
    with pytest.raises(ConfigError) as info:
        from_config(section, context)
    assert info.value.key == "identity[0].path"
    assert str(tmp_path / "missing.toml") in str(info.value)
    assert "\n" not in str(info.value)


ALICE_TABLE = f'[[users]]\nsub = "a"\nlogin = "alice"\npassword_hash = "{CHEAP_HASH}"\n'
BOB_TABLE = f'[[users]]\nsub = "b"\nlogin = "bob"\npassword_hash = "{CHEAP_HASH}"\n'


@pytest.mark.parametrize(
    "text, message",
    [
        (ALICE_TABLE + "nickname = 'al'\n", "users.toml: users[0].nickname: unknown key (at line 5)"),
        (ALICE_TABLE + BOB_TABLE + "email = 5\n", "users.toml: users[1].email: must be a string, not an integer (at line 9)"),
        (ALICE_TABLE + "email_verified = 'yes'\n", "users.toml: users[0].email_verified: must be true or false, not a string (at line 5)"),
        (ALICE_TABLE + BOB_TABLE.replace('"bob"', '"ALICE"'), "users.toml: users[1].login: 'ALICE' is already the login of users[0] (at line 7)"),
        (ALICE_TABLE + BOB_TABLE.replace('"b"', '"a"'), "users.toml: users[1].sub: 'a' is already the sub of users[0] (at line 6)"),
        (ALICE_TABLE.replace('login = "alice"\n', ""), "users.toml: users[0].login: is required (at line 1)"),
        (ALICE_TABLE.replace('login = "alice"', 'login = "  "'), "users.toml: users[0].login: must not be empty (at line 3)"),
        (ALICE_TABLE + "[groups]\n", "users.toml: groups: unknown section"),
        ("users = 1\n", "users.toml: users: must be an array of tables, not an integer"),
        ("users = [1]\n", "users.toml: users[0]: must be a table, not an integer"),
        (ALICE_TABLE.replace(CHEAP_HASH, "$2b$12$notargon"), "users.toml: users[0].password_hash: must be an argon2id hash ($argon2id$v=19$...), as authsrv-admin makes (at line 4)"),
        (ALICE_TABLE.replace(CHEAP_HASH, CHEAP_HASH[:-1] + "é"), "users.toml: users[0].password_hash: must be an argon2id hash ($argon2id$v=19$...), as authsrv-admin makes (at line 4)"),
        (ALICE_TABLE.replace('sub = "a"', 'sub = "é"'), "users.toml: users[0].sub: must be at most 255 printable ASCII characters (OIDC Core 2) (at line 2)"),
    ],
)
def test_validation_errors(tmp_path, context, text, message):
    (tmp_path / "users.toml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        from_config(Section({}, "identity[0]", tmp_path), context)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "text, message",
    [
        ("# staff\n\n" + ALICE_TABLE + "\n# the next one\n[[ 'users' ]]  # bob\n  login = 'bob'\n",
         "users[1].sub: is required (at line 9)"),
        ("# staff\n\n" + ALICE_TABLE + "\n[[\"users\"]]\nsub = 'b'\n\n  login   = ''\n",
         "users[1].login: must not be empty (at line 11)"),
        (f'users = [{{sub = "a", login = "", password_hash = "{CHEAP_HASH}"}}]\n',
         "users[0].login: must not be empty"),
        ("[[users]]\nsub = 'a'\nlogin = 'alice'\nname = \"\"\"\n[[users]]\n\"\"\"\n",
         "users[0].password_hash: is required"),
    ],
    ids=["header-line", "key-line", "inline-array", "header-in-a-string"],
)
def test_validation_errors_name_the_line(tmp_path, context, text, message):
    """A person finds the table by its line, not by counting [[users]] tables; no line is better than a wrong one."""
    (tmp_path / "users.toml").write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        from_config(Section({}, "identity[0]", tmp_path), context)
    assert str(info.value) == f"users.toml: {message}"


def test_bad_toml_is_one_line(tmp_path, context):
    (tmp_path / "users.toml").write_text(ALICE_TABLE + "name = \n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        from_config(Section({}, "identity[0]", tmp_path), context)
    assert info.value.key == "users.toml"
    assert str(info.value).startswith("users.toml: not valid TOML: ")
    assert "line 5" in str(info.value) and "\n" not in str(info.value)


def test_errors_never_show_the_hash(tmp_path, context):
    (tmp_path / "users.toml").write_text(ALICE_TABLE.replace(CHEAP_HASH, "$argon2id$v=19$broken"))
    with pytest.raises(ConfigError) as info:
        from_config(Section({}, "identity[0]", tmp_path), context)
    assert "broken" not in str(info.value)


def test_not_utf8(tmp_path, context):
    (tmp_path / "users.toml").write_bytes(b"# \xff\n")
    with pytest.raises(ConfigError, match=r"^users\.toml: not UTF-8 text$"):
        from_config(Section({}, "identity[0]", tmp_path), context)


def test_a_byte_order_mark_is_read_past(users_file, context):
    """Windows editors may begin a UTF-8 file with one: the file was refused as "not valid TOML" at line 1."""
    users_file.write_bytes(b"\xef\xbb\xbf" + users_file.read_bytes())
    add_user(users_file, login="bob", password_hash=hash_password("bob's", CHEAP))
    backend = from_config(Section({}, "identity[0]", users_file.parent), context)
    assert backend.user_by_login("alice").result.sub == ALICE.sub
    assert backend.user_by_login("bob").result is not None


def test_empty_file_has_no_users(tmp_path, context):
    assert create_users_file(tmp_path / "users.toml")
    assert not create_users_file(tmp_path / "users.toml")
    backend = from_config(Section({}, "identity[0]", tmp_path), context)
    assert backend.user_by_login("alice").result is None


# --- reloading --------------------------------------------------------------


def clocked_backend(path: Path, reactor, context) -> tuple[StaticIdentityBackend, Clock]:
    """A backend on a clock the test drives, whose reloads are done when the lookup that started one returns."""
    clock = Clock()
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), CHEAP)
    return StaticIdentityBackend(path, clock, verifier, file_work_here), clock


@pytest_twisted.ensureDeferred
async def test_reload_after_change(users_file, reactor, context):
    backend, clock = clocked_backend(users_file, reactor, context)
    add_user(users_file, login="bob", password_hash=hash_password("bob's", CHEAP))
    assert await backend.user_by_login("bob") is None
    clock.advance(0.5)
    assert await backend.user_by_login("bob") is None
    clock.advance(0.5)
    bob = await backend.user_by_login("bob")
    assert bob.login == "bob"
    portal = Portal(UserRealm(backend), [backend])
    _, user, _ = await portal.login(UsernamePassword("BOB", "bob's"), None, IUser)
    assert user == bob


@pytest_twisted.ensureDeferred
async def test_a_reload_parses_on_the_files_thread_and_serves_the_users_before_meanwhile(
        users_file, reactor, context, monkeypatch):
    """
    Parsing 5,000 users takes a tenth of a second, which on the reactor's
    thread held up every request; a lookup meanwhile answers from the users
    read before.
    """
    clock = Clock()
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), CHEAP)
    backend = StaticIdentityBackend(users_file, clock, verifier, file_thread(context))
    add_user(users_file, login="bob", password_hash=hash_password("bob's", CHEAP))
    parsed_in: list[bool] = []
    parse = static._parse
    monkeypatch.setattr(static, "_parse", lambda *a: (parsed_in.append(isInIOThread()), parse(*a))[1])
    clock.advance(RELOAD_INTERVAL)
    assert await backend.user_by_login("bob") is None
    await file_thread(context)(lambda: None)
    assert (await backend.user_by_login("bob")).login == "bob"
    assert parsed_in == [False]


@pytest_twisted.ensureDeferred
async def test_a_reload_looks_at_every_hash_on_the_files_thread_and_names_a_few(users_file, reactor, context):
    """
    The look for hashes of other argon2 parameters goes over every user
    (a quarter of a reload's work at 5,000 users): on a reload it runs on
    the file's thread with the parse, and the warning names ten logins and
    counts the rest, rather than making one line of thousands.
    """
    clock = Clock()
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), DEFAULT_HASHER)
    backend = StaticIdentityBackend(users_file, clock, verifier, file_thread(context))
    for n in range(11):
        add_user(users_file, login=f"user{n:02}", password_hash=CHEAP_HASH)
    looked_in: list[bool] = []
    look = verifier.needs_rehash
    verifier.needs_rehash = lambda stored: (looked_in.append(isInIOThread()), look(stored))[1]  # type: ignore
    with capturedLogs() as events:
        clock.advance(RELOAD_INTERVAL)
        await backend.user_by_login("alice")
        await file_thread(context)(lambda: None)
    assert (await backend.user_by_login("user10")).login == "user10"
    assert len(looked_in) == 12 and not any(looked_in)
    [warning] = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
    assert warning.startswith(f"{users_file}: the password hashes of 'alice', 'user00', ")
    assert "'user08' and 2 more have other argon2 parameters" in warning


def test_logins_compare_normalized(tmp_path, reactor, context):
    path = tmp_path / "users.toml"
    add_user(path, login="Jos\u00e9", password_hash=CHEAP_HASH, sub="j")
    with pytest.raises(ValueError, match="already taken"):
        add_user(path, login="JOSE\u0301", password_hash=CHEAP_HASH)
    backend, _ = clocked_backend(path, reactor, context)
    for login in ("jos\u00e9", "JOSE\u0301", "JOS\u00c9".encode()):
        assert backend.user_by_login(login).result.sub == "j"
    assert backend.user_by_login(b"jos\xe9").result is None


def test_reload_disable_in_place(users_file, reactor, context):
    backend, clock = clocked_backend(users_file, reactor, context)
    text = users_file.read_text()
    users_file.write_text(text + 'disabled = true\ndisabled_reason = "left"\n')
    clock.advance(1)
    user = backend.user_by_id(ALICE.sub).result
    assert (user.disabled, user.disabled_reason) == (True, "left")


def test_invalid_edit_keeps_old_users(users_file, reactor, context):
    backend, clock = clocked_backend(users_file, reactor, context)
    good = users_file.read_text()
    users_file.write_text(good + "nickname = 'al'\n")
    clock.advance(1)
    with capturedLogs() as events:
        assert backend.user_by_login("alice").result.sub == ALICE.sub
        clock.advance(1)
        assert backend.user_by_login("alice").result.sub == ALICE.sub
    [message] = errors(events)
    assert "users.toml: users[0].nickname: unknown key (at line 15)" in message
    assert "still serving the 1 users" in message

    users_file.write_text(good.replace('login = "alice"', 'login = "alicia"'))
    clock.advance(1)
    assert backend.user_by_login("alice").result is None
    assert backend.user_by_login("alicia").result.sub == ALICE.sub


def test_a_file_caught_half_written_in_place_removes_no_one(users_file, reactor, context):
    """
    An editor, or C{cat >}, rewrites the file in place: truncated, then
    written. A look in between reads no users; every refresh, UserInfo or
    user-access until the next look would take them as removed, and a
    refresh ends a removed user's grant for good.
    """
    backend, clock = clocked_backend(users_file, reactor, context)
    text = users_file.read_text()
    bob = '\n[[users]]\nsub = "sub-bob"\nlogin = "bob"\npassword_hash = "%s"\n' % hash_password("bob's", CHEAP)
    with users_file.open("r+") as editor:
        editor.truncate(0)
        editor.flush()
        clock.advance(RELOAD_INTERVAL)
        assert backend.user_by_id(ALICE.sub).result.login == "alice"
        editor.write(text + bob)
    clock.advance(RELOAD_INTERVAL)
    assert backend.user_by_id(ALICE.sub).result.login == "alice"
    assert backend.user_by_id("sub-bob").result.login == "bob"


def test_a_removal_written_in_place_acts_once_the_file_holds_still(users_file, reactor, context):
    """One look later; the operator's command, which replaces the file, acts at the first look."""
    add_user(users_file, login="bob", sub="sub-bob", password_hash=hash_password("bob's", CHEAP))
    backend, clock = clocked_backend(users_file, reactor, context)
    with_bob = users_file.read_text()
    users_file.write_text(with_bob[:with_bob.rindex("[[users]]", 0, with_bob.index('sub = "sub-bob"'))])
    clock.advance(RELOAD_INTERVAL)
    assert backend.user_by_id("sub-bob").result.login == "bob"
    clock.advance(RELOAD_INTERVAL)
    assert backend.user_by_id("sub-bob").result is None
    assert backend.user_by_id(ALICE.sub).result.login == "alice"

    users_file.write_text("")
    clock.advance(RELOAD_INTERVAL)
    assert backend.user_by_id(ALICE.sub).result.login == "alice"
    clock.advance(RELOAD_INTERVAL)
    assert backend.user_by_id(ALICE.sub).result is None


def test_removed_file_keeps_old_users(users_file, reactor, context):
    backend, clock = clocked_backend(users_file, reactor, context)
    users_file.unlink()
    clock.advance(1)
    with capturedLogs() as events:
        assert backend.user_by_id(ALICE.sub).result.login == "alice"
    [message] = errors(events)
    assert "cannot be read" in message


# --- add_user ---------------------------------------------------------------


def test_add_user_creates_file(tmp_path):
    path = tmp_path / "users.toml"
    user = add_user(path, login="alice", password_hash=CHEAP_HASH, name="Alice", email_verified=True)
    assert len(user.sub) == 36
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert text.startswith("# authsrv users")
    [table] = tomllib.loads(text)["users"]
    assert table == {
        "sub": user.sub,
        "login": "alice",
        "password_hash": CHEAP_HASH,
        "name": "Alice",
        "email_verified": True,
    }


def test_add_user_keeps_existing_text_and_mode(tmp_path):
    path = tmp_path / "users.toml"
    original = "# our staff\n" + ALICE_TABLE + "# end of staff"
    path.write_text(original)
    os.chmod(path, 0o640)
    add_user(path, login="bob", password_hash=CHEAP_HASH, sub="b", disabled=True, disabled_reason="gone")
    text = path.read_text()
    assert text.startswith(original + "\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    bob = tomllib.loads(text)["users"][1]
    assert (bob["sub"], bob["disabled"], bob["disabled_reason"]) == ("b", True, "gone")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".users.toml.lock", "users.toml"]  # no temporary file


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"login": "ALICE"}, "login 'alice' is already taken by user 'a'"),
        ({"login": "carol", "sub": "a"}, "sub 'a' is already taken by login 'alice'"),
        ({"login": "carol", "password_hash": "plain"}, "password_hash: must be an argon2id hash"),
        ({"login": "carol", "email": 5}, "email: must be a string, not an integer"),
        ({"login": ""}, "login: must not be empty"),
    ],
)
def test_add_user_refuses(tmp_path, kwargs, message):
    path = tmp_path / "users.toml"
    path.write_text(ALICE_TABLE)
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace("$", r"\$")):
        add_user(path, **{"password_hash": CHEAP_HASH, **kwargs})
    assert path.read_text() == ALICE_TABLE


def test_add_user_refuses_inline_array(tmp_path):
    path = tmp_path / "users.toml"
    path.write_text(f'users = [{{sub = "a", login = "alice", password_hash = "{CHEAP_HASH}"}}]\n')
    with pytest.raises(ValueError, match="cannot append a \\[\\[users\\]\\] table"):
        add_user(path, login="bob", password_hash=CHEAP_HASH)


def test_toml_string_refuses_lone_surrogates():
    with pytest.raises(ValueError):
        toml_string("a\ud800")


@given(st.text())
def test_toml_string_round_trips(value):
    assert tomllib.loads(f"k = {toml_string(value)}")["k"] == value


@settings(max_examples=40, deadline=None)
@given(login=st.text(min_size=1), name=st.text(min_size=1), chat=st.text(min_size=1))
def test_add_user_round_trips(login, name, chat):
    assume(login.strip() and name.strip() and chat.strip() and login_key(login) != "first")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "users.toml"
        add_user(path, login="first", password_hash=CHEAP_HASH)
        user = add_user(path, login=login, name=name, chat_user_id=chat, password_hash=CHEAP_HASH)
        assert (user.login, user.name, user.chat_user_id) == (login, name, chat)
        backend = StaticIdentityBackend(path, Clock(), PasswordVerifier(None, ThreadPool(), CHEAP), no_file_work)
        assert backend.user_by_id(user.sub).result == user


# --- edits in place -----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_edits_keep_the_operators_comments_order_and_mode(tmp_path, context):
    path = tmp_path / "users.toml"
    path.write_text("# our staff\n" + ALICE_TABLE.replace('login = "alice"', 'login = "alice"  # since 2019')
                    + "\n# the night shift\n" + BOB_TABLE + "# end of staff\n")
    os.chmod(path, 0o640)
    backend = StaticIdentityBackend(path, context.reactor, PasswordVerifier(context.reactor, context.threadpool("passwords", 1), CHEAP),
                                   file_thread(context))
    await backend.set_disabled("ALICE", True, 'said "bye"')
    text = path.read_text()
    assert text == (
        "# our staff\n" + ALICE_TABLE.replace('login = "alice"', 'login = "alice"  # since 2019')
        + 'disabled = true\ndisabled_reason = "said \\"bye\\""\n'
        + "\n# the night shift\n" + BOB_TABLE + "# end of staff\n"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert (await backend.user_by_login("alice")).disabled_reason == 'said "bye"'
    await backend.set_disabled("alice", False)
    await backend.remove_user("bob")
    assert path.read_text() == (
        "# our staff\n" + ALICE_TABLE.replace('login = "alice"', 'login = "alice"  # since 2019')
        + "\n# the night shift\n# end of staff\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [".users.toml.lock", "users.toml"]  # no temporary file


@pytest_twisted.ensureDeferred
async def test_edits_refuse_a_broken_file(tmp_path, context):
    path = tmp_path / "users.toml"
    path.write_text(ALICE_TABLE)
    backend = StaticIdentityBackend(path, context.reactor, PasswordVerifier(context.reactor, context.threadpool("passwords", 1), CHEAP),
                                   file_thread(context))
    path.write_text(ALICE_TABLE + "login = 5\n")
    with pytest.raises(ValueError, match="users.toml"):
        await backend.set_disabled("alice", True, "x")
    assert path.read_text() == ALICE_TABLE + "login = 5\n"


# --- password checks ----------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_hashing_runs_off_the_reactor_thread(users_file, reactor, context):
    hasher = RecordingHasher()
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), hasher)
    backend = StaticIdentityBackend(users_file, reactor, verifier, file_thread(context))
    portal = Portal(UserRealm(backend), [backend])
    await portal.login(UsernamePassword("alice", PASSWORDS[ALICE.sub]), None, IUser)
    for login in ("alice", "nobody"):
        with pytest.raises(UnauthorizedLogin):
            await portal.login(UsernamePassword(login, "wrong"), None, IUser)
    assert len(hasher.checks) == 3
    for thread, in_io_thread in hasher.checks:
        assert thread is not threading.main_thread()
        assert not in_io_thread


@pytest_twisted.ensureDeferred
async def test_unknown_user_checks_a_dummy_hash(users_file, reactor, context):
    hasher = RecordingHasher()
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), hasher)
    backend = StaticIdentityBackend(users_file, reactor, verifier, file_thread(context))
    with pytest.raises(UnknownUser):
        await backend.requestAvatarId(UsernamePassword("nobody", "secret"))
    assert len(hasher.checks) == 1


def password_work(hasher: RecordingHasher) -> list[tuple]:
    """What the checks recorded so far cost: each one's pool and argon2 parameters."""
    work = [
        (thread.name.rstrip("0123456789"), extract_parameters(stored))
        for (thread, _), stored in zip(hasher.checks, hasher.hashes)
    ]
    hasher.checks.clear()
    hasher.hashes.clear()
    return work


@pytest_twisted.ensureDeferred
async def test_unknown_user_and_wrong_password_do_the_same_work(users_file, reactor, context):
    """
    Through the login path (a portal over the identity chain): one check
    each, on the same pool, against a hash of the configured parameters.
    """
    hasher = RecordingHasher()
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), hasher)
    chain = IdentityChain([StaticIdentityBackend(users_file, reactor, verifier, file_thread(context))])
    assert type(await portal_login_fails(chain, "nobody", "wrong")) is UnknownUser
    unknown = password_work(hasher)
    assert type(await portal_login_fails(chain, "alice", "wrong")) is UnauthorizedLogin
    wrong = password_work(hasher)
    assert unknown == wrong == [("PoolThread-authsrv-passwords-", extract_parameters(CHEAP_HASH))]


@pytest.mark.parametrize("cores, checks", [(1, 1), (2, 2), (64, 2)])
def test_password_checks_run_two_at_a_time_or_one_on_a_single_core(cores, checks):
    assert pool_size(cores) == checks


@pytest.mark.parametrize("hasher", [CHEAP, DEFAULT_HASHER, PasswordHasher(time_cost=2, memory_cost=32, parallelism=3, hash_len=24, salt_len=12)])
def test_the_dummy_hash_has_exactly_the_hashers_parameters(hasher):
    dummy = dummy_hash(hasher)
    assert not hasher.check_needs_rehash(dummy)
    assert extract_parameters(dummy) == extract_parameters(hash_password("x", hasher))
    assert dummy != dummy_hash(hasher)


def test_hashes_of_other_parameters_are_named(users_file, reactor, context):
    pool = context.threadpool("passwords", 2)
    with capturedLogs() as events:
        StaticIdentityBackend(users_file, reactor, PasswordVerifier(reactor, pool, CHEAP), file_thread(context))
        assert not [e for e in events if e["log_level"] >= LogLevel.warn]
        StaticIdentityBackend(users_file, reactor, PasswordVerifier(reactor, pool, DEFAULT_HASHER), file_thread(context))
    [warning] = [formatEvent(e) for e in events if e["log_level"] >= LogLevel.warn]
    assert "'alice'" in warning and "other argon2 parameters" in warning


@pytest.mark.parametrize("stored", ["plain", "$argon2id$v=19$m=8,t=1,p=1$garbage", ""])
@pytest_twisted.ensureDeferred
async def test_malformed_hash_is_a_failed_check(reactor, context, stored):
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), CHEAP)
    with capturedLogs() as events:
        assert await verifier.verify("alice", "the password", stored) is False
    [message] = errors(events)
    assert "'alice'" in message
    assert "the password" not in message
    assert not stored or stored not in message


UNCHECKABLE = [
    pytest.param("", id="empty"),
    pytest.param("!", id="unusable-marker"),
    pytest.param("pbkdf2_sha256$600000$c2FsdA$aGFzaA", id="other-scheme"),
    pytest.param(CHEAP_HASH[:-1] + "é", id="non-ascii"),
    pytest.param(CHEAP_HASH.replace("m=8,", "m=٨,"), id="non-ascii-digit"),
    pytest.param("$argon2id$v=19$m=4194304,t=1,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", id="costly"),
]


@pytest.mark.parametrize("stored", UNCHECKABLE)
@pytest_twisted.ensureDeferred
async def test_a_stored_hash_that_cannot_be_checked_costs_an_unknown_logins_work(reactor, context, stored):
    """
    A wrong-password outcome and a log line, never an outage; and the
    dummy's check all the same, so that timing does not tell the login from
    an unknown one.
    """
    hasher = RecordingHasher()
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), hasher)
    with capturedLogs() as events:
        assert await verifier.verify("alice", "the password", stored) is False
    [message] = errors(events)
    assert "'alice'" in message and "the password" not in message
    assert extract_parameters(hasher.hashes[-1]) == extract_parameters(CHEAP_HASH)
    assert hasher.checks[-1][0].name.startswith("PoolThread-authsrv-passwords-")


@pytest_twisted.ensureDeferred
async def test_a_password_over_the_bound_is_refused_unhashed(reactor, context):
    """A megabyte costs no hashing, for a known login as for an unknown one; the bound itself is checked."""
    hasher = RecordingHasher()
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), hasher)
    longest = "é" * (MAX_PASSWORD_BYTES // 2)
    stored = hash_password(longest, CHEAP)
    for password in ("x" * 1_000_000, longest + "x", (longest + "x").encode()):
        assert await verifier.verify("alice", password, stored) is False
        assert await verifier.verify("", password, None) is False
    assert hasher.checks == []
    assert await verifier.verify("alice", longest, stored) is True


@pytest_twisted.ensureDeferred
async def test_verify(reactor, context):
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), CHEAP)
    stored = hash_password("pässwörd", CHEAP)
    assert await verifier.verify("alice", "pässwörd", stored) is True
    assert await verifier.verify("alice", "pässwörd".encode(), stored) is True
    assert await verifier.verify("alice", "passwörd", stored) is False
    assert await verifier.verify("alice", "pässwörd", None) is False
    assert await verifier.verify("alice", "p\udcc3ssw\ud800rd", stored) is False


def test_production_parameters():
    """OWASP's first equal-strength argon2id set, RFC 9106's salt and tag lengths."""
    stored = hash_password("x")
    assert stored.startswith("$argon2id$v=19$m=19456,t=2,p=1$")
    assert extract_parameters(stored).salt_len == profiles.RFC_9106_LOW_MEMORY.salt_len


OTHER_PARAMETERS = argon2id_hasher(8192, 1, 1)
"""The [passwords] an operator changed to, after carol's hash was made."""


def _carol_under_other_parameters(users_file, reactor, context):
    """A users file holding carol with a hash of other parameters than the backend's: (backend, path, hasher)."""
    path = users_file.parent / "other.toml"
    add_user(path, login="carol", sub="sub-carol", password_hash=hash_password("carol's pw", CHEAP))
    verifier = PasswordVerifier(reactor, context.threadpool("passwords", 2), OTHER_PARAMETERS)
    return StaticIdentityBackend(path, reactor, verifier, file_thread(context)), path, OTHER_PARAMETERS


@pytest_twisted.ensureDeferred
async def test_a_hash_of_other_parameters_is_replaced_at_the_next_login(users_file, reactor, context):
    """Once the operator changes [passwords], each user's hash follows at their next successful login."""
    backend, path, other = _carol_under_other_parameters(users_file, reactor, context)
    with pytest.raises(UnauthorizedLogin):
        await backend.requestAvatarId(UsernamePassword(b"carol", b"wrong"))
    assert extract_parameters(backend._by_login("carol").password_hash) == extract_parameters(hash_password("x", CHEAP))

    assert await backend.requestAvatarId(UsernamePassword(b"carol", b"carol's pw")) == "sub-carol"
    await backend.close()  # the upgrade is written after the login answered
    stored = backend._by_login("carol").password_hash
    assert extract_parameters(stored) == extract_parameters(hash_password("x", other))
    assert stored in path.read_text() and other.verify(stored, "carol's pw")


@pytest_twisted.ensureDeferred
async def test_two_logins_at_once_upgrade_the_hash_once(users_file, reactor, context):
    """Both check the old hash; the second's edit finds it replaced and leaves the file as the first wrote it."""
    backend, path, other = _carol_under_other_parameters(users_file, reactor, context)
    with capturedLogs() as events:
        subs = await gatherResults([backend.requestAvatarId(UsernamePassword(b"carol", b"carol's pw"))
                                    for _ in range(2)])
        await backend.close()
    assert subs == ["sub-carol", "sub-carol"]
    assert [formatEvent(e) for e in events if "upgraded" in formatEvent(e)] == [
        "password hash of 'carol' upgraded to the configured argon2id parameters"]
    [table] = tomllib.loads(path.read_text())["users"]
    assert table["password_hash"] == backend._by_login("carol").password_hash
    assert not other.check_needs_rehash(table["password_hash"]) and other.verify(table["password_hash"], "carol's pw")


@pytest_twisted.ensureDeferred
async def test_the_file_is_read_and_rewritten_off_the_reactor_thread(users_file, reactor, context, monkeypatch):
    """An upgrade at sign-in and every edit parse and fsync the whole file: never on the reactor thread."""
    on_reactor = []
    for name in ("_write_atomically", "_read"):
        original = getattr(static, name)
        monkeypatch.setattr(static, name, lambda *args, original=original: (on_reactor.append(isInIOThread()),
                                                                            original(*args))[1])
    backend, path, _ = _carol_under_other_parameters(users_file, reactor, context)
    on_reactor.clear()
    assert await backend.requestAvatarId(UsernamePassword(b"carol", b"carol's pw")) == "sub-carol"
    await backend.set_disabled("carol", True, "on leave")
    await backend.add_user(User(sub="sub-dave", login="dave"), hash_password("dave's pw", CHEAP))
    assert [user.login for user in await backend.list_users()] == ["carol", "dave"]
    await backend.remove_user("dave")
    await backend.close()
    assert len(on_reactor) >= 9 and not any(on_reactor)
    assert (await backend.user_by_login("carol")).disabled and await backend.user_by_login("dave") is None


# --- hash upgrades written after the login ------------------------------------


class InPlace(Clock):
    """
    A clock that is also a password verifier's reactor and thread pool:
    each hash is made at once, on the caller's thread, so that a test sees a
    login's whole course without running a reactor.
    """

    def callFromThread(self, f, *args, **kwargs):
        f(*args, **kwargs)

    def callInThreadWithCallback(self, on_result, f, *args, **kwargs):
        try:
            result = f(*args, **kwargs)
        except BaseException:
            on_result(False, Failure())
        else:
            on_result(True, result)


class HeldFileThread:
    """The users file's thread, running each piece of work only when the test says so."""

    def __init__(self):
        self.waiting: list = []

    def __call__(self, work, *args) -> Deferred:
        d = Deferred()
        self.waiting.append((d, work, args))
        return d

    def run_next(self) -> None:
        d, work, args = self.waiting.pop(0)
        maybeDeferred(work, *args).chainDeferred(d)

    def run_all(self) -> None:
        while self.waiting:
            self.run_next()


OTHER = argon2id_hasher(8192, 1, 1)
RUSH = ["carol", "dave", "erin", "frank", "grace"]


@pytest.fixture
def rush(tmp_path, monkeypatch):
    """
    Users whose hashes have other parameters than the verifier's, a backend
    whose file thread the test runs, and the list of the file's writes.
    """
    path = tmp_path / "users.toml"
    for login in RUSH:
        add_user(path, login=login, sub=f"sub-{login}", password_hash=hash_password(f"{login}'s pw", CHEAP))
    writes: list[Path] = []
    original = static._write_atomically
    monkeypatch.setattr(static, "_write_atomically", lambda path, text: (writes.append(path), original(path, text))[1])
    held, clock = HeldFileThread(), InPlace()
    backend = StaticIdentityBackend(path, clock, PasswordVerifier(clock, clock, OTHER), held)
    return backend, held, path, writes


def answered(backend: StaticIdentityBackend, login: str) -> list:
    """What the login has answered so far: [sub], or [] while it waits."""
    results: list = []
    backend.requestAvatarId(UsernamePassword(login.encode(), f"{login}'s pw".encode())).addBoth(results.append)
    return results


def stored_hashes(path: Path) -> dict[str, str]:
    return {table["login"]: table["password_hash"] for table in tomllib.loads(path.read_text())["users"]}


def upgraded(stored: str, login: str) -> bool:
    return not OTHER.check_needs_rehash(stored) and OTHER.verify(stored, f"{login}'s pw")


def test_a_login_answers_before_its_upgrade_is_written(rush):
    """The password was verified: the login does not wait for a whole-file rewrite queued behind others."""
    backend, held, path, writes = rush
    before = path.read_text()
    assert answered(backend, "carol") == ["sub-carol"]
    assert len(held.waiting) == 1 and path.read_text() == before and writes == []
    held.run_all()
    assert len(writes) == 1 and upgraded(stored_hashes(path)["carol"], "carol")
    assert backend._by_login("carol").password_hash == stored_hashes(path)["carol"]


def test_upgrades_arriving_during_a_write_go_into_the_next_one_together(rush):
    """A morning rush after a change of [passwords]: one more parse and dump for all who came meanwhile."""
    backend, held, path, writes = rush
    with capturedLogs() as events:
        assert answered(backend, "carol") == ["sub-carol"]
        for login in RUSH[1:]:
            assert answered(backend, login) == [f"sub-{login}"]
        assert len(held.waiting) == 1
        held.run_next()
        assert len(writes) == 1 and len(held.waiting) == 1
        held.run_next()
    assert len(writes) == 2 and not held.waiting
    stored = stored_hashes(path)
    assert all(upgraded(stored[login], login) for login in RUSH)
    assert sorted(formatEvent(e) for e in events if "upgraded" in formatEvent(e)) == [
        f"password hash of {login!r} upgraded to the configured argon2id parameters" for login in RUSH]


@pytest.mark.parametrize("how", ["operator", "admin API"])
def test_an_upgrade_keeps_a_hash_changed_since_the_login_read_it(rush, how):
    """Compare and swap per user, in a batch too: an operator's edit or a password reset wins."""
    backend, held, path, writes = rush
    assert answered(backend, "carol") == ["sub-carol"]
    assert answered(backend, "dave") == ["sub-dave"]
    new = hash_password("dave's new pw", CHEAP)
    reset: list = [None]
    if how == "operator":
        path.write_text(path.read_text().replace(backend._by_login("dave").password_hash, new))
    else:
        reset = []
        Deferred.fromCoroutine(backend.set_password_hash("dave", new)).addBoth(reset.append)
    held.run_all()
    stored = stored_hashes(path)
    assert reset == [None] and stored["dave"] == new and upgraded(stored["carol"], "carol")


def test_a_failing_upgrade_write_is_logged_once_and_the_logins_succeeded(rush, monkeypatch):
    backend, held, path, writes = rush
    write = static._write_atomically

    def full_disk_after_one(path, text):
        if writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, text)
        writes.append(path)

    monkeypatch.setattr(static, "_write_atomically", full_disk_after_one)
    before = stored_hashes(path)
    with capturedLogs() as events:
        assert [answered(backend, login) for login in RUSH[:3]] == [["sub-carol"], ["sub-dave"], ["sub-erin"]]
        held.run_all()
    assert errors(events) == [
        "password hashes of 'dave', 'erin' not upgraded to the configured argon2id parameters:"
        " [Errno 28] No space left on device"]
    text = "\n".join(formatEvent(e) for e in events)
    assert not any(h in text for h in stored_hashes(path).values()) and not any(f"{login}'s pw" in text for login in RUSH)
    stored = stored_hashes(path)
    assert upgraded(stored["carol"], "carol") and stored["dave"] == before["dave"] and stored["erin"] == before["erin"]


def test_closing_lets_the_pending_upgrades_finish_and_takes_no_more(rush):
    """Stopping the file's thread must not cut a write off: close fires once the upgrades taken are written."""
    backend, held, path, writes = rush
    assert answered(backend, "carol") == ["sub-carol"]
    assert answered(backend, "dave") == ["sub-dave"]
    closed: list = []
    backend.close().addBoth(closed.append)
    assert answered(backend, "erin") == ["sub-erin"]
    held.run_next()
    assert closed == [] and len(held.waiting) == 1
    held.run_next()
    assert closed == [None] and not held.waiting and len(writes) == 2
    stored = stored_hashes(path)
    assert upgraded(stored["carol"], "carol") and upgraded(stored["dave"], "dave") and not upgraded(stored["erin"], "erin")


# --- realm ------------------------------------------------------------------


class _Backend:
    def __init__(self, user):
        self.user = user

    def user_by_id(self, sub):
        return self.user


def test_realm_refuses_other_interfaces():
    with pytest.raises(NotImplementedError):
        UserRealm(_Backend(ALICE)).requestAvatar(ALICE.sub, None, object)


def test_realm_avatar():
    interface, avatar, logout = UserRealm(_Backend(ALICE)).requestAvatar(ALICE.sub, None, IUser).result
    assert (interface, avatar, logout()) == (IUser, ALICE, None)


def test_realm_user_removed_meanwhile():
    failures = []
    UserRealm(_Backend(None)).requestAvatar(ALICE.sub, None, IUser).addErrback(failures.append)
    assert failures[0].check(UnknownUser)


def test_an_edit_waits_for_another_process_editing_and_keeps_its_change(tmp_path):
    """
    Each worker, and the operator command, writes the whole file anew: one
    that read before another wrote wrote over its change (a hash upgrade
    lost, a disablement undone). Each holds the lock beside the file from
    its read to its write.
    """
    path = tmp_path / "users.toml"
    path.write_text(ALICE_TABLE)
    other = os.open(tmp_path / ".users.toml.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(other, fcntl.LOCK_EX)  # another process is editing
    adding = threading.Thread(target=add_user, args=(path,), kwargs={"login": "bob", "password_hash": CHEAP_HASH})
    adding.start()
    adding.join(timeout=0.5)
    assert adding.is_alive(), "the edit waits for the lock"
    path.write_text(ALICE_TABLE + "\n" + ALICE_TABLE.replace("alice", "carol").replace('sub = "', 'sub = "c'))
    os.close(other)
    adding.join(timeout=10)
    assert [user["login"] for user in tomllib.loads(path.read_text())["users"]] == ["alice", "carol", "bob"]
