"""
Rules for what an operator may register for a client (OAuth 2.1 section 2.3
and RFC 9700 section 2.1): absolute redirect URIs without fragments, https
except on the loopback interface, or a private-use scheme for native apps.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

CLIENT_ID_MAX = 128


def is_loopback_host(host: str) -> bool:
    """Whether C{host} names the loopback interface, where plain http is allowed."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def redirect_uri_problem(uri: str) -> str | None:
    """What is wrong with C{uri} as a registered redirect URI, or None."""
    try:
        parts = urlsplit(uri)
        parts.port
    except ValueError as e:
        return f"{uri!r} is not a valid URI ({e})"
    if not parts.scheme:
        return f"{uri!r} is not an absolute URI"
    if parts.fragment or uri.endswith("#"):
        return f"{uri!r} must not contain a fragment"
    if parts.scheme == "https":
        return None if parts.hostname else f"{uri!r} has no host"
    if parts.scheme == "http":
        if parts.hostname and is_loopback_host(parts.hostname):
            return None
        return f"{uri!r} must use https (plain http only on the loopback interface)"
    if "." in parts.scheme:
        return None
    return (
        f"{uri!r} must use https, http on loopback, or a private-use scheme"
        " such as com.example.app:/callback"
    )


def client_id_problem(client_id: str) -> str | None:
    """What is wrong with C{client_id}, or None: printable ASCII, no spaces or colon."""
    if not client_id:
        return "must not be empty"
    if len(client_id) > CLIENT_ID_MAX:
        return f"must be at most {CLIENT_ID_MAX} characters"
    if not all("!" <= c <= "~" for c in client_id) or ":" in client_id:
        return f"{client_id!r} may hold only printable ASCII without spaces or ':'"
    return None
