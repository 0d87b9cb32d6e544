"""
The device authorization grant's own rules (RFC 8628): user codes a person
can read off a TV and type on a phone, and the device authorization
request's parameters. Pure: no storage, no HTTP.
"""

from __future__ import annotations

import secrets
from urllib.parse import urlsplit

from authsrv.protocol.errors import InvalidScope, InvalidTarget
from authsrv.protocol.scope import parse_scope
from authsrv.records import Client

DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
"""Consonants only (RFC 8628 section 6.1): no vowels to spell words, no digits to confuse with letters."""
USER_CODE_LENGTH = 8
"""20^8, about 34.5 bits: hopeless to guess under the throttle within a code's few minutes."""
SLOW_DOWN_STEP = 5
"""Seconds added to a device's polling interval each time it polls too fast (RFC 8628 section 3.5)."""


def new_user_code() -> str:
    """A fresh user code as shown to a person: two groups of four, C{BCDF-GHJK}."""
    letters = "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))
    return f"{letters[:4]}-{letters[4:]}"


def user_code_key(text: str) -> str | None:
    """
    A user code as typed (any case, with or without the hyphen or spaces)
    in its one stored form, or None when it cannot be a user code at all.
    """
    letters = "".join(text.split()).replace("-", "").upper()
    if len(letters) != USER_CODE_LENGTH or any(c not in USER_CODE_ALPHABET for c in letters):
        return None
    return letters


def shown(key: str) -> str:
    """The stored form of a user code as the device shows it."""
    return f"{key[:4]}-{key[4:]}"


def device_scope(params: dict[str, str], offered: tuple[str, ...]) -> frozenset[str]:
    """
    The scope a device asks for (RFC 8628 section 3.1): the C{offered}
    values in it, none when omitted. Other values are ignored, as at the
    authorization endpoint (OIDC Core 3.1.2.1); a scope with none of the
    offered values is invalid_scope.
    """
    scope = parse_scope(params.get("scope", ""))
    known = scope & frozenset(offered)
    if scope and not known:
        raise InvalidScope(f"scope has no value this server offers; use space-separated values of {', '.join(offered)}")
    return known


def device_resource(client: Client, params: dict[str, str]) -> tuple[str, ...]:
    """The one resource (RFC 8707) a device may ask for, checked as at the authorization endpoint."""
    resource = params.get("resource")
    if resource is None:
        return ()
    parts = urlsplit(resource)
    if not parts.scheme or "#" in resource:
        raise InvalidTarget("resource must be an absolute URI without a fragment")
    if resource not in client.resources:
        raise InvalidTarget("this client may not request that resource")
    return (resource,)
