"""
The identity backend conformance suite.

Every identity backend (static file, PostgreSQL, LDAP, a third party's
dropin) must behave the same through a twisted.cred portal: the login flow
and the backend chain rely on the distinct failures of
L{authsrv.interfaces.IIdentityBackend}. To run the suite, subclass
L{IdentityBackendConformance} in a C{Test*} class and define
C{make_backend(users)}, which seeds the backend with C{users}, a list of
C{(User, password)} pairs (normally L{seed_users}), and returns the backend
or a L{Deferred} of it. Each test closes the backend it made.

A backend that can write its users (L{authsrv.interfaces.IUserManagement})
also passes L{UserManagementConformance}: its C{make_backend()} returns
such a backend holding no user.
"""

from __future__ import annotations

import unicodedata
from contextlib import asynccontextmanager

import pytest
import pytest_twisted
from argon2 import PasswordHasher, profiles
from twisted.cred.credentials import IUsernamePassword, UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import Portal
from twisted.internet.defer import maybeDeferred
from zope.interface.verify import verifyObject

from authsrv.identity.errors import UnknownUser
from authsrv.identity.passwords import hash_password
from authsrv.identity.realm import UserRealm
from authsrv.interfaces import IIdentityBackend, IUser, IUserManagement
from authsrv.records import User

ALICE = User(
    sub="0b7c6a1e-3f7d-4a58-9a8e-alice0000001",
    login="alice",
    name="Alice Liddell",
    picture="https://pictures.example/alice.png",
    email="alice@example.org",
    email_verified=True,
    chat_user_id="80351110224678912",
)
BOB = User(sub="0b7c6a1e-3f7d-4a58-9a8e-bob000000002", login="Bob")
ZOE = User(
    sub="0b7c6a1e-3f7d-4a58-9a8e-zoe000000003",
    login="zoë.łódź",
    name="Zoë Łódź 日本",
    email="zoe@example.org",
)
MALLORY = User(
    sub="0b7c6a1e-3f7d-4a58-9a8e-mallory00004",
    login="mallory",
    name="Mallory",
    disabled=True,
    disabled_reason="spam reported by moderators",
)

PASSWORDS = {
    ALICE.sub: "correct horse battery staple",
    BOB.sub: "hunter2 but much longer",
    ZOE.sub: "pässwörd 🔑 パスワード",
    MALLORY.sub: "mallory's password",
}

INJECTION_LOGINS = (
    "*",
    "*)(uid=*",
    "alice)(|(uid=*",
    "alice*",
    "' OR 1=1 --",
    "alice' --",
    '" OR ""="',
    "%",
    "_lice",
    "alice%",
    "alice\x00",
    "\\61lice",
)
"""Logins shaped like LDAP filter, SQL or LIKE injections: all unknown."""


def seed_users() -> list[tuple[User, str]]:
    """
    The standard users and their passwords: Alice with every claim, Bob with
    none (and a capitalized login), Zoë with a non-ASCII login and password,
    and Mallory, disabled with a reason.
    """
    return [(user, PASSWORDS[user.sub]) for user in (ALICE, BOB, ZOE, MALLORY)]


async def portal_login(backend, username, password) -> User:
    """Log in through a real portal, as the login flow does; returns the avatar."""
    portal = Portal(UserRealm(backend), [backend])
    interface, avatar, logout = await portal.login(UsernamePassword(username, password), None, IUser)
    assert interface is IUser
    assert isinstance(avatar, User)
    logout()
    return avatar


async def portal_login_fails(backend, username, password) -> Exception:
    """The failure of a login that must fail."""
    with pytest.raises(UnauthorizedLogin) as info:
        await portal_login(backend, username, password)
    return info.value


