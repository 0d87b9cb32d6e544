"""
The LDAP identity backend: users from an enterprise directory (OpenLDAP,
Active Directory, anything speaking LDAPv3), on ldap3.

A login is a search, then a bind (ldaptor's LDAPBindingChecker, Dex's LDAP
connector): the service account (or an anonymous search) finds the one
entry the configured filter matches, and a bind as that entry checks the
password, so no password hash ever leaves the directory. Every value a user
typed is escaped before it enters a filter.

ldap3 blocks, so every directory operation runs on the server's bounded
C{ldap} thread pool, on a connection that one thread uses at a time; a
pooled connection the directory dropped (a restart, an idle timeout) is
replaced and the operation tried once more, and an unreachable, refusing or
hung directory is L{BackendUnavailable} within the configured timeouts,
never a wrong password.

The directory is asked again on every L{LdapIdentityBackend.user_by_id},
which the server does on refresh, user-access, UserInfo and introspection:
a user disabled there, removed, or no longer in the required groups loses
access at once.
"""

from __future__ import annotations

import re
import ssl
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from attrs import field, frozen
from ldap3 import ANONYMOUS, BASE, DEREF_NEVER, NONE, SIMPLE, SUBTREE, SYNC, Connection, Server, Tls
from ldap3.core.exceptions import LDAPException, LDAPInvalidDnError, LDAPInvalidFilterError
from ldap3.operation.search import parse_filter
from ldap3.utils.conv import escape_bytes, escape_filter_chars
from ldap3.utils.dn import parse_dn
from twisted.cred.credentials import IUsernamePassword
from twisted.cred.error import UnauthorizedLogin
from twisted.internet.defer import Deferred, succeed
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from zope.interface import implementer

from authsrv.configsection import ConfigError, Section
from authsrv.identity.credentials import credential_text
from authsrv.identity.errors import BackendUnavailable, UnknownUser
from authsrv.identity.static import login_key
from authsrv.interfaces import IIdentityBackend
from authsrv.records import User

log = Logger()

POOL_NAME = "ldap"

LOGIN_MAX = 256
"""Longer logins are unknown without asking the directory."""

DISABLED_REASON = "account disabled in the directory"
NOT_IN_GROUPS = "not a member of a required directory group"

_ACCOUNTDISABLE = 0x2
"""Active Directory's userAccountControl flag for a disabled account."""


def _ns_account_lock(values: list[bytes]) -> bool:
    return any(v.strip().lower() == b"true" for v in values)


def _pwd_account_locked(values: list[bytes]) -> bool:
    # ppolicy: any lock time, including the permanent 000001010000Z.
    return bool(values)


def _account_disabled(values: list[bytes]) -> bool:
    try:
        return any(int(v) & _ACCOUNTDISABLE for v in values)
    except ValueError:
        return True


DISABLED_RULES = {
    "nsAccountLock": _ns_account_lock,
    "pwdAccountLockedTime": _pwd_account_locked,
    "userAccountControl": _account_disabled,
}
"""Each rule is named after the attribute it reads."""

FLAVOURS = {
    "openldap": {
        "user_filter": "(&(objectClass=inetOrgPerson)(uid={login}))",
        "login_attribute": "uid",
        "subject_attribute": "entryUUID",
        "name_attribute": "cn",
        "group_membership": "member",
        "disabled_rule": ["nsAccountLock", "pwdAccountLockedTime"],
    },
    "active_directory": {
        "user_filter": "(&(objectCategory=person)(objectClass=user)(sAMAccountName={login}))",
        "login_attribute": "sAMAccountName",
        "subject_attribute": "objectGUID",
        "name_attribute": "displayName",
        "group_membership": "memberOf",
        "disabled_rule": ["userAccountControl"],
    },
}

GROUP_MEMBERSHIPS = ("member", "uniqueMember", "memberOf")

_BIND_REFUSED = {48, 49, 50, 53}
"""Bind results that mean "not with this password": inappropriate authentication,
invalid credentials, insufficient access, unwilling to perform (locked, expired)."""

_SIZE_LIMIT_EXCEEDED, _NO_SUCH_OBJECT = 4, 32

_ATTRIBUTE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9-]*|[0-9]+(?:\.[0-9]+)+)$")


