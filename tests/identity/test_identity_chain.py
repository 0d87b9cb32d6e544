"""
Identity backend chains: the order of asking, the three outcomes (unknown
user: next; wrong password: stop; outage: next, and the answer when nobody
knew the user), the conformance suite through a chain of the static file and
the tests' slapd, and several [[identity]] tables in the config.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from argon2 import PasswordHasher, extract_parameters, profiles
from attrs import asdict
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import Portal
from twisted.internet.defer import fail, succeed
from twisted.logger import capturedLogs, formatEvent
from zope.interface.verify import verifyObject

from authsrv.config import parse_config
from authsrv.configsection import Section
from authsrv.identity.ldap import backend as ldap
from authsrv.identity.chain import IdentityChain
from authsrv.identity.errors import BackendUnavailable, UnknownUser
from authsrv.identity.passwords import PasswordVerifier, hash_password
from authsrv.identity.realm import UserRealm
from authsrv.identity.static import StaticIdentityBackend, add_user, create_users_file, file_thread
from authsrv.interfaces import IIdentityBackend, IUser
from authsrv.records import User
from authsrv.service import build_identity
from authsrv.testing.identity import ALICE, BOB, IdentityBackendConformance, portal_login_fails

CHEAP = PasswordHasher.from_parameters(profiles.CHEAPEST)
CAROL_SUB = "sub-carol"


def static_backend(context, path, users=()) -> StaticIdentityBackend:
    create_users_file(path)
    for user, password in users:
        add_user(path, password_hash=hash_password(password, CHEAP), **asdict(user))
    verifier = PasswordVerifier(context.reactor, context.threadpool("passwords", 2), CHEAP)
    return StaticIdentityBackend(path, context.reactor, verifier, file_thread(context))


def ldap_backend(context, config: dict):
    return ldap.from_config(Section(config, "identity[0]", context.base_dir), context)


# --- the three outcomes, with scripted backends ----------------------------------


class Scripted:
    """A backend answering from a script, noting what it was asked."""

    credentialInterfaces = IdentityChain.credentialInterfaces

    def __init__(self, check=None, users=None, lookup_error=None):
        self._check = check
        self._users = users or {}
        self._lookup_error = lookup_error
        self.asked: list = []
        self.closed = False

    def requestAvatarId(self, credentials):
        self.asked.append(("check", credentials.username))
        if isinstance(self._check, Exception):
            return fail(self._check)
        if self._check is None:
            return fail(UnknownUser("unknown"))
        return succeed(self._check)

    def _lookup(self, key):
        self.asked.append(("lookup", key))
        if self._lookup_error is not None:
            return fail(self._lookup_error)
        return succeed(self._users.get(key))

    def user_by_id(self, sub):
        return self._lookup(sub)

    def user_by_login(self, login):
        return self._lookup(login)

    def close(self):
        self.closed = True
        return succeed(None)


def check(chain, login=b"alice", password=b"pw"):
    """The chain's answer to a password check: a sub, or the failure."""
    results = []
    chain.requestAvatarId(UsernamePassword(login, password)).addBoth(results.append)
    [result] = results
    return result.value if hasattr(result, "value") else result


def lookup(d):
    results = []
    d.addBoth(results.append)
    [result] = results
    return result.value if hasattr(result, "value") else result


def test_provides_the_interface():
    chain = IdentityChain([Scripted()])
    assert verifyObject(IIdentityBackend, chain)


def test_unknown_user_asks_the_next_backend():
    first, second = Scripted(), Scripted(check="sub-2")
    assert check(IdentityChain([first, second])) == "sub-2"
    assert first.asked == second.asked == [("check", b"alice")]


def test_first_backend_that_knows_the_user_decides():
    first, second = Scripted(check="sub-1"), Scripted(check="sub-2")
    assert check(IdentityChain([first, second])) == "sub-1"
    assert second.asked == []


def test_wrong_password_stops():
    """
    The later backends are still asked, for equal timing, but about a random
    login and never the real one; their answer (here a success) is dropped.
    """
    first, second = Scripted(check=UnauthorizedLogin("wrong")), Scripted(check="sub-2")
    third = Scripted(check=BackendUnavailable("down"))
    failure = check(IdentityChain([first, second, third]))
    assert type(failure) is UnauthorizedLogin
    [(_, decoy)] = second.asked
    assert third.asked == second.asked
    assert decoy != b"alice" and len(decoy) == 32
    failure = check(IdentityChain([first, second, third]))
    assert second.asked[1] != second.asked[0]