class IdentityBackendConformance:
    """
    Mixin of tests every L{IIdentityBackend} must pass; see the module
    docstring for the C{make_backend} hook.
    """

    def make_backend(self, users):
        raise NotImplementedError("a conformance test class defines make_backend(users)")

    @asynccontextmanager
    async def backend(self):
        backend = await maybeDeferred(self.make_backend, seed_users())
        try:
            yield backend
        finally:
            await maybeDeferred(backend.close)


    @pytest_twisted.ensureDeferred
    async def test_provides_interface(self):
        async with self.backend() as backend:
            assert verifyObject(IIdentityBackend, backend)
            assert IUsernamePassword in backend.credentialInterfaces

    @pytest_twisted.ensureDeferred
    async def test_right_password_gives_user_with_claims(self):
        async with self.backend() as backend:
            for user, password in seed_users():
                assert await portal_login(backend, user.login, password) == user

    @pytest_twisted.ensureDeferred
    async def test_bytes_credentials(self):
        """IUsernamePassword documents bytes: UTF-8 bytes work as text does."""
        async with self.backend() as backend:
            avatar = await portal_login(
                backend, ZOE.login.encode("utf-8"), PASSWORDS[ZOE.sub].encode("utf-8")
            )
            assert avatar == ZOE
            failure = await portal_login_fails(backend, b"alice", b"wrong")
            assert not isinstance(failure, UnknownUser)

    @pytest_twisted.ensureDeferred
    async def test_wrong_password_is_not_unknown_user(self):
        async with self.backend() as backend:
            for password in (
                "wrong",
                "",
                PASSWORDS[BOB.sub],
                PASSWORDS[ALICE.sub].upper(),
                PASSWORDS[ALICE.sub] + " ",
                "' OR '1'='1",
                "*",
            ):
                failure = await portal_login_fails(backend, "alice", password)
                assert not isinstance(failure, UnknownUser), password

    @pytest_twisted.ensureDeferred
    async def test_passwords_no_user_can_have_are_wrong_passwords(self):
        """
        A NUL, bytes that are not UTF-8, a lone surrogate or a megabyte of
        text: a plain refusal (wrong password for a known login, unknown
        user for an unknown one), never an outage or a crash.
        """
        async with self.backend() as backend:
            for password in ("correct\x00", PASSWORDS[ALICE.sub] + "\x00", b"\xff\xfe", "pass\ud800word",
                             "x" * 1_000_000):
                failure = await portal_login_fails(backend, "alice", password)
                assert not isinstance(failure, UnknownUser), password[:20]
                failure = await portal_login_fails(backend, "nobody", password)
                assert isinstance(failure, UnknownUser), password[:20]
            assert await portal_login(backend, "alice", PASSWORDS[ALICE.sub]) == ALICE

    @pytest_twisted.ensureDeferred
    async def test_unknown_login(self):
        async with self.backend() as backend:
            for login in ("nobody", "", "alice2", "alic", " alice"):
                failure = await portal_login_fails(backend, login, PASSWORDS[ALICE.sub])
                assert isinstance(failure, UnknownUser), login

    @pytest_twisted.ensureDeferred
    async def test_disabled_user_is_reported(self):
        """The backend reports the flag; refusing the login is the flow's job."""
        async with self.backend() as backend:
            avatar = await portal_login(backend, "mallory", PASSWORDS[MALLORY.sub])
            assert avatar.disabled is True
            assert avatar.disabled_reason == MALLORY.disabled_reason
            assert await backend.user_by_id(MALLORY.sub) == MALLORY
            failure = await portal_login_fails(backend, "mallory", "wrong")
            assert not isinstance(failure, UnknownUser)

    @pytest_twisted.ensureDeferred
    async def test_login_is_case_insensitive(self):
        async with self.backend() as backend:
            for login in ("ALICE", "Alice", "aLiCe"):
                assert await portal_login(backend, login, PASSWORDS[ALICE.sub]) == ALICE
            for login in ("bob", "BOB"):
                assert await portal_login(backend, login, PASSWORDS[BOB.sub]) == BOB
            failure = await portal_login_fails(backend, "ALICE", "wrong")
            assert not isinstance(failure, UnknownUser)
            assert await backend.user_by_login("ALICE") == ALICE

    @pytest_twisted.ensureDeferred
    async def test_password_is_case_sensitive(self):
        async with self.backend() as backend:
            await portal_login_fails(backend, "Bob", PASSWORDS[BOB.sub].upper())

    @pytest_twisted.ensureDeferred
    async def test_unicode_login_and_password(self):
        async with self.backend() as backend:
            assert await portal_login(backend, ZOE.login, PASSWORDS[ZOE.sub]) == ZOE
            failure = await portal_login_fails(backend, ZOE.login, "passwörd 🔑")
            assert not isinstance(failure, UnknownUser)
            assert await backend.user_by_login(ZOE.login) == ZOE

    @pytest_twisted.ensureDeferred
    async def test_login_is_compared_in_canonical_unicode(self):
        """A login typed decomposed (e and a combining diaeresis), or in capitals, is the same person's."""
        async with self.backend() as backend:
            decomposed = unicodedata.normalize("NFD", ZOE.login)
            assert decomposed != ZOE.login
            for login in (decomposed, decomposed.upper(), ZOE.login.upper()):
                assert await portal_login(backend, login, PASSWORDS[ZOE.sub]) == ZOE, ascii(login)
                assert await backend.user_by_login(login) == ZOE, ascii(login)

    @pytest_twisted.ensureDeferred
    async def test_injection_shaped_logins_are_unknown(self):
        async with self.backend() as backend:
            for login in INJECTION_LOGINS:
                failure = await portal_login_fails(backend, login, PASSWORDS[ALICE.sub])
                assert isinstance(failure, UnknownUser), login
                assert await backend.user_by_login(login) is None, login

    @pytest_twisted.ensureDeferred
    async def test_user_by_id(self):
        async with self.backend() as backend:
            for user, _ in seed_users():
                assert await backend.user_by_id(user.sub) == user
            for sub in ("no-such-sub", "", "*", "' OR 1=1 --", ALICE.sub.upper()):
                assert await backend.user_by_id(sub) is None, sub

    @pytest_twisted.ensureDeferred
    async def test_user_by_login(self):
        async with self.backend() as backend:
            for user, _ in seed_users():
                assert await backend.user_by_login(user.login) == user
            for login in ("nobody", "", ALICE.sub):
                assert await backend.user_by_login(login) is None, login