@frozen
class LdapSettings:
    """A validated C{[[identity]]} section of plugin C{ldap}."""

    urls: tuple[str, ...]
    user_base_dn: str
    user_filter: str
    login_attribute: str
    subject_attribute: str
    start_tls: bool = False
    ca_file: Path | None = None
    bind_dn: str | None = None
    bind_password: str | None = field(default=None, repr=False)
    name_attribute: str | None = "cn"
    email_attribute: str | None = "mail"
    picture_attribute: str | None = None
    chat_user_id_attribute: str | None = None
    email_verified: str = "never"
    email_verified_attribute: str | None = None
    required_groups: tuple[str, ...] = ()
    group_membership: str = "member"
    group_base_dn: str | None = None
    group_nesting_depth: int = 5
    disabled_rules: tuple[str, ...] = ()
    disabled_reason_attribute: str | None = None
    connect_timeout: float = 5
    bind_timeout: float = 10
    search_timeout: float = 10
    pool_size: int = 4

    @property
    def subject_is_guid(self) -> bool:
        """Active Directory's objectGUID is 16 bytes, shown as a UUID in AD's byte order."""
        return self.subject_attribute.lower() == "objectguid"


# --- values -------------------------------------------------------------------


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


# --- connections ----------------------------------------------------------------


class _Dropped(Exception):
    """A pooled connection failed in a way a new connection may not."""


def _close(connection: Connection) -> None:
    try:
        connection.unbind()
    except (LDAPException, OSError):
        pass


class _Directory:
    """
    Connections to the directory, for use from pool threads: service
    connections kept for reuse, each used by one thread at a time, and
    short-lived connections that bind as a user to check a password.
    """

    def __init__(self, settings: LdapSettings):
        self._settings = settings
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def _tls(self, host: str) -> Tls:
        ca_file = str(self._settings.ca_file) if self._settings.ca_file else None
        return Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=ca_file, sni=host)

    def _connect(self, url: str, user: str | None, password: bytes | None, timeout: float) -> Connection:
        """An open connection to C{url}, bound as C{user}; its result tells how the bind went."""
        settings = self._settings
        parts = urlsplit(url)
        secure = parts.scheme.lower() == "ldaps"
        server = Server(
            parts.hostname, port=parts.port or (636 if secure else 389), use_ssl=secure,
            tls=self._tls(parts.hostname) if secure or settings.start_tls else None,
            get_info=NONE, connect_timeout=settings.connect_timeout,
        )
        connection = Connection(
            server, user=user, password=password, authentication=SIMPLE if user else ANONYMOUS,
            client_strategy=SYNC, receive_timeout=timeout, read_only=True, auto_referrals=False,
            raise_exceptions=False, return_empty_attributes=False,
        )
        try:
            connection.open()
            if settings.start_tls and not secure:
                connection.start_tls()
            connection.bind()
        except BaseException:
            _close(connection)
            raise
        return connection

    def open(self, user: str | None, password: bytes | None, timeout: float) -> Connection:
        """
        A connection to the first server, in the configured order, that
        answers, bound as C{user} (anonymously for None); raises
        L{UnauthorizedLogin} when a server refuses the password, else
        L{BackendUnavailable} when none answers.
        """
        problems = []
        for url in self._settings.urls:
            try:
                connection = self._connect(url, user, password, timeout)
            except (LDAPException, OSError) as e:
                problems.append(f"{url}: {e}")
                continue
            if connection.bound:
                return connection
            result = connection.result
            _close(connection)
            if result["result"] in _BIND_REFUSED:
                raise UnauthorizedLogin(f"the directory refused the bind: {result['description']}")
            problems.append(f"{url}: bind answered {result['description']} {result['message']}".strip())
        raise BackendUnavailable("directory unavailable: " + "; ".join(problems))

    def _service_connection(self) -> Connection:
        settings = self._settings
        password = settings.bind_password.encode("utf-8") if settings.bind_password else None
        try:
            connection = self.open(settings.bind_dn, password, settings.bind_timeout)
        except UnauthorizedLogin as e:
            log.error("the directory refused the bind of bind_dn {bind_dn!r}: check it and its password",
                      bind_dn=settings.bind_dn)
            raise BackendUnavailable(str(e)) from None
        connection.socket.settimeout(settings.search_timeout)
        return connection

    def run(self, operation):
        """
        C{operation(connection)} on a service connection, taken from the
        pool or new; a pooled connection the directory dropped is replaced
        and the operation tried once more.
        """
        with self._lock:
            pooled = self._idle.pop() if self._idle else None
        if pooled is not None:
            try:
                return self._use(pooled, operation, retry=True)
            except _Dropped:
                pass
        return self._use(self._service_connection(), operation, retry=False)

    def _use(self, connection: Connection, operation, *, retry: bool):
        try:
            result = operation(connection)
        except (LDAPException, OSError) as e:
            _close(connection)
            if retry and not isinstance(e, TimeoutError):
                raise _Dropped() from e
            raise BackendUnavailable(f"directory unavailable: {e}") from None
        except BaseException:
            _close(connection)
            raise
        with self._lock:
            if not self._closed:
                self._idle.append(connection)
                return result
        _close(connection)
        return result

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            _close(connection)


