"""
The LDAP identity backend against the tests' own slapd (tests/slapd.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import socket
import time
import tomllib
import uuid
from contextlib import asynccontextmanager, contextmanager
from html import unescape as html_unescape
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import attrs
import pytest
import pytest_twisted
import requests
from twisted.cred.credentials import UsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.cred.portal import Portal
from twisted.internet.defer import gatherResults
from twisted.internet import reactor
from twisted.internet.task import Clock, deferLater
from twisted.logger import capturedLogs, formatEvent
from twisted.python.threadable import isInIOThread

from conftest import admin, free_port
from slapd import (
    CORP_GROUPS, CORP_USERS, GROUPS, PEOPLE, SERVICE_DN, SERVICE_PASSWORD, SERVICE_SIZE_LIMIT, SUFFIX, user_attributes,
    user_dn,
)

from authsrv.config import PluginChoice
from authsrv.configsection import ConfigError, Section
from authsrv.flows.standing import standing
from authsrv.identity.cache import DEFAULT_SECONDS
from authsrv.plugins import find_factory
from authsrv.records import Ban
from authsrv.service import standing_cache
from authsrv.testing.memory import MemoryStore
from authsrv.context import PluginContext
from authsrv.identity.chain import IdentityChain
from authsrv.identity.errors import BackendUnavailable, UnknownUser
from authsrv.identity.ldap import backend as ldap
from authsrv.identity.ldap.directory import Directory, close_connection
from authsrv.identity.ldap.config import settings_from_config
from authsrv.identity.realm import UserRealm
from authsrv.interfaces import IUser
from authsrv.records import User
from authsrv.testing.identity import ALICE, INJECTION_LOGINS, MALLORY, PASSWORDS, IdentityBackendConformance

CAROL_SUB = "sub-carol"


def backend(context, config: dict):
    return ldap.from_config(Section(config, "identity[0]", context.base_dir), context)


class TestLdapConformance(IdentityBackendConformance):
    @pytest.fixture(autouse=True)
    def _setup(self, slapd, context):
        self.slapd = slapd
        self.context = context

    def make_backend(self, users):
        self.slapd.seed(users)
        return backend(self.context, self.slapd.backend_config())


# --- helpers ----------------------------------------------------------------------


async def log_in(backend, login: str, password: str) -> User:
    portal = Portal(UserRealm(backend), [backend])
    _, user, _ = await portal.login(UsernamePassword(login.encode(), password.encode()), None, IUser)
    return user


async def refused(backend, login: str, password: str) -> Exception:
    with pytest.raises(UnauthorizedLogin) as info:
        await log_in(backend, login, password)
    return info.value


@asynccontextmanager
async def opened(context, config: dict):
    directory = backend(context, config)
    try:
        yield directory
    finally:
        await directory.close()


def ad_config(slapd_server, **overrides) -> dict:
    """The Active Directory flavour over the directory's corp subtree, with AD's defaults."""
    return slapd_server.backend_config(**{
        "flavour": "active_directory",
        "user_base_dn": CORP_USERS,
        "user_filter": "(&(objectClass=inetOrgPerson)(sAMAccountName={login}))",
        "subject_attribute": None, "name_attribute": None, "picture_attribute": None,
        "chat_user_id_attribute": None, "email_verified": None, "email_verified_attribute": None,
        "disabled_reason_attribute": None,
        **overrides,
    })


@contextmanager
def directory_down(slapd_server):
    slapd_server.stop()
    try:
        yield
    finally:
        slapd_server.start()


class Recorder:
    """Wraps a backend's directory, noting every bind it opens."""

    def __init__(self, directory):
        self._directory = directory
        self.binds: list[tuple[str | None, bytes | None]] = []
        self.threads: list[bool] = []

    def check(self, user, password, timeout):
        self.binds.append((user, password))
        self.threads.append(isInIOThread())
        return self._directory.check(user, password, timeout)

    def run(self, operation):
        self.threads.append(isInIOThread())
        return self._directory.run(operation)

    def close(self):
        self._directory.close()


def recorded(directory) -> Recorder:
    recorder = Recorder(directory._directory)
    directory._directory = recorder
    return recorder


class Operations:
    """
    Wraps a backend's directory, noting each directory operation the backend
    makes, in order: searches on service connections, and user binds
    (on connections kept for them) with the DN and password sent.
    """

    def __init__(self, directory):
        self._directory = directory
        self.done: list[str] = []
        self.binds: list[tuple[str, bytes]] = []

    def check(self, user, password, timeout):
        self.done.append("bind")
        self.binds.append((user, password))
        return self._directory.check(user, password, timeout)

    def run(self, operation):
        return self._directory.run(lambda connection: operation(_CountingConnection(connection, self.done)))

    def close(self):
        self._directory.close()

    def take(self) -> list[str]:
        done, self.done = self.done, []
        return done


class _CountingConnection:
    def __init__(self, connection, done: list[str]):
        self._connection, self._done = connection, done

    def search(self, *args, **kwargs):
        self._done.append("search")
        return self._connection.search(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._connection, name)


