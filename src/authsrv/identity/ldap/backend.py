"""
The LDAP backend itself: logins as a search then a bind, users read from
entries, required groups followed through nested groups.
"""

from __future__ import annotations

import secrets
import time
import uuid

from attrs import frozen
from ldap3 import BASE, DEREF_NEVER, SUBTREE
from ldap3.core.exceptions import LDAPInvalidDnError
from ldap3.utils.conv import escape_bytes, escape_filter_chars
from ldap3.utils.dn import parse_dn
from twisted.cred.credentials import IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from zope.interface import implementer

from authsrv.configsection import Section
from authsrv.identity.credentials import MAX_PASSWORD_BYTES, credential_text, password_bytes
from authsrv.identity.errors import BackendUnavailable, UnknownUser
from authsrv.identity.ldap.config import DISABLED_RULES, LdapSettings, settings_from_config
from authsrv.identity.ldap.directory import Directory
from authsrv.identity.static import login_key
from authsrv.interfaces import IIdentityBackend
from authsrv.records import User

log = Logger()

POOL_NAME = "ldap"

LOGIN_MAX = 256
"""Longer logins are unknown without asking the directory."""

DISABLED_REASON = "account disabled in the directory"
NOT_IN_GROUPS = "not a member of a required directory group"

_SIZE_LIMIT_EXCEEDED, _NO_SUCH_OBJECT = 4, 32


def dn_key(dn: str) -> str:
    """
    A DN in the form in which two spellings of one DN compare equal: escapes
    undone, attribute types and values case-folded, spaces around separators
    dropped (C{cn=Admin\\2C Ann} and C{CN=Admin\\, Ann} are one group).
    """
    try:
        parts = parse_dn(dn, escape=False, strip=True)
    except LDAPInvalidDnError:
        return dn.casefold()
    return "".join(f"{attr.casefold()}={_unescape_dn_value(value).casefold()}{sep}" for attr, value, sep in parts)


def _unescape_dn_value(value: str) -> str:
    raw = bytearray()
    index = 0
    encoded = value.encode("utf-8")
    while index < len(encoded):
        byte = encoded[index]
        if byte == 0x5C and index + 1 < len(encoded):
            pair = encoded[index + 1:index + 3]
            if len(pair) == 2 and all(c in b"0123456789abcdefABCDEF" for c in pair):
                raw.append(int(pair, 16))
                index += 3
                continue
            raw.append(encoded[index + 1])
            index += 2
            continue
        raw.append(byte)
        index += 1
    return raw.decode("utf-8", "replace")


class _Ambiguous:
    """What L{LdapIdentityBackend._user_by_id} finds when several entries hold the subject."""


_AMBIGUOUS = _Ambiguous()


def _unambiguous(user: User | _Ambiguous | None) -> User | None:
    """
    Several entries with one subject (a copy restored from a backup, say)
    are not "no such user", which would end the user's grants: they are
    an outage, as the PostgreSQL backend's ambiguous lookups, until the
    directory is fixed. Raised here, not in the pool, where it would count
    as the directory failing and close a good connection.
    """
    if isinstance(user, _Ambiguous):
        raise BackendUnavailable("several directory entries have one subject")
    return user


@frozen
class _Entry:
    """A search result: its DN and raw values, attribute names folded to lower case."""

    dn: str
    values: dict

    def raw(self, attribute: str | None) -> list[bytes]:
        return self.values.get(attribute.lower(), []) if attribute else []

    def text(self, attribute: str | None) -> str | None:
        for value in self.raw(attribute):
            text = value.decode("utf-8", "replace").strip()
            if text:
                return text
        return None