# --- the backend ----------------------------------------------------------------


@implementer(IIdentityBackend)
class LdapIdentityBackend:
    """
    Users from a directory; see the module docstring. C{pool} is a bounded
    L{ThreadPool} that every directory operation runs on.
    """

    credentialInterfaces = (IUsernamePassword,)

    def __init__(self, settings: LdapSettings, reactor, pool):
        self._settings = settings
        self._reactor = reactor
        self._pool = pool
        self._directory = _Directory(settings)
        self._any_user = settings.user_filter.replace("{login}", "*")
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
        return deferToThreadPool(self._reactor, self._pool, function, *args)

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
        return self._in_thread(self._directory.run, lambda c: self._user_by_id(c, sub))

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
        login = credential_text(username)
        if not login or len(login) > LOGIN_MAX:
            raise UnknownUser("unknown login")
        entry, sub = self._directory.run(lambda c: self._login_entry(c, login))
        if entry is None:
            raise UnknownUser("unknown login")
        secret = password.encode("utf-8", "surrogatepass") if isinstance(password, str) else password
        if not secret:
            raise UnauthorizedLogin("empty password")
        _close(self._directory.open(entry.dn, secret, self._settings.bind_timeout))
        return sub

    def _login_entry(self, connection, login: str):
        entry = self._find_by_login(connection, login)
        return (entry, self._subject(entry)) if entry is not None else (None, None)

    def _user_by_login(self, connection, login: str) -> User | None:
        entry = self._find_by_login(connection, login)
        return None if entry is None else self._user(connection, entry)

    def _user_by_id(self, connection, sub: str) -> User | None:
        found = [
            e for e in self._search(connection, self._subject_filter(sub), size_limit=2)
            if self._subject(e) == sub
        ]
        if len(found) != 1:
            if found:
                log.error("{count} directory entries have the subject {sub!r}", count=len(found), sub=sub)
            return None
        return self._user(connection, found[0])

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
            log.warn("directory search base {base!r} does not exist", base=base or settings.user_base_dn)
            return []
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
        """The filter finding C{sub}, or None when it cannot be a subject of this directory."""
        if not sub or len(sub) > 255:
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
                parents = {}
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
        return {dn_key(e.dn): e.dn for e in found}


# --- configuration --------------------------------------------------------------


def _attribute(section: Section, name: str, default) -> str | None:
    value = section.str(name, default)
    if value is not None and not _ATTRIBUTE.match(value):
        raise section.error(name, f"{value!r} is not an attribute name")
    return value


def _dn(section: Section, name: str, value: str, key: str | None = None) -> str:
    try:
        parse_dn(value, escape=False, strip=True)
    except LDAPInvalidDnError:
        raise ConfigError(key or section.key(name), f"{value!r} is not a DN") from None
    return value


def _urls(section: Section) -> tuple[str, ...]:
    urls = tuple(section.str_list("urls"))
    if not urls:
        raise section.error("urls", "must name at least one directory server")
    for index, url in enumerate(urls):
        parts = urlsplit(url)
        try:
            parts.port
        except ValueError:
            raise ConfigError(f"{section.key('urls')}[{index}]", f"{url!r} has a bad port") from None
        if parts.scheme.lower() not in ("ldap", "ldaps") or not parts.hostname or parts.path.strip("/"):
            raise ConfigError(
                f"{section.key('urls')}[{index}]",
                f"{url!r} is not an ldap://host[:port] or ldaps://host[:port] URL",
            )
    return urls


def _timeout(section: Section, name: str, default: int) -> int:
    value = section.duration(name, default)
    if value < 1:
        raise section.error(name, "must be at least 1 second")
    return value