# --- configuration -------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"urls": []}, "identity[0].urls: must name at least one directory server"),
        ({"urls": ["http://127.0.0.1"]}, "identity[0].urls[0]: 'http://127.0.0.1' is not an ldap://host[:port]"),
        ({"urls": ["ldap://"]}, "identity[0].urls[0]: 'ldap://' is not an ldap://host[:port]"),
        ({"urls": ["ldap://h:99999"]}, "identity[0].urls[0]: 'ldap://h:99999' has a bad port"),
        ({"urls": ["ldap://h/dc=x"]}, "identity[0].urls[0]: 'ldap://h/dc=x' is not an ldap://host[:port]"),
        ({"urls": ["ldaps://h"], "start_tls": True}, "identity[0].start_tls: applies to ldap:// URLs"),
        ({"start_tls": False}, "identity[0].ca_file: is only used with TLS"),
        ({"ca_file": "/nonexistent/ca.pem"}, "identity[0].ca_file: /nonexistent/ca.pem is not a readable file"),
        ({"bind_password_file": None}, "identity[0].bind_password_env: is required with bind_dn"),
        ({"bind_dn": None}, "identity[0].bind_dn: is required with a bind password"),
        ({"bind_password": "x"}, "identity[0].bind_password: secrets are not written in the config file"),
        ({"bind_dn": "not a dn"}, "identity[0].bind_dn: 'not a dn' is not a DN"),
        ({"user_base_dn": None}, "identity[0].user_base_dn: is required"),
        ({"user_filter": "(uid=alice)"}, "identity[0].user_filter: must contain {login}"),
        ({"user_filter": "(uid={login}"}, "identity[0].user_filter: '(uid={login}' is not an LDAP filter"),
        ({"email_verified": "sometimes"}, "identity[0].email_verified: must be one of 'always', 'never', 'attribute'"),
        ({"email_verified_attribute": None}, "identity[0].email_verified_attribute: is required with"),
        ({"email_verified": "always"}, "identity[0].email_verified_attribute: is required with"),
        ({"name_attribute": "cn)(uid=*"}, "identity[0].name_attribute: 'cn)(uid=*' is not an attribute name"),
        ({"required_groups": [GROUPS, "nope"]}, "identity[0].required_groups[1]: 'nope' is not a DN"),
        ({"required_groups": [f"cn=staff,{GROUPS}"]}, "identity[0].group_base_dn: is required to find groups by member"),
        ({"group_membership": "members"}, "identity[0].group_membership: must be one of 'member', 'uniqueMember', 'memberOf'"),
        ({"group_nesting_depth": 0}, "identity[0].group_nesting_depth: must be at least 1"),
        ({"disabled_rule": ["nsAccountLock", "locked"]}, "identity[0].disabled_rule[1]: must be one of 'nsAccountLock'"),
        ({"search_timeout": 0}, "identity[0].search_timeout: must be at least 1 second"),
        ({"pool_size": 0}, "identity[0].pool_size: must be at least 1"),
        ({"flavour": "novell"}, "identity[0].flavour: must be one of 'openldap', 'active_directory'"),
        ({"password_attribute": "userPassword"}, "identity[0].password_attribute: unknown key"),
    ],
)
def test_config_mistakes_name_the_key(slapd, context, overrides, message):
    with pytest.raises(ConfigError) as info:
        backend(context, slapd.backend_config(**overrides))
    assert str(info.value).startswith(message)
    assert SERVICE_PASSWORD not in str(info.value)


def test_flavour_defaults(slapd):
    minimal = {"urls": [slapd.url], "user_base_dn": PEOPLE}
    openldap = settings_from_config(Section(dict(minimal), "identity[0]", Path(".")))
    assert (openldap.login_attribute, openldap.subject_attribute, openldap.group_membership) == (
        "uid", "entryUUID", "member")
    assert openldap.disabled_rules == ("nsAccountLock", "pwdAccountLockedTime")
    assert openldap.email_verified == "never" and openldap.bind_dn is None
    ad = settings_from_config(Section({**minimal, "flavour": "active_directory"}, "identity[0]", Path(".")))
    assert (ad.login_attribute, ad.subject_attribute, ad.name_attribute, ad.group_membership) == (
        "sAMAccountName", "objectGUID", "displayName", "memberOf")
    assert ad.disabled_rules == ("userAccountControl",)
    assert "sAMAccountName={login}" in ad.user_filter