CHEAP = PasswordHasher.from_parameters(profiles.CHEAPEST)
"""Hashes made quickly: the backend checks any argon2id parameters."""


class UserManagementConformance:
    """
    Mixin of tests every L{IUserManagement} backend must pass: what one
    writes, it serves at once, and logins, refusals and orders are the same
    in every backend. C{make_backend()} returns an empty backend (or a
    L{Deferred} of it).
    """

    def make_backend(self):
        raise NotImplementedError("a conformance test class defines make_backend()")

    @asynccontextmanager
    async def backend(self):
        backend = await maybeDeferred(self.make_backend)
        try:
            yield backend
        finally:
            await maybeDeferred(backend.close)

    async def seed(self, backend) -> None:
        for user, password in seed_users():
            assert await backend.add_user(user, hash_password(password, CHEAP)) == user

    @pytest_twisted.ensureDeferred
    async def test_provides_interfaces(self):
        async with self.backend() as backend:
            assert verifyObject(IUserManagement, backend)
            assert verifyObject(IIdentityBackend, backend)
            assert await backend.list_users() == []

    @pytest_twisted.ensureDeferred
    async def test_added_users_log_in_and_are_listed(self):
        async with self.backend() as backend:
            await self.seed(backend)
            for user, password in seed_users():
                assert await portal_login(backend, user.login, password) == user
                assert await backend.user_by_id(user.sub) == user
            assert await backend.list_users() == [ALICE, BOB, MALLORY, ZOE]

    @pytest_twisted.ensureDeferred
    async def test_add_user_refuses_taken_login_or_sub(self):
        async with self.backend() as backend:
            await self.seed(backend)
            again = hash_password("pw", CHEAP)
            with pytest.raises(ValueError, match="login 'alice' is already taken"):
                await backend.add_user(User(sub="someone-new", login="ALICE"), again)
            with pytest.raises(ValueError, match=f"sub {ALICE.sub!r} is already taken"):
                await backend.add_user(User(sub=ALICE.sub, login="carol"), again)
            with pytest.raises(ValueError, match="argon2id"):
                await backend.add_user(User(sub="carol", login="carol"), "plain text")
            assert len(await backend.list_users()) == len(seed_users())

    @pytest_twisted.ensureDeferred
    async def test_set_password_hash(self):
        async with self.backend() as backend:
            await self.seed(backend)
            await backend.set_password_hash("ALICE", hash_password("a new password", CHEAP))
            assert await portal_login(backend, "alice", "a new password") == ALICE
            failure = await portal_login_fails(backend, "alice", PASSWORDS[ALICE.sub])
            assert not isinstance(failure, UnknownUser)
            assert await portal_login(backend, "Bob", PASSWORDS[BOB.sub]) == BOB
            with pytest.raises(ValueError, match="argon2id"):
                await backend.set_password_hash("alice", "plain text")

    @pytest_twisted.ensureDeferred
    async def test_disable_and_enable(self):
        async with self.backend() as backend:
            await self.seed(backend)
            await backend.set_disabled("Alice", True, "left the project")
            disabled = await backend.user_by_login("alice")
            assert (disabled.disabled, disabled.disabled_reason) == (True, "left the project")
            assert await portal_login(backend, "alice", PASSWORDS[ALICE.sub]) == disabled
            await backend.set_disabled("mallory", False)
            enabled = await backend.user_by_id(MALLORY.sub)
            assert (enabled.disabled, enabled.disabled_reason) == (False, None)
            await backend.set_disabled("alice", False, "ignored when enabling")
            assert await backend.user_by_login("alice") == ALICE

    @pytest_twisted.ensureDeferred
    async def test_remove_user(self):
        async with self.backend() as backend:
            await self.seed(backend)
            await backend.remove_user("ZOË.ŁÓDŹ")
            assert await backend.user_by_id(ZOE.sub) is None
            assert isinstance(await portal_login_fails(backend, ZOE.login, PASSWORDS[ZOE.sub]), UnknownUser)
            assert await backend.list_users() == [ALICE, BOB, MALLORY]

    @pytest_twisted.ensureDeferred
    async def test_unknown_login_is_refused(self):
        async with self.backend() as backend:
            await self.seed(backend)
            for login in ("nobody", "alice*", "' OR 1=1 --", "alice\x00", "a\ud800"):
                with pytest.raises(ValueError, match="no user with login"):
                    await backend.set_password_hash(login, hash_password("pw", CHEAP))
                with pytest.raises(ValueError, match="no user with login"):
                    await backend.set_disabled(login, True, "x")
                with pytest.raises(ValueError, match="no user with login"):
                    await backend.remove_user(login)
            assert await backend.list_users() == [ALICE, BOB, MALLORY, ZOE]