def settings_from_config(section: Section) -> LdapSettings:
    """Validate a section into L{LdapSettings}; raises L{ConfigError} naming the key."""
    flavour = section.str("flavour", "openldap", choices=tuple(FLAVOURS))
    defaults = FLAVOURS[flavour]
    urls = _urls(section)
    start_tls = section.bool("start_tls", False)
    tls = start_tls or any(u.lower().startswith("ldaps:") for u in urls)
    if start_tls and any(u.lower().startswith("ldaps:") for u in urls):
        raise section.error("start_tls", "applies to ldap:// URLs; ldaps:// is TLS from the start")
    ca_file = section.path_("ca_file", None)
    if ca_file is not None:
        if not tls:
            raise section.error("ca_file", "is only used with TLS: ldaps:// URLs or start_tls = true")
        if not ca_file.is_file():
            raise section.error("ca_file", f"{ca_file} is not a readable file")
        try:
            ssl.create_default_context(cafile=str(ca_file))
        except (ssl.SSLError, OSError) as e:
            raise section.error("ca_file", f"{ca_file} holds no usable CA certificate ({e})") from None
    bind_dn = section.str("bind_dn", None)
    bind_password = section.secret("bind_password", required=False)
    if bind_dn is not None:
        _dn(section, "bind_dn", bind_dn)
        if bind_password is None:
            raise section.error("bind_password_env", "is required with bind_dn (or bind_password_file)")
    elif bind_password is not None:
        raise section.error("bind_dn", "is required with a bind password")
    user_base_dn = _dn(section, "user_base_dn", section.str("user_base_dn"))
    user_filter = section.str("user_filter", defaults["user_filter"])
    if "{login}" not in user_filter:
        raise section.error("user_filter", "must contain {login}, where the escaped login goes")
    try:
        parse_filter(user_filter.replace("{login}", "x"), None, True, True, None, False)
    except LDAPInvalidFilterError:
        raise section.error("user_filter", f"{user_filter!r} is not an LDAP filter") from None
    email_verified = section.str("email_verified", "never", choices=("always", "never", "attribute"))
    email_verified_attribute = _attribute(section, "email_verified_attribute", None)
    if (email_verified == "attribute") != (email_verified_attribute is not None):
        raise section.error(
            "email_verified_attribute", 'is required with email_verified = "attribute", and only then'
        )
    required_groups = tuple(
        _dn(section, "required_groups", g, f"{section.key('required_groups')}[{i}]")
        for i, g in enumerate(section.str_list("required_groups", []))
    )
    group_membership = section.str("group_membership", defaults["group_membership"], choices=GROUP_MEMBERSHIPS)
    group_base_dn = section.str("group_base_dn", None)
    if group_base_dn is not None:
        _dn(section, "group_base_dn", group_base_dn)
    elif required_groups and group_membership != "memberOf":
        raise section.error("group_base_dn", f"is required to find groups by {group_membership}")
    disabled_rules = tuple(section.str_list("disabled_rule", defaults["disabled_rule"]))
    for index, rule in enumerate(disabled_rules):
        if rule not in DISABLED_RULES:
            raise ConfigError(
                f"{section.key('disabled_rule')}[{index}]",
                f"must be one of {', '.join(map(repr, DISABLED_RULES))}, not {rule!r}",
            )
    settings = LdapSettings(
        urls=urls,
        start_tls=start_tls,
        ca_file=ca_file,
        bind_dn=bind_dn,
        bind_password=bind_password,
        user_base_dn=user_base_dn,
        user_filter=user_filter,
        login_attribute=_attribute(section, "login_attribute", defaults["login_attribute"]),
        subject_attribute=_attribute(section, "subject_attribute", defaults["subject_attribute"]),
        name_attribute=_attribute(section, "name_attribute", defaults["name_attribute"]),
        email_attribute=_attribute(section, "email_attribute", "mail"),
        picture_attribute=_attribute(section, "picture_attribute", None),
        chat_user_id_attribute=_attribute(section, "chat_user_id_attribute", None),
        email_verified=email_verified,
        email_verified_attribute=email_verified_attribute,
        required_groups=required_groups,
        group_membership=group_membership,
        group_base_dn=group_base_dn,
        group_nesting_depth=section.int("group_nesting_depth", 5, minimum=1),
        disabled_rules=disabled_rules,
        disabled_reason_attribute=_attribute(section, "disabled_reason_attribute", None),
        connect_timeout=_timeout(section, "connect_timeout", 5),
        bind_timeout=_timeout(section, "bind_timeout", 10),
        search_timeout=_timeout(section, "search_timeout", 10),
        pool_size=section.int("pool_size", 4, minimum=1),
    )
    section.done()
    if not tls:
        log.warn("LDAP without TLS: passwords cross the network in clear to {urls}", urls=", ".join(urls))
    return settings


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