def test_nobody_knows_the_user():
    assert isinstance(check(IdentityChain([Scripted(), Scripted()])), UnknownUser)
    assert isinstance(check(IdentityChain([])), UnknownUser)


def test_outage_then_a_backend_that_knows_the_user():
    chain = IdentityChain([Scripted(check=BackendUnavailable("down")), Scripted(check="sub-2")])
    assert check(chain) == "sub-2"


def test_outage_then_a_wrong_password_stops_as_wrong_password():
    chain = IdentityChain([Scripted(check=BackendUnavailable("down")), Scripted(check=UnauthorizedLogin("no"))])
    assert type(check(chain)) is UnauthorizedLogin


@pytest.mark.parametrize("error", [BackendUnavailable("directory down"), RuntimeError("bug")])
def test_outage_when_nobody_knew_the_user_is_unavailable(error):
    """Never "wrong password", never "unknown user": another backend may have known them."""
    with capturedLogs() as events:
        failure = check(IdentityChain([Scripted(), Scripted(check=error), Scripted()]))
    assert isinstance(failure, BackendUnavailable)
    assert not isinstance(failure, UnauthorizedLogin)
    [message] = [formatEvent(e) for e in events]
    assert "identity backend 1 (Scripted) unavailable" in message
    assert "pw" not in message.replace("unavailable", "")


def test_user_lookups_first_backend_that_knows_decides():
    first = Scripted(users={"a": ALICE})
    second = Scripted(users={"a": BOB, "b": BOB})
    chain = IdentityChain([first, second])
    assert lookup(chain.user_by_id("a")) == ALICE
    assert second.asked == []
    assert lookup(chain.user_by_id("b")) == BOB
    assert lookup(chain.user_by_login("b")) == BOB
    assert lookup(chain.user_by_id("nobody")) is None


def test_user_lookup_outage():
    """
    A lookup another backend answers goes on; with nobody knowing the user
    it is an outage, never None, which would end the user's grants.
    """
    down = Scripted(lookup_error=BackendUnavailable("down"))
    chain = IdentityChain([down, Scripted(users={"b": BOB})])
    assert lookup(chain.user_by_id("b")) == BOB
    assert isinstance(lookup(chain.user_by_id("a")), BackendUnavailable)
    assert isinstance(lookup(chain.user_by_login("a")), BackendUnavailable)
    assert isinstance(lookup(IdentityChain([Scripted(lookup_error=KeyError("x"))]).user_by_id("a")),
                      BackendUnavailable)


def test_close_closes_every_backend():
    backends = [Scripted(), Scripted()]
    lookup(IdentityChain(backends).close())
    assert all(b.closed for b in backends)


def test_portal_with_the_chain():
    """The portal holds one checker per credentials interface: the chain."""
    chain = IdentityChain([Scripted(), Scripted(check="a", users={"a": ALICE})])
    portal = Portal(UserRealm(chain), [chain])
    interface, avatar, logout = lookup(portal.login(UsernamePassword(b"alice", b"pw"), None, IUser))
    assert (interface, avatar) == (IUser, ALICE)
    down = IdentityChain([Scripted(check=BackendUnavailable("down"))])
    failure = lookup(Portal(UserRealm(down), [down]).login(UsernamePassword(b"alice", b"pw"), None, IUser))
    assert isinstance(failure, BackendUnavailable)


# --- the static file and the directory ------------------------------------------------


class TestStaticThenLdapConformance(IdentityBackendConformance):
    """The static file knows nobody: every answer comes from the directory through the chain."""

    @pytest.fixture(autouse=True)
    def _setup(self, slapd, context, tmp_path):
        self.slapd, self.context, self.path = slapd, context, tmp_path / "users.toml"

    def make_backend(self, users):
        self.slapd.seed(users)
        return IdentityChain([
            static_backend(self.context, self.path),
            ldap_backend(self.context, self.slapd.backend_config()),
        ])


class TestLdapThenStaticConformance(IdentityBackendConformance):
    """The directory (its corp subtree) knows none of the suite's users: the file answers."""

    @pytest.fixture(autouse=True)
    def _setup(self, slapd, context, tmp_path):
        self.slapd, self.context, self.path = slapd, context, tmp_path / "users.toml"

    def make_backend(self, users):
        from slapd import CORP_USERS

        directory = ldap_backend(self.context, self.slapd.backend_config(
            flavour="active_directory", user_base_dn=CORP_USERS,
            user_filter="(&(objectClass=inetOrgPerson)(sAMAccountName={login}))",
            subject_attribute=None, name_attribute=None, picture_attribute=None, chat_user_id_attribute=None,
            email_verified=None, email_verified_attribute=None, disabled_reason_attribute=None,
        ))
        return IdentityChain([directory, static_backend(self.context, self.path, users)])