@implementer(IIdentityBackend)
class LdapIdentityBackend:
    """
    Users from a directory; see the package docstring. C{pool} is a bounded
    L{ThreadPool} that every directory operation runs on.
    """

    credentialInterfaces = (IUsernamePassword,)

    def __init__(self, settings: LdapSettings, reactor, pool):
        self._settings = settings
        self._reactor = reactor
        self._pool = pool
        self._directory = Directory(settings)
        self._failed_at: float | None = None
        """When a call last failed for the directory's sake (monotonic), or None since one succeeded."""
        self._any_user = settings.user_filter.replace("{login}", "*")
        self._decoy_dn = f"{settings.login_attribute}={secrets.token_hex(16)},{settings.user_base_dn}"
        self._required = {dn_key(g) for g in settings.required_groups}
        wanted = [
            settings.login_attribute, settings.subject_attribute, settings.name_attribute,
            settings.email_attribute, settings.picture_attribute, settings.chat_user_id_attribute,
            settings.email_verified_attribute, settings.disabled_reason_attribute,
            *settings.disabled_rules,
        ]
        if settings.required_groups and settings.group_membership == "memberOf":
            wanted.append("memberOf")
        self._attributes = list(dict.fromkeys(a for a in wanted if a))

    def _in_thread(self, function, *args) -> Deferred:
        """
        C{function(*args)} on the pool, unless the call waited there longer
        than a search may take while the directory is failing (a call failed
        within that time): asking a hung directory still would hold each
        waiting request for another timeout, one pool's worth at a time, a
        burst of them for minutes. A directory that is slow but answers
        serves every call, however long the queue.
        """
        queued = time.monotonic()
        timeout = self._settings.search_timeout

        def run():
            now, failed = time.monotonic(), self._failed_at
            if now - queued > timeout and failed is not None and now - failed < timeout:
                raise BackendUnavailable("the directory is failing, and this request waited longer than a search may"
                                         " take")
            try:
                result = function(*args)
            except BackendUnavailable:
                self._failed_at = time.monotonic()
                raise
            self._failed_at = None
            return result

        return deferToThreadPool(self._reactor, self._pool, run)

    # -- IIdentityBackend --

    def requestAvatarId(self, credentials) -> Deferred:
        """
        Fires with the user's sub after a successful bind as their entry;
        fails with L{UnknownUser}, L{UnauthorizedLogin} (an empty password
        too, which is never sent: an empty simple bind is an anonymous one
        and would succeed) or L{BackendUnavailable}.
        """
        return self._in_thread(self._check, credentials.username, credentials.password)

    def user_by_id(self, sub: str) -> Deferred:
        if not isinstance(sub, str) or self._subject_filter(sub) is None:
            return succeed(None)
        return self._in_thread(self._directory.run, lambda c: self._user_by_id(c, sub)).addCallback(_unambiguous)

    def user_by_login(self, login: str | bytes) -> Deferred:
        text = credential_text(login)
        if not text or len(text) > LOGIN_MAX:
            return succeed(None)
        return self._in_thread(self._directory.run, lambda c: self._user_by_login(c, text))

    def close(self) -> Deferred:
        self._directory.close()
        return succeed(None)

    # -- in pool threads --

    def _check(self, username, password) -> str:
        """
        A search, then a bind: as the user's entry when the search found
        one, else as L{_decoy_dn} with a random password of the same length,
        which cannot succeed. So an unknown login costs the directory the
        same round trips as a wrong password (a bind, on a connection kept
        for checks or a new one: L{Directory.check}), and its failure stays
        L{UnknownUser}. A password no one can bind with (empty, which would
        be an anonymous bind; over L{MAX_PASSWORD_BYTES}; not UTF-8, which
        ldap3 cannot send) is refused without a bind, whoever it is for.
        """
        login = credential_text(username)
        if not login or len(login) > LOGIN_MAX:
            raise UnknownUser("unknown login")
        entry, sub = self._directory.run(lambda c: self._login_entry(c, login))
        secret = password_bytes(password)
        if not secret or len(secret) > MAX_PASSWORD_BYTES or credential_text(secret) is None:
            raise UnknownUser("unknown login") if entry is None else UnauthorizedLogin("no user's password")
        if entry is None:
            decoy = secrets.token_urlsafe(len(secret)).encode("ascii")[:len(secret)]
            try:
                self._directory.check(self._decoy_dn, decoy, self._settings.bind_timeout)
            except UnauthorizedLogin:
                pass
            raise UnknownUser("unknown login")
        self._directory.check(entry.dn, secret, self._settings.bind_timeout)
        return sub

    def _login_entry(self, connection, login: str):
        entry = self._find_by_login(connection, login)
        return (entry, self._subject(entry)) if entry is not None else (None, None)

    def _user_by_login(self, connection, login: str) -> User | None:
        entry = self._find_by_login(connection, login)
        return None if entry is None else self._user(connection, entry)

    def _user_by_id(self, connection, sub: str) -> User | _Ambiguous | None:
        search_filter = self._subject_filter(sub)
        if search_filter is None:
            return None
        found = [
            e for e in self._search(connection, search_filter, size_limit=2)
            if self._subject(e) == sub
        ]
        if len(found) > 1:
            log.error("{count} directory entries have the subject {sub!r}", count=len(found), sub=sub)
            return _AMBIGUOUS
        return self._user(connection, found[0]) if found else None

    # -- searching --

    def _search(self, connection, search_filter: str, *, base: str | None = None, scope=SUBTREE,
                attributes=None, size_limit: int = 0) -> list[_Entry]:
        settings = self._settings
        connection.search(
            base or settings.user_base_dn, search_filter, scope, dereference_aliases=DEREF_NEVER,
            attributes=self._attributes if attributes is None else attributes,
            size_limit=size_limit, time_limit=max(1, int(settings.search_timeout)),
        )
        result = connection.result
        if result["result"] == _NO_SUCH_OBJECT:
            if scope == BASE:
                return []  # a group that a memberOf still names, deleted since
            # The configured subtree is missing (renamed, or a replica still
            # loading): no answer about any user, so never "removed", which
            # would end every grant at its next refresh.
            raise BackendUnavailable(f"directory search base {base or settings.user_base_dn!r} does not exist")
        if result["result"] not in (0, _SIZE_LIMIT_EXCEEDED):
            raise BackendUnavailable(f"directory search failed: {result['description']} {result['message']}")
        return [
            _Entry(r["dn"], {k.lower(): list(v) for k, v in r["raw_attributes"].items()})
            for r in connection.response or ()
            if r.get("type") == "searchResEntry"
        ]

    def _find_by_login(self, connection, login: str) -> _Entry | None:
        """
        The one entry the filter matches for C{login} whose login attribute
        equals it: the directory's matching ignores spaces that the login
        form does not, so C{" alice"} is no one.
        """
        search_filter = self._settings.user_filter.replace("{login}", escape_filter_chars(login))
        key = login_key(login)
        found = [
            e for e in self._search(connection, search_filter, size_limit=2)
            if any(login_key(v.decode("utf-8", "replace")) == key for v in e.raw(self._settings.login_attribute))
        ]
        if len(found) > 1:
            log.error("the user filter matches several directory entries for login {login!r}", login=login)
            return None
        if found and self._subject(found[0]) is None:
            log.error("directory entry {dn!r} has no {attribute}: it cannot log in",
                      dn=found[0].dn, attribute=self._settings.subject_attribute)
            return None
        return found[0] if found else None

    def _subject_filter(self, sub: str) -> str | None:
        """
        The filter finding C{sub}, or None when it cannot be a subject of
        this directory: L{_subject} reads only printable ASCII, so anything
        else (a lone surrogate from a JSON body too, which no directory
        request could even encode) is no one, without asking.
        """
        if not sub or len(sub) > 255 or not (sub.isascii() and sub.isprintable()):
            return None
        if self._settings.subject_is_guid:
            try:
                value = escape_bytes(uuid.UUID(sub).bytes_le)
            except ValueError:
                return None
        else:
            value = escape_filter_chars(sub)
        return f"(&{self._any_user}({self._settings.subject_attribute}={value}))"

    def _subject(self, entry: _Entry) -> str | None:
        raw = entry.raw(self._settings.subject_attribute)
        if not raw:
            return None
        if self._settings.subject_is_guid:
            return str(uuid.UUID(bytes_le=raw[0])) if len(raw[0]) == 16 else None
        text = raw[0].decode("utf-8", "replace")
        return text if text.isascii() and text.isprintable() and 0 < len(text) <= 255 else None

    # -- the record --

    def _user(self, connection, entry: _Entry) -> User | None:
        settings = self._settings
        sub, login = self._subject(entry), entry.text(settings.login_attribute)
        if sub is None or login is None:
            return None
        email = entry.text(settings.email_attribute)
        reason = self._disabled_reason(entry)
        if reason is None and self._required and not self._in_required_groups(connection, entry):
            reason = NOT_IN_GROUPS
        return User(
            sub=sub,
            login=login,
            name=entry.text(settings.name_attribute),
            picture=entry.text(settings.picture_attribute),
            email=email,
            email_verified=email is not None and self._email_verified(entry),
            disabled=reason is not None,
            disabled_reason=reason,
            chat_user_id=entry.text(settings.chat_user_id_attribute),
        )

    def _email_verified(self, entry: _Entry) -> bool:
        policy = self._settings.email_verified
        if policy == "attribute":
            value = entry.text(self._settings.email_verified_attribute) or ""
            return value.lower() in ("true", "1", "yes")
        return policy == "always"

    def _disabled_reason(self, entry: _Entry) -> str | None:
        for rule in self._settings.disabled_rules:
            if DISABLED_RULES[rule](entry.raw(rule)):
                return entry.text(self._settings.disabled_reason_attribute) or DISABLED_REASON
        return None

    def _in_required_groups(self, connection, entry: _Entry) -> bool:
        """
        Whether the entry is in a required group, directly or through
        groups in groups, up to C{group_nesting_depth} levels (1: directly);
        a cycle of groups ends where it closes.
        """
        settings = self._settings
        seen: set[str] = set()
        if settings.group_membership == "memberOf":
            level = {dn_key(dn): dn for dn in self._member_of(entry)}
        else:
            level = self._groups_with_members(connection, [entry.dn])
        for depth in range(1, settings.group_nesting_depth + 1):
            if self._required & level.keys():
                return True
            seen |= level.keys()
            if depth == settings.group_nesting_depth or not level:
                return False
            if settings.group_membership == "memberOf":
                parents: dict[str, str] = {}
                for group in level.values():
                    for found in self._search(connection, "(objectClass=*)", base=group, scope=BASE,
                                              attributes=["memberOf"]):
                        parents.update((dn_key(dn), dn) for dn in self._member_of(found))
            else:
                parents = self._groups_with_members(connection, list(level.values()))
            level = {k: dn for k, dn in parents.items() if k not in seen}
        return False

    @staticmethod
    def _member_of(entry: _Entry) -> list[str]:
        return [v.decode("utf-8", "replace") for v in entry.raw("memberOf")]

    def _groups_with_members(self, connection, members: list[str]) -> dict[str, str]:
        attribute = self._settings.group_membership
        clauses = "".join(f"({attribute}={escape_filter_chars(dn)})" for dn in members)
        found = self._search(connection, f"(|{clauses})", base=self._settings.group_base_dn, attributes=["1.1"])
        groups = {dn_key(e.dn): e.dn for e in found}
        if connection.result["result"] == _SIZE_LIMIT_EXCEEDED and not self._required & groups.keys():
            # The groups the directory left out may hold a required one: not
            # knowing is an outage, never a membership lost (the end of the
            # user's grants at the next refresh).
            log.error("the directory's size limit cut short the search for the groups of {members!r} under"
                      " {base!r}: raise the limit for bind_dn", members=members[:3],
                      base=self._settings.group_base_dn)
            raise BackendUnavailable("the directory's size limit cut a group search short")
        return groups


def from_config(section: Section, context) -> LdapIdentityBackend | None:
    """
    Build the backend from its C{[[identity]]} section; nothing connects
    until the first login or lookup, so a directory that is down at start
    only makes logins answer "try again later".
    """
    settings = settings_from_config(section)
    if context.check_only:
        return None
    return LdapIdentityBackend(settings, context.reactor, context.threadpool(POOL_NAME, settings.pool_size))
