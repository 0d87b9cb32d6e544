"""
The C{[[identity]]} section of plugin C{ldap}: flavours' defaults, the
rules that tell a disabled account, and the validated L{LdapSettings}.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import TypedDict, overload
from urllib.parse import urlsplit

from attrs import field, frozen
from ldap3.core.exceptions import LDAPInvalidDnError, LDAPInvalidFilterError
from ldap3.operation.search import parse_filter
from ldap3.utils.dn import parse_dn
from twisted.logger import Logger

from authsrv.configsection import ConfigError, Section

log = Logger()

_ACCOUNTDISABLE = 0x2
"""Active Directory's userAccountControl flag for a disabled account."""


def _ns_account_lock(values: list[bytes]) -> bool:
    return any(v.strip().lower() == b"true" for v in values)


def _pwd_account_locked(values: list[bytes]) -> bool:
    """
    The password policy's administrative lock (draft-behera-ldap-password-policy,
    pwdAccountLockedTime): 000001010000Z, set by a password administrator,
    which only one can clear. Any other value is the time the directory
    locked the password after failed attempts, which anyone who knows the
    login can cause: the directory refuses password binds meanwhile, but the
    account is not disabled, or a stranger could end its sessions everywhere.
    """
    return any(v.strip()[:8] == b"00000101" for v in values)


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

class _Flavour(TypedDict):
    user_filter: str
    login_attribute: str
    subject_attribute: str
    name_attribute: str
    group_membership: str
    disabled_rule: list[str]


FLAVOURS: dict[str, _Flavour] = {
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


@overload
def _attribute(section: Section, name: str, default: str) -> str: ...


@overload
def _attribute(section: Section, name: str, default: None) -> str | None: ...


def _attribute(section: Section, name: str, default: str | None) -> str | None:
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
