"""
Rules for what an operator may register for a client (OAuth 2.1 section 2.3
and RFC 9700 section 2.1): absolute redirect URIs without fragments, https
except on the loopback interface, or a private-use scheme for native apps.
A redirect URI holds only RFC 3986's characters, and an http(s) one a host
name or IP address and no user name: a browser reads
C{http://evil.example\\@127.0.0.1/cb} as a URI on evil.example, where
Python's parser sees 127.0.0.1, so the host checks and the browser would
disagree.
"""

from __future__ import annotations

import ipaddress
import re
import string
from urllib.parse import urlsplit

CLIENT_ID_MAX = 128
_URI_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]@!$&'()*+,;=%")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?"
_HOST_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")
_AUTHORITY = re.compile(r"(?:\[[0-9A-Fa-f:.]+(?:%25[\w.~-]+)?\]|[^\[\]:]+)(?::[0-9]{0,5})?")
"""A host (a bracketed IPv6 literal, or no brackets or colon at all) and an optional port: all an http(s) authority holds here."""


def is_loopback_host(host: str) -> bool:
    """Whether C{host} names the loopback interface, where plain http is allowed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _is_host(host: str) -> bool:
    """Whether C{host} is a DNS name or an IP address."""
    if _HOST_NAME.fullmatch(host):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def uri_characters_problem(uri: str) -> str | None:
    """What is wrong with the characters of C{uri} (RFC 3986 allows no space, control or non-ASCII one), or None."""
    if not set(uri) <= _URI_CHARACTERS or _BAD_PERCENT.search(uri):
        return (f"{uri!r} holds characters a URI may not (RFC 3986): percent-encode spaces, backslashes,"
                " quotes and non-ASCII characters")
    return None


def redirect_uri_problem(uri: str) -> str | None:
    """What is wrong with C{uri} as a registered redirect URI, or None."""
    if problem := uri_characters_problem(uri):
        return problem
    try:
        parts = urlsplit(uri)
        parts.port
    except ValueError as e:
        return f"{uri!r} is not a valid URI ({e})"
    if not parts.scheme:
        return f"{uri!r} is not an absolute URI"
    if parts.fragment or uri.endswith("#"):
        return f"{uri!r} must not contain a fragment"
    if parts.scheme in ("http", "https"):
        host = parts.hostname
        if "@" in parts.netloc:
            return f"{uri!r} must not hold a user name or password"
        if not host or not _is_host(host) or not _AUTHORITY.fullmatch(parts.netloc):
            return f"{uri!r} has no host name or IP address"
        if parts.scheme == "https" or is_loopback_host(host):
            return None
        return f"{uri!r} must use https (plain http only on the loopback interface)"
    if "." in parts.scheme:
        return None
    return (
        f"{uri!r} must use https, http on loopback, or a private-use scheme"
        " such as com.example.app:/callback"
    )


def stored_client_id_problem(client_id: str) -> str | None:
    """
    What is wrong with C{client_id} for a client the store keeps (the admin
    API's or an import's), or None: also no '/', and not '.' or '..', since
    the admin API names a stored client in its path.
    """
    if "/" in client_id or client_id in (".", ".."):
        return "must not hold '/' nor be '.' or '..': the admin API names a client in its path"
    return client_id_problem(client_id)


def client_id_problem(client_id: str) -> str | None:
    """What is wrong with C{client_id}, or None: printable ASCII, no spaces or colon."""
    if not client_id:
        return "must not be empty"
    if len(client_id) > CLIENT_ID_MAX:
        return f"must be at most {CLIENT_ID_MAX} characters"
    if not all("!" <= c <= "~" for c in client_id) or ":" in client_id:
        return f"{client_id!r} may hold only printable ASCII without spaces or ':'"
    return None