def test_readme_examples_are_valid(slapd, tmp_path, monkeypatch):
    """The README's OpenLDAP and Active Directory examples pass validation as written (secrets aside)."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    part = readme[readme.index("## LDAP and Active Directory"):readme.index("## Backend chains")]
    examples = [tomllib.loads(block)["identity"][0] for block in re.findall(r"```toml\n(.*?)```", part, re.S)]
    assert [e["flavour"] for e in examples] == ["openldap", "active_directory"]
    monkeypatch.setenv("AUTHSRV_LDAP_BIND_PASSWORD", "x")
    (tmp_path / "bind").write_text("x")
    for example in examples:
        assert example.pop("plugin") == "ldap"
        example.update(ca_file=str(slapd.ca_file), **({"bind_password_file": str(tmp_path / "bind")}
                                                       if "bind_password_file" in example else {}))
        settings = settings_from_config(Section(example, "identity[0]", tmp_path))
        assert settings.required_groups and settings.bind_password == "x"


def test_check_only_builds_nothing(slapd, tmp_path, reactor):
    context = PluginContext(reactor, tmp_path, check_only=True)
    assert backend(context, slapd.backend_config()) is None
    with pytest.raises(ConfigError):
        backend(context, slapd.backend_config(user_filter="(uid=x)"))


def test_bind_password_never_in_repr(slapd, context):
    settings = settings_from_config(Section(slapd.backend_config(), "identity[0]", context.base_dir))
    assert settings.bind_password == SERVICE_PASSWORD
    assert SERVICE_PASSWORD not in repr(settings)


# --- logins ---------------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_openldap_defaults_on_stock_entries(slapd, context):
    """Only the URL and base: entryUUID is the sub, uid the login, cn the name, mail unverified."""
    async with opened(context, {"urls": [slapd.url], "user_base_dn": PEOPLE}) as directory:
        carol = await log_in(directory, "carol", "carol-password")
        assert uuid.UUID(carol.sub) and carol.sub == carol.sub.lower()
        assert (carol.login, carol.name, carol.email, carol.email_verified) == (
            "carol", "Carol Staff", "carol@example.org", False)
        assert await directory.user_by_id(carol.sub) == carol
        assert (await directory.user_by_login("gina")).disabled is True
        assert (await directory.user_by_login("mallory")).disabled_reason == ldap.DISABLED_REASON


@pytest_twisted.ensureDeferred
async def test_injection_shaped_logins_match_nobody(slapd, context):
    """Each is escaped: none matches a user, even with a filter that uses {login} twice."""
    config = slapd.backend_config(user_filter="(&(objectClass=inetOrgPerson)(|(uid={login})(mail={login})))",
                                  login_attribute="uid")
    async with opened(context, config) as directory:
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB
        for login in (*INJECTION_LOGINS, "car*", "*)(objectClass=*", "carol)(uid=dave", "c\\2arol", "carol\x00x"):
            failure = await refused(directory, login, "carol-password")
            assert isinstance(failure, UnknownUser), login
            assert await directory.user_by_login(login) is None, login
        for sub in ("*", "sub-*", "sub-carol)(uid=*", CAROL_SUB.upper(), ""):
            assert await directory.user_by_id(sub) is None, sub


@pytest_twisted.ensureDeferred
async def test_subjects_no_entry_can_have_are_no_one_not_an_outage(slapd, context):
    """
    user-access and chat-token take any JSON string as a sub, a lone
    surrogate too, which no LDAP request can encode: such a sub, like one
    with a control or non-ASCII character, is no one (user-access's 404),
    never "identity backend unavailable" (its 503).
    """
    subs = ("\ud800", CAROL_SUB + "\udcff", CAROL_SUB + "\x00", "sub-c\u00e4rol", "\ufeff" + CAROL_SUB)
    for config in (slapd.backend_config(), {"urls": [slapd.url], "user_base_dn": PEOPLE}):
        async with opened(context, config) as directory:
            chain = IdentityChain([directory])
            for sub in subs:
                assert await chain.user_by_id(sub) is None, sub
                assert (await standing(chain, MemoryStore(), sub, 0)).user is None, sub
    async with opened(context, slapd.backend_config()) as directory:
        assert (await IdentityChain([directory]).user_by_id(CAROL_SUB)).login == "carol"


@pytest_twisted.ensureDeferred
async def test_empty_password_is_never_sent(slapd, context):
    """An empty simple bind is an anonymous bind, which the directory would accept."""
    for config in (slapd.backend_config(), slapd.backend_config(bind_dn=None, bind_password_file=None)):
        async with opened(context, config) as directory:
            recorder = recorded(directory)
            for login in ("carol", "alice"):
                failure = await refused(directory, login, "")
                assert not isinstance(failure, UnknownUser)
            assert [user for user, _ in recorder.binds if user and user != SERVICE_DN] == []
            assert isinstance(await refused(directory, "nobody", ""), UnknownUser)


@pytest.mark.parametrize("password", ["wrong", ""])
@pytest_twisted.ensureDeferred
async def test_unknown_user_and_wrong_password_do_the_same_operations(slapd, context, password):
    """
    Through the login path (a portal over the identity chain): a search,
    then a bind (as a DN no entry has, with a random
    password, for the unknown login), or only the search for an empty
    password; the failures stay distinct for the chain.
    """
    async with opened(context, slapd.backend_config()) as directory:
        chain = IdentityChain([directory])
        operations = recorded_operations(directory)
        await log_in(chain, "alice", PASSWORDS[ALICE.sub])
        operations.take()
        assert type(await refused(chain, "nobody", password)) is UnknownUser
        unknown = operations.take()
        assert type(await refused(chain, "alice", password)) is UnauthorizedLogin
        wrong = operations.take()
    assert unknown == wrong == (["search", "bind"] if password else ["search"])
    if password:
        (decoy_dn, decoy_password), (dn, sent) = operations.binds[1:]
        assert dn == user_dn("alice") and sent == b"wrong"
        assert decoy_dn.endswith("," + PEOPLE) and decoy_dn != dn
        assert decoy_password != b"wrong" and len(decoy_password) == len(b"wrong")


def recorded_operations(directory) -> Operations:
    operations = Operations(directory._directory)
    directory._directory = operations
    return operations


@pytest_twisted.ensureDeferred
async def test_anonymous_search(slapd, context):
    """Without bind_dn the search is anonymous; the password is still checked by a bind."""
    async with opened(context, slapd.backend_config(bind_dn=None, bind_password_file=None)) as directory:
        assert (await log_in(directory, "carol", "carol-password")).email == "carol@example.org"
        assert not isinstance(await refused(directory, "carol", "wrong"), UnknownUser)


@pytest_twisted.ensureDeferred
async def test_every_directory_operation_runs_off_the_reactor_thread(slapd, context):
    async with opened(context, slapd.backend_config()) as directory:
        recorder = recorded(directory)
        await log_in(directory, "carol", "carol-password")
        await directory.user_by_login("carol")
        await refused(directory, "carol", "wrong")
        assert recorder.threads and not any(recorder.threads)


@pytest_twisted.ensureDeferred
async def test_passwords_are_never_logged(slapd, context, tmp_path):
    wrong_service_password = tmp_path / "wrong"
    wrong_service_password.write_text("not-the-service-password")
    with capturedLogs() as events:
        async with opened(context, slapd.backend_config()) as directory:
            await refused(directory, "carol", "a wrong pässword")
            await log_in(directory, "carol", "carol-password")
        async with opened(context, slapd.backend_config(bind_password_file=str(wrong_service_password))) as directory:
            with pytest.raises(BackendUnavailable):
                await log_in(directory, "carol", "carol-password")
    text = "\n".join(formatEvent(e) for e in events)
    assert "refused the bind of bind_dn" in text and SERVICE_DN in text
    for secret in ("a wrong pässword", "carol-password", SERVICE_PASSWORD, "not-the-service-password"):
        assert secret not in text


# --- groups -----------------------------------------------------------------------------


def staff_config(slapd_server, depth: int, group: str = "staff", **overrides) -> dict:
    return slapd_server.backend_config(
        required_groups=[f"cn={group},{GROUPS}"], group_base_dn=GROUPS, group_nesting_depth=depth, **overrides
    )


async def disabled_reasons(directory, *logins) -> dict:
    return {login: (await directory.user_by_login(login)).disabled_reason for login in logins}


@pytest_twisted.ensureDeferred
async def test_nested_groups_up_to_the_bound(slapd, context):
    """carol is in staff directly, dave through team-a (depth 2), erin through team-b and squad (depth 3)."""
    async with opened(context, staff_config(slapd, 2)) as directory:
        assert await disabled_reasons(directory, "carol", "dave", "erin", "frank") == {
            "carol": None, "dave": None, "erin": ldap.NOT_IN_GROUPS, "frank": ldap.NOT_IN_GROUPS,
        }
        erin = await log_in(directory, "erin", "erin-password")
        assert (erin.disabled, erin.disabled_reason) == (True, ldap.NOT_IN_GROUPS)
        assert (await directory.user_by_id("sub-dave")).disabled is False
    async with opened(context, staff_config(slapd, 3)) as directory:
        assert await disabled_reasons(directory, "erin") == {"erin": None}
    async with opened(context, staff_config(slapd, 1)) as directory:
        assert await disabled_reasons(directory, "carol", "dave") == {"carol": None, "dave": ldap.NOT_IN_GROUPS}


@pytest_twisted.ensureDeferred
async def test_group_cycles_end(slapd, context):
    """loop-a and loop-b contain each other; heidi is in loop-b."""
    async with opened(context, staff_config(slapd, 50, "loop-a")) as directory:
        assert await disabled_reasons(directory, "heidi", "carol") == {"heidi": None, "carol": ldap.NOT_IN_GROUPS}
    async with opened(context, staff_config(slapd, 50)) as directory:
        assert await disabled_reasons(directory, "heidi") == {"heidi": ldap.NOT_IN_GROUPS}


@pytest_twisted.ensureDeferred
async def test_unique_member_groups(slapd, context):
    async with opened(context, staff_config(slapd, 5, "auditors", group_membership="uniqueMember")) as directory:
        assert await disabled_reasons(directory, "ivan", "carol") == {"ivan": None, "carol": ldap.NOT_IN_GROUPS}


@pytest_twisted.ensureDeferred
async def test_a_group_search_cut_short_by_the_size_limit_is_an_outage_not_a_lost_membership(slapd, context):
    """
    quinn is in more groups than the directory answers the service account
    in one search (its size limit): a required group among those it left
    out is not a membership lost, which would end quinn's grants at the
    next refresh, but an outage that names the cause. Found among those it
    did answer, it counts.
    """
    quinn = User(sub="sub-quinn", login="quinn", name="Quinn")
    dn = user_dn("quinn")
    groups = [f"cn=quinn-{i:02},{GROUPS}" for i in range(SERVICE_SIZE_LIMIT + 5)]
    slapd.put(dn, user_attributes(quinn, "quinn-password"))
    try:
        for group in groups:
            slapd.put(group, {"objectClass": ["groupOfNames"], "cn": group[3:group.index(",")], "member": [dn]})
        async with opened(context, slapd.backend_config(required_groups=[groups[-1]], group_base_dn=GROUPS,
                                                        group_membership="member")) as directory:
            with pytest.raises(BackendUnavailable, match="size limit"):
                await directory.user_by_id(quinn.sub)
        async with opened(context, slapd.backend_config(required_groups=[groups[0]], group_base_dn=GROUPS,
                                                        group_membership="member")) as directory:
            assert (await directory.user_by_id(quinn.sub)).disabled is False
    finally:
        for entry in (dn, *groups):
            slapd.delete(entry)


@pytest_twisted.ensureDeferred
async def test_several_required_groups_any_suffices(slapd, context):
    config = slapd.backend_config(required_groups=[f"cn=auditors,{GROUPS}", f"CN=Team-A, {GROUPS.upper()}"],
                                  group_base_dn=GROUPS, group_membership="member")
    async with opened(context, config) as directory:
        assert await disabled_reasons(directory, "dave", "ivan", "carol") == {
            "dave": None, "ivan": ldap.NOT_IN_GROUPS, "carol": ldap.NOT_IN_GROUPS,
        }


# --- disabled accounts --------------------------------------------------------------------


@pytest_twisted.ensureDeferred
async def test_password_policy_lock(slapd, context):
    """gina is locked by ppolicy: her bind fails, and the backend reports her disabled."""
    async with opened(context, slapd.backend_config()) as directory:
        failure = await refused(directory, "gina", "gina-password")
        assert not isinstance(failure, UnknownUser)
        gina = await directory.user_by_id("sub-gina")
        assert (gina.disabled, gina.disabled_reason) == (True, ldap.DISABLED_REASON)
    async with opened(context, slapd.backend_config(disabled_rule=[])) as directory:
        assert (await directory.user_by_id("sub-gina")).disabled is False
        assert (await directory.user_by_id(MALLORY.sub)).disabled is False


@pytest_twisted.ensureDeferred
async def test_a_lockout_after_failed_passwords_refuses_logins_but_is_not_a_disabled_account(slapd, context):
    """
    Anyone who knows olga's login can make the password policy lock her
    account (two wrong passwords here): the directory then refuses her
    password, but her standing stays good, or a stranger could end her
    sessions everywhere (refresh, UserInfo, user-access's banned). The
    permanent lock a password administrator sets (000001010000Z, as gina's)
    disables the account.
    """
    policy = f"cn=two-strikes,ou=policies,{SUFFIX}"
    olga = User(sub="sub-olga", login="olga", name="Olga")
    dn = user_dn("olga")
    slapd.put(policy, {"objectClass": ["organizationalRole", "pwdPolicy"], "cn": "two-strikes",
                       "pwdAttribute": "userPassword", "pwdLockout": "TRUE", "pwdMaxFailure": "2",
                       "pwdLockoutDuration": "0"})
    slapd.put(dn, {**user_attributes(olga, "olga-password"), "pwdPolicySubentry": policy})
    try:
        async with opened(context, slapd.backend_config()) as directory:
            assert await log_in(directory, "olga", "olga-password") == olga
            for _ in range(2):
                assert not isinstance(await refused(directory, "olga", "a stranger's guess"), UnknownUser)
            # slapd may record the lock after it answers the bind that caused it; on a busy machine the
            # next bind could come first.
            deadline = time.monotonic() + 10
            while not slapd.operational(dn, "pwdAccountLockedTime"):
                assert time.monotonic() < deadline, "the directory did not lock olga after two wrong passwords"
                await deferLater(reactor, 0.05, lambda: None)
            assert not isinstance(await refused(directory, "olga", "olga-password"), UnknownUser)
            assert await directory.user_by_id(olga.sub) == olga
            assert await directory.user_by_login("olga") == olga

            slapd.modify(dn, pwdAccountLockedTime="000001010000Z")
            locked = await directory.user_by_id(olga.sub)
            assert (locked.disabled, locked.disabled_reason) == (True, ldap.DISABLED_REASON)
    finally:
        slapd.delete(dn)
        slapd.delete(policy)


@pytest_twisted.ensureDeferred
async def test_disabled_in_the_directory_shows_at_the_next_lookup(slapd, context):
    user = User(sub="sub-oscar", login="oscar", name="Oscar")
    dn = user_dn("oscar")
    slapd.put(dn, user_attributes(user, "oscar-password"))
    try:
        async with opened(context, slapd.backend_config()) as directory:
            assert await log_in(directory, "oscar", "oscar-password") == user
            slapd.modify(dn, nsAccountLock="TRUE", description="left the company")
            oscar = await directory.user_by_id(user.sub)
            assert (oscar.disabled, oscar.disabled_reason) == (True, "left the company")
            slapd.modify(dn, nsAccountLock=[], description=[])
            assert await directory.user_by_id(user.sub) == user
            slapd.delete(dn)
            assert await directory.user_by_id(user.sub) is None
            assert isinstance(await refused(directory, "oscar", "oscar-password"), UnknownUser)
    finally:
        slapd.delete(dn)


# --- the standing cache ------------------------------------------------------------------


@asynccontextmanager
async def cached_chain(context, slapd_server, seconds: int):
    """The directory as a one-backend chain with a standing cache of C{seconds} on a fake clock."""
    clock = Clock()
    choice = PluginChoice("ldap", Section(slapd_server.backend_config(), "identity[0]", context.base_dir),
                          standing_cache=seconds)
    directory = backend(context, slapd_server.backend_config())
    chain = IdentityChain([directory], caches=[standing_cache(choice, directory, clock)])
    try:
        yield chain, clock, recorded(directory)
    finally:
        await chain.close()


@pytest.fixture
def oscar(slapd):
    user = User(sub="sub-oscar-cached", login="oscar-cached", name="Oscar")
    slapd.put(user_dn(user.login), user_attributes(user, "oscar-password"))
    yield user
    slapd.delete(user_dn(user.login))


@pytest_twisted.ensureDeferred
async def test_disabled_or_deleted_in_the_directory_acts_after_the_cache_time(slapd, context, oscar):
    dn = user_dn(oscar.login)
    async with cached_chain(context, slapd, 30) as (chain, clock, directory):
        assert await chain.user_by_id(oscar.sub) == oscar
        slapd.modify(dn, nsAccountLock="TRUE", description="left the company")
        clock.advance(29)
        assert await chain.user_by_id(oscar.sub) == oscar, "not before the cache time"
        assert len(directory.threads) == 1, "one directory search for both lookups"
        clock.advance(1)
        assert (await chain.user_by_id(oscar.sub)).disabled_reason == "left the company"
        slapd.delete(dn)
        assert (await chain.user_by_id(oscar.sub)).disabled
        clock.advance(30)
        assert await chain.user_by_id(oscar.sub) is None
        assert len(directory.threads) == 3


@pytest_twisted.ensureDeferred
async def test_zero_asks_the_directory_every_time(slapd, context, oscar):
    async with cached_chain(context, slapd, 0) as (chain, _, directory):
        assert chain._caches == (None,)
        assert await chain.user_by_id(oscar.sub) == oscar
        slapd.modify(user_dn(oscar.login), nsAccountLock="TRUE")
        assert (await chain.user_by_id(oscar.sub)).disabled
        assert len(directory.threads) == 2


@pytest_twisted.ensureDeferred
async def test_a_ban_in_the_store_acts_at_once_and_a_login_reads_afresh(slapd, context, oscar):
    store = MemoryStore()
    async with cached_chain(context, slapd, 60) as (chain, clock, _):
        now = int(clock.seconds())
        assert (await standing(chain, store, oscar.sub, now)).allowed
        await store.ban_user(Ban(oscar.sub, "spam", now))
        assert (await standing(chain, store, oscar.sub, now)).ban_reason == "spam"
        await store.unban_user(oscar.sub)
        slapd.modify(user_dn(oscar.login), nsAccountLock="TRUE", description="left the company")
        assert (await standing(chain, store, oscar.sub, now)).allowed, "cached"
        user = await log_in(chain, oscar.login, "oscar-password")
        assert user.disabled and not (await standing(chain, store, oscar.sub, now)).allowed


@pytest_twisted.ensureDeferred
async def test_concurrent_lookups_of_one_user_make_one_search(slapd, context, oscar):
    async with cached_chain(context, slapd, 30) as (chain, _, directory):
        users = await gatherResults([chain.user_by_id(oscar.sub) for _ in range(20)])
        assert users == [oscar] * 20
        assert len(directory.threads) == 1


def test_default_cache_time_by_backend(slapd, context, tmp_path):
    """Read-only backends keep users 30 s; ones authsrv writes to are asked every time; both configurable."""
    clock = Clock()
    ldap_choice = PluginChoice("ldap", Section({}, "identity[0]", tmp_path))
    static_choice = PluginChoice("static", Section({}, "identity[1]", tmp_path))
    ldap_backend = backend(context, slapd.backend_config())
    (tmp_path / "users.toml").write_text("")
    static_backend = find_factory("identity", "static").from_config(
        Section({"path": "users.toml"}, "identity[1]", tmp_path), context)
    assert standing_cache(ldap_choice, ldap_backend, clock)._seconds == DEFAULT_SECONDS == 30
    assert standing_cache(static_choice, static_backend, clock) is None
    assert standing_cache(attrs.evolve(static_choice, standing_cache=5), static_backend, clock)._seconds == 5
    assert standing_cache(attrs.evolve(ldap_choice, standing_cache=0), ldap_backend, clock) is None


# --- Active Directory --------------------------------------------------------------------


ANN_GUID = "3cb72409-f5fa-44a1-80f0-6142a002c488"


@pytest_twisted.ensureDeferred
async def test_active_directory_flavour(slapd, context):
    async with opened(context, ad_config(slapd)) as directory:
        ann = await log_in(directory, "ANN", "ann-password")
        assert ann == User(sub=ANN_GUID, login="ann", name="Ann Admin", email="ann@corp.example")
        assert await directory.user_by_id(ANN_GUID) == ann
        for sub in (ANN_GUID.upper(), "not-a-guid", "3cb72409f5fa44a180f06142a002c488"):
            assert await directory.user_by_id(sub) is None, sub
        ben = await directory.user_by_login("ben")
        assert (ben.disabled, ben.disabled_reason) == (True, ldap.DISABLED_REASON)
        assert (await directory.user_by_login("cid")).disabled is False
        assert not isinstance(await refused(directory, "ann", "wrong"), UnknownUser)


@pytest.mark.parametrize("membership", ["memberOf", "member"])
@pytest_twisted.ensureDeferred
async def test_active_directory_nested_groups(slapd, context, membership):
    """all-staff holds engineers, which holds ann (whose DN has an escaped comma) and ben."""
    config = ad_config(slapd, required_groups=[f"cn=all-staff,{CORP_GROUPS}"], group_membership=membership,
                       group_base_dn=CORP_GROUPS if membership == "member" else None, group_nesting_depth=2)
    async with opened(context, config) as directory:
        assert await disabled_reasons(directory, "ann", "ben", "cid") == {
            "ann": None, "ben": ldap.DISABLED_REASON, "cid": ldap.NOT_IN_GROUPS,
        }
    async with opened(context, {**config, "group_nesting_depth": 1}) as directory:
        assert await disabled_reasons(directory, "ann") == {"ann": ldap.NOT_IN_GROUPS}


def test_dn_key():
    assert ldap.dn_key("cn=Admin\\2C Ann,ou=Users, DC=x") == ldap.dn_key("CN=admin\\, ann,ou=users,dc=X")
    assert ldap.dn_key("cn=a,dc=x") != ldap.dn_key("cn=b,dc=x")


# --- TLS and servers -----------------------------------------------------------------------


TRANSPORTS = ["ldaps", "start_tls", "plain"]


def transport_config(slapd, tls: str) -> dict:
    return {
        "ldaps": slapd.backend_config(urls=[slapd.ldaps_url], start_tls=False),
        "start_tls": slapd.backend_config(),
        "plain": slapd.backend_config(start_tls=False, ca_file=None),
    }[tls]


@pytest.mark.parametrize("tls", TRANSPORTS)
@pytest_twisted.ensureDeferred
async def test_transports(slapd, context, tls):
    async with opened(context, transport_config(slapd, tls)) as directory:
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB


@pytest.mark.parametrize("tls", TRANSPORTS)
def test_connections_send_without_delay(slapd, tls):
    """
    ldap3 leaves Nagle's algorithm on: the handshake's last write and the
    bind request after it waited for the directory's delayed acknowledgement,
    about 40 ms on every password check (bench/README.md, "LDAP identity").
    """
    directory = Directory(settings_from_config(Section(transport_config(slapd, tls), "identity", ".")))
    connection = directory.open(user_dn("carol"), b"carol-password", 2)
    try:
        assert connection.bound
        assert connection.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        close_connection(connection)


@pytest.mark.parametrize("urls", ["ldaps", "start_tls"])
@pytest_twisted.ensureDeferred
async def test_untrusted_certificate_is_an_outage(slapd, context, urls):
    overrides = {"ca_file": str(slapd.other_ca_file)}
    if urls == "ldaps":
        overrides.update(urls=[slapd.ldaps_url], start_tls=False)
    async with opened(context, slapd.backend_config(**overrides)) as directory:
        with pytest.raises(BackendUnavailable):
            await log_in(directory, "carol", "carol-password")
        with pytest.raises(BackendUnavailable):
            await directory.user_by_id(CAROL_SUB)


@pytest_twisted.ensureDeferred
async def test_servers_are_tried_in_order(slapd, context):
    dead = f"ldap://127.0.0.1:{free_port()}"
    async with opened(context, slapd.backend_config(urls=[dead, slapd.url])) as directory:
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB


def counting_connections(directory) -> list[str]:
    """The URLs of the new connections a backend's directory opens from now on."""
    opened_urls: list[str] = []
    connect = directory._directory._connect

    def counted(url, *args):
        opened_urls.append(url)
        return connect(url, *args)

    directory._directory._connect = counted
    return opened_urls


def kept_for_checks(directory) -> list:
    return list(directory._directory._checkers)


@pytest_twisted.ensureDeferred
async def test_password_checks_keep_their_connection(slapd, context):
    """
    A check binds on a connection kept for checks (one round trip), not on
    a new connection with its TLS handshake each time; the kept connection
    holds no password between checks.
    """
    async with opened(context, slapd.backend_config()) as directory:
        new = counting_connections(directory)
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB
        assert len(new) == 2
        assert type(await refused(directory, "carol", "wrong")) is UnauthorizedLogin
        assert type(await refused(directory, "nobody", "wrong")) is UnknownUser
        assert (await log_in(directory, "dave", "dave-password")).sub == "sub-dave"
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB
        assert len(new) == 2
        (kept,) = kept_for_checks(directory)
        assert kept.tls_started and kept.password is None


@pytest_twisted.ensureDeferred
async def test_a_kept_check_connection_the_directory_dropped_is_replaced(slapd, context):
    async with opened(context, slapd.backend_config(pool_size=1)) as directory:
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB
        new = counting_connections(directory)
        with directory_down(slapd):
            pass
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB
        assert type(await refused(directory, "carol", "wrong")) is UnauthorizedLogin
        assert len(new) == 2
        assert all(kept.tls_started for kept in kept_for_checks(directory))


@pytest_twisted.ensureDeferred
async def test_a_closed_check_connection_is_never_bound_in_the_clear(slapd, context):
    """
    ldap3's bind on a connection it has closed (after a timeout, say) opens
    a new one without StartTLS and sends the password in the clear: such a
    connection is dropped, and the check goes on a new one with StartTLS.
    """
    async with opened(context, slapd.backend_config(pool_size=1)) as directory:
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB
        (kept,) = kept_for_checks(directory)
        kept.strategy.close()
        new = counting_connections(directory)
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB
        assert len(new) == 1
        (again,) = kept_for_checks(directory)
        assert again is not kept and again.tls_started


def test_a_check_that_timed_out_is_not_tried_again(slapd):
    """A kept connection's bind that timed out is an outage at once: a new connection would wait as long again."""
    bind_timeout = 2
    config = slapd.backend_config(bind_timeout=bind_timeout)
    directory = Directory(settings_from_config(Section(config, "identity", ".")))
    try:
        directory.check(user_dn("carol"), b"carol-password", bind_timeout)
        slapd.pause()
        try:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                directory.check(user_dn("carol"), b"carol-password", bind_timeout)
            assert time.monotonic() - started < 1.75 * bind_timeout
        finally:
            slapd.resume()
        directory.check(user_dn("carol"), b"carol-password", bind_timeout)
    finally:
        directory.close()


# --- outages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("base", ["user_base_dn", "group_base_dn"])
@pytest_twisted.ensureDeferred
async def test_a_search_base_the_directory_lacks_is_an_outage_not_removed_users(slapd, context, base):
    """
    The configured subtree is gone (renamed by the directory's operator, or
    a replica still loading): that says nothing about any user, so it is
    an outage, which ends no grant, and not every user removed (or out of
    the required groups), which a refresh would take as the end of their
    grant. A group that a user's memberOf names but that no longer exists
    is only not a group.
    """
    config = {**staff_config(slapd, 2), base: f"ou=gone,{SUFFIX}"}
    async with opened(context, config) as directory:
        with pytest.raises(BackendUnavailable, match="does not exist"):
            await directory.user_by_id(CAROL_SUB)
        with pytest.raises(BackendUnavailable):
            await standing(IdentityChain([directory]), MemoryStore(), CAROL_SUB, 0)
        with pytest.raises(BackendUnavailable):
            await log_in(directory, "carol", "carol-password")
    pia = User(sub="sub-pia", login="pia", name="Pia")
    dn = user_dn("pia")
    attributes = user_attributes(pia, "pia-password")
    slapd.put(dn, {**attributes, "objectClass": [*attributes["objectClass"], "authsrvTestDirectoryObject"],
                   "memberOf": f"cn=gone,{GROUPS}"})
    try:
        async with opened(context, staff_config(slapd, 2, group_membership="memberOf")) as directory:
            assert (await directory.user_by_id(pia.sub)).disabled_reason == ldap.NOT_IN_GROUPS
    finally:
        slapd.delete(dn)


@pytest_twisted.ensureDeferred
async def test_two_entries_with_one_subject_are_an_outage_not_a_removed_user(slapd, context):
    """
    A copy of carol's entry (restored from a backup, say) holds her sub
    too: which one is she? Not "no one", which a refresh would take as the
    end of her grants; the operator hears of it, as from the PostgreSQL
    backend's ambiguous lookups.
    """
    twin = user_dn("carol-twin")
    twin_user = User(sub=CAROL_SUB, login="carol-twin", name="Carol Twin")
    async with opened(context, slapd.backend_config()) as directory:
        slapd.put(twin, user_attributes(twin_user, "twin-password"))
        try:
            with pytest.raises(BackendUnavailable, match="several directory entries"):
                await directory.user_by_id(CAROL_SUB)
        finally:
            slapd.delete(twin)
        assert (await directory.user_by_id(CAROL_SUB)).login == "carol"


@pytest_twisted.ensureDeferred
async def test_directory_down_then_back(slapd, context):
    """Down: an outage at once, never a wrong password or a removed user. Back: pooled connections are replaced."""
    async with opened(context, slapd.backend_config()) as directory:
        assert (await directory.user_by_id(CAROL_SUB)).login == "carol"
        with directory_down(slapd):
            started = time.monotonic()
            for attempt in (
                log_in(directory, "carol", "carol-password"),
                log_in(directory, "carol", "wrong"),
                directory.user_by_id(CAROL_SUB),
                directory.user_by_login("carol"),
            ):
                with pytest.raises(BackendUnavailable):
                    await attempt
            assert time.monotonic() - started < 2
        assert (await log_in(directory, "carol", "carol-password")).sub == CAROL_SUB


@pytest_twisted.ensureDeferred
async def test_restart_between_two_lookups(slapd, context):
    """The pooled connection died with the old slapd: the lookup reconnects instead of failing."""
    async with opened(context, slapd.backend_config(pool_size=1)) as directory:
        assert (await directory.user_by_id(CAROL_SUB)).login == "carol"
        with directory_down(slapd):
            pass
        assert (await directory.user_by_id(CAROL_SUB)).login == "carol"
        assert (await log_in(directory, "dave", "dave-password")).sub == "sub-dave"


@pytest_twisted.ensureDeferred
async def test_hung_directory_times_out(slapd, context):
    """
    A server that accepts connections and never answers (StartTLS, or the
    bind) costs the timeouts, then is an outage.
    """
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)
        url = f"ldap://127.0.0.1:{hung.getsockname()[1]}"
        for start_tls, attempt in ((True, "login"), (False, "lookup")):
            config = slapd.backend_config(urls=[url], start_tls=start_tls,
                                          ca_file=str(slapd.ca_file) if start_tls else None,
                                          connect_timeout=1, bind_timeout=1, search_timeout=1)
            async with opened(context, config) as directory:
                started = time.monotonic()
                with pytest.raises(BackendUnavailable):
                    if attempt == "login":
                        await log_in(directory, "carol", "carol-password")
                    else:
                        await directory.user_by_id(CAROL_SUB)
                assert time.monotonic() - started < 3


@pytest_twisted.ensureDeferred
async def test_frozen_directory_times_out_without_retrying(slapd, context):
    """A search that times out is not tried again on a new connection: that would double the wait."""
    search_timeout, bind_timeout = 1, 5
    config = slapd.backend_config(search_timeout=search_timeout, bind_timeout=bind_timeout)
    async with opened(context, config) as directory:
        assert (await directory.user_by_id(CAROL_SUB)).login == "carol"
        slapd.pause()
        try:
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                await directory.user_by_id(CAROL_SUB)
            # A retry would also wait out a new connection's bind: both timeouts.
            assert 0.9 * search_timeout < time.monotonic() - started < search_timeout + bind_timeout
        finally:
            slapd.resume()
        assert (await directory.user_by_id(CAROL_SUB)).login == "carol"


@pytest_twisted.ensureDeferred
async def test_a_burst_on_a_frozen_directory_waits_about_one_timeout_not_one_per_pool_round(slapd, context):
    """
    Twelve lookups on two threads, each waiting out a one-second search on a
    frozen directory, took six seconds for the last; a lookup that waited
    longer than a search may take is refused without asking.
    """
    config = slapd.backend_config(search_timeout=1, bind_timeout=1, pool_size=2)
    async with opened(context, config) as directory:
        assert (await directory.user_by_id(CAROL_SUB)).login == "carol"
        slapd.pause()
        try:
            started = time.monotonic()
            outcomes = await gatherResults([directory.user_by_id(CAROL_SUB).addErrback(lambda f: f.value)
                                            for _ in range(12)])
            assert all(isinstance(outcome, BackendUnavailable) for outcome in outcomes)
            assert time.monotonic() - started < 3.5
        finally:
            slapd.resume()
        assert (await directory.user_by_id(CAROL_SUB)).login == "carol"


@pytest_twisted.ensureDeferred
async def test_a_slow_directory_that_answers_serves_every_queued_call(slapd, context):
    """Calls that waited past a search's timeout behind slow but good ones are served, not refused."""
    async with opened(context, slapd.backend_config(search_timeout=1, pool_size=1)) as directory:
        done = await gatherResults([directory._in_thread(time.sleep, 0.4) for _ in range(4)])
        assert done == [None] * 4


@pytest_twisted.ensureDeferred
async def test_connection_pool_is_bounded(slapd, context):
    async with opened(context, slapd.backend_config(pool_size=2)) as directory:
        users = await gatherResults([directory.user_by_id(CAROL_SUB) for _ in range(20)])
        assert {u.login for u in users} == {"carol"}
        assert len(directory._directory._idle) <= 2
        assert context.threadpool(ldap.POOL_NAME, 2).max == 2


# --- end to end: a real server on the directory -------------------------------------------


E2E_USER = User(sub="sub-e2e-pat", login="pat", name="Pat Enduser", email="pat@example.org", email_verified=True)
E2E_PASSWORD = "pat's directory password"
REDIRECT_URI = "http://127.0.0.1:9000/callback"
CLIENT_SECRET = "ldap-app-secret"
INTERNAL_SECRET = "ldap-internal-secret"


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else str(value)


@pytest.fixture
def ldap_server(run_server, slapd, tmp_path):
    """C{twist authsrv} with the directory as its only identity backend, and pat in the directory."""
    slapd.put(user_dn(E2E_USER.login), user_attributes(E2E_USER, E2E_PASSWORD))
    port = free_port()
    (tmp_path / "app-secret").write_text(CLIENT_SECRET + "\n")
    (tmp_path / "internal-secret").write_text(INTERNAL_SECRET + "\n")
    identity = "\n".join(f"{k} = {_toml(v)}" for k, v in slapd.backend_config(
        connect_timeout=1, bind_timeout=2, search_timeout=2, standing_cache=0).items())
    (tmp_path / "authsrv.toml").write_text(f"""
[server]
public_url = "http://127.0.0.1:{port}"
listen = ["tcp:{port}:interface=127.0.0.1"]

[internal]
secret_file = "internal-secret"

[store]
plugin = "sqlite"
path = "authsrv.sqlite3"

[keystore]
plugin = "jwk-file"
path = "keys.jwks.json"

[[identity]]
plugin = "ldap"
{identity}

[[clients]]
client_id = "app"
secret_file = "app-secret"
first_party = true
redirect_uris = ["{REDIRECT_URI}"]
""")
    yield run_server(["authsrv", "--config", str(tmp_path / "authsrv.toml")], tmp_path, port=port)
    slapd.delete(user_dn(E2E_USER.login))


def _form(html: str) -> tuple[str, dict]:
    action = re.search(r'<form [^>]*action="([^"]*)"', html).group(1)
    fields = dict(re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)"', html))
    return html_unescape(action), {k: html_unescape(v) for k, v in fields.items()}


def _login(server, login: str, password: str) -> tuple[requests.Response, str]:
    """Authorize, then submit the login form as a browser would: the answer and the PKCE verifier."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    browser = requests.Session()
    page = browser.get(f"{server.base}/api/auth/oauth2/authorize", params={
        "response_type": "code", "client_id": "app", "redirect_uri": REDIRECT_URI,
        "scope": "openid profile email offline_access", "state": "s", "code_challenge": challenge,
        "code_challenge_method": "S256",
    }, timeout=10)
    assert page.status_code == 200, page.text
    action, fields = _form(page.text)
    answer = browser.post(requests.compat.urljoin(page.url, action),
                          data={**fields, "username": login, "password": password}, allow_redirects=False, timeout=10)
    return answer, verifier


def _token(server, **form) -> requests.Response:
    return requests.post(f"{server.base}/api/auth/oauth2/token",
                         data={"client_id": "app", "client_secret": CLIENT_SECRET, **form}, timeout=10)


def _user_access(server, sub: str) -> dict:
    answer = requests.post(f"{server.base}/api/internal/user-access", json={"userId": sub},
                           headers={"authorization": f"Bearer {INTERNAL_SECRET}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.slow
def test_end_to_end_disabled_in_the_directory_and_outage(ldap_server, slapd):
    """
    Disabled in the directory: banned in user-access at once, refused at
    the next refresh. Directory down: logins say "try again later",
    refresh and UserInfo answer 503 without ending the grant, the server
    stays healthy; back up: the same refresh token works.
    """
    answer, verifier = _login(ldap_server, "PAT", E2E_PASSWORD)
    assert answer.status_code == 303, answer.text
    code = parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]
    tokens = _token(ldap_server, grant_type="authorization_code", code=code, redirect_uri=REDIRECT_URI,
                    code_verifier=verifier).json()
    userinfo = requests.get(f"{ldap_server.base}/api/auth/oauth2/userinfo",
                            headers={"authorization": f"Bearer {tokens['access_token']}"}, timeout=10).json()
    assert userinfo == {"sub": E2E_USER.sub, "name": "Pat Enduser", "email": "pat@example.org",
                        "email_verified": True}
    refreshed = _token(ldap_server, grant_type="refresh_token", refresh_token=tokens["refresh_token"])
    assert refreshed.status_code == 200, refreshed.text
    assert _user_access(ldap_server, E2E_USER.sub)["allowed"] is True

    slapd.modify(user_dn(E2E_USER.login), nsAccountLock="TRUE", description="left the company")
    assert _user_access(ldap_server, E2E_USER.sub) == {
        "allowed": False, "banned": True, "banReason": "left the company", "hasActiveGrant": True,
    }
    again = _token(ldap_server, grant_type="refresh_token", refresh_token=refreshed.json()["refresh_token"])
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"
    assert requests.get(f"{ldap_server.base}/api/auth/oauth2/userinfo", timeout=10,
                        headers={"authorization": f"Bearer {refreshed.json()['access_token']}"}).status_code == 401
    refused_login, _ = _login(ldap_server, "pat", E2E_PASSWORD)
    assert refused_login.status_code == 403 and "Account suspended" in refused_login.text

    slapd.modify(user_dn(E2E_USER.login), nsAccountLock=[], description=[])
    answer, verifier = _login(ldap_server, "pat", E2E_PASSWORD)
    code = parse_qs(urlsplit(answer.headers["location"]).query)["code"][0]
    tokens = _token(ldap_server, grant_type="authorization_code", code=code, redirect_uri=REDIRECT_URI,
                    code_verifier=verifier).json()
    slapd.stop()
    try:
        started = time.monotonic()
        outage, _ = _login(ldap_server, "pat", E2E_PASSWORD)
        assert outage.status_code == 503 and "try again later" in outage.text
        assert "incorrect" not in outage.text
        refresh = _token(ldap_server, grant_type="refresh_token", refresh_token=tokens["refresh_token"])
        assert refresh.status_code == 503 and refresh.json()["error"] == "temporarily_unavailable"
        assert requests.get(f"{ldap_server.base}/api/auth/oauth2/userinfo", timeout=10,
                            headers={"authorization": f"Bearer {tokens['access_token']}"}).status_code == 503
        assert time.monotonic() - started < 10
        assert requests.get(f"{ldap_server.base}/healthz", timeout=5).status_code == 200
        assert requests.get(f"{ldap_server.base}/readyz", timeout=5).status_code == 200
    finally:
        slapd.start()
    after = _token(ldap_server, grant_type="refresh_token", refresh_token=tokens["refresh_token"])
    assert after.status_code == 200, after.text
    back, _ = _login(ldap_server, "pat", E2E_PASSWORD)
    assert back.status_code == 303 and back.headers["location"].startswith(REDIRECT_URI)
    out, err = ldap_server.stop()
    assert "identity backend unavailable" in out + err
    for secret in (E2E_PASSWORD, SERVICE_PASSWORD):
        assert secret not in out + err


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_operator_command_finds_users_through_the_chain(slapd, tmp_path):
    """The operator names a directory user, or a static one behind it, by login or sub."""
    identity = "\n".join(f"{k} = {_toml(v)}" for k, v in slapd.backend_config().items())
    (tmp_path / "users.toml").write_text("")
    config = tmp_path / "authsrv.toml"
    config.write_text(f'[[identity]]\nplugin = "ldap"\n{identity}\n\n[[identity]]\nplugin = "static"\n')
    assert (await admin("--config", str(config), "check-config", cwd=tmp_path)).returncode == 0
    added = await admin("--config", str(config), "user", "add", "robot", "--sub", "svc-robot", "--password-stdin",
                  cwd=tmp_path, stdin="service account passphrase\n")
    assert added.returncode == 0, added.stderr
    for user, sub in (("carol", CAROL_SUB), ("svc-robot", "svc-robot")):
        done = await admin("--config", str(config), "ban", user, "--reason", "test", cwd=tmp_path)
        assert done.returncode == 0 and f"banned {sub}" in done.stdout, done.stderr