class DirectoryWork:
    """Wraps a backend's directory, noting its lookups on service connections and its user binds."""

    def __init__(self, directory):
        self._directory = directory
        self.done: list[str] = []

    def check(self, user, password, timeout):
        self.done.append("bind")
        return self._directory.check(user, password, timeout)

    def run(self, operation):
        self.done.append("lookup")
        return self._directory.run(operation)

    def close(self):
        self._directory.close()


class CountingVerifier(PasswordVerifier):
    """Notes the argon2 parameters of every hash a password is checked against."""

    def __init__(self, context):
        super().__init__(context.reactor, context.threadpool("passwords", 2), CHEAP)
        self.checked: list = []

    def _check(self, password, stored_hash):
        self.checked.append(extract_parameters(self._dummy if stored_hash is None else stored_hash))
        return super()._check(password, stored_hash)


@pytest_twisted.ensureDeferred
async def test_refusals_cost_every_backends_work(slapd, context, tmp_path):
    """
    LDAP for staff, then the file for a service account: an unknown login,
    a wrong password at the directory and one at the file each cost one
    directory lookup, one bind and one password check, as chain.py's rule
    says.
    """
    path = tmp_path / "users.toml"
    create_users_file(path)
    add_user(path, login="robot", sub="sub-robot", password_hash=hash_password("robot-pw", CHEAP))
    verifier = CountingVerifier(context)
    users = StaticIdentityBackend(path, context.reactor, verifier, file_thread(context))
    directory = ldap_backend(context, slapd.backend_config())
    work = DirectoryWork(directory._directory)
    directory._directory = work
    chain = IdentityChain([directory, users])
    await portal_login_fails(chain, "alice", "warming up the service connection")
    cases = {"nobody": UnknownUser, "alice": UnauthorizedLogin, "robot": UnauthorizedLogin}
    costs = {}
    for login, failure in cases.items():
        work.done.clear()
        verifier.checked.clear()
        assert type(await portal_login_fails(chain, login, "wrong")) is failure
        costs[login] = (work.done[:], verifier.checked[:])
    assert costs["nobody"] == costs["alice"] == costs["robot"] == (
        ["lookup", "bind"], [extract_parameters(hash_password("x", CHEAP))]
    )
    await directory.close()


@pytest_twisted.ensureDeferred
async def test_directory_down_static_accounts_still_work(slapd, context, tmp_path):
    """
    LDAP for staff, then the file for service accounts: with the directory
    down the service account still logs in, staff get "try later", and a
    staff lookup is an outage, not a removed user.
    """
    service_account = User(sub="svc-backup", login="backup-robot", name="Backup robot")
    chain = IdentityChain([
        ldap_backend(context, slapd.backend_config(connect_timeout=1)),
        static_backend(context, tmp_path / "users.toml", [(service_account, "robot password")]),
    ])
    portal = Portal(UserRealm(chain), [chain])
    _, carol, _ = await portal.login(UsernamePassword(b"carol", b"carol-password"), None, IUser)
    assert carol.sub == CAROL_SUB
    slapd.stop()
    try:
        _, robot, _ = await portal.login(UsernamePassword(b"backup-robot", b"robot password"), None, IUser)
        assert robot == service_account
        with pytest.raises(UnauthorizedLogin):
            await portal.login(UsernamePassword(b"backup-robot", b"wrong"), None, IUser)
        with pytest.raises(BackendUnavailable):
            await portal.login(UsernamePassword(b"carol", b"carol-password"), None, IUser)
        with pytest.raises(BackendUnavailable):
            await chain.user_by_id(CAROL_SUB)
        assert await chain.user_by_id("svc-backup") == service_account
    finally:
        slapd.start()
    assert (await chain.user_by_id(CAROL_SUB)).login == "carol"
    await chain.close()


def test_config_takes_several_identity_tables_in_order(slapd, context, tmp_path):
    create_users_file(tmp_path / "users.toml")
    config = parse_config(
        {"identity": [{"plugin": "ldap", **slapd.backend_config()}, {"plugin": "static", "path": "users.toml"}]},
        tmp_path / "authsrv.toml",
    )
    assert [c.name for c in config.identity] == ["ldap", "static"]
    chain = build_identity(config, context)
    assert [type(b) for b in chain.backends] == [ldap.LdapIdentityBackend, StaticIdentityBackend]
    assert lookup(chain.close()) is not None

