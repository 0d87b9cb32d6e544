"""
CSRF tokens of the login and consent forms, bound to the browser: the token
is an HMAC of the pending request id keyed by a random device cookie, so a
form posted from another site (SameSite=Lax keeps the cookie away) or from
another browser (a login CSRF planting the attacker's account) fails.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import TypeGuard

_DEVICE = re.compile(r"^[A-Za-z0-9_-]{43}$")


def valid_device_secret(value: str | None) -> TypeGuard[str]:
    """Whether a device cookie looks like one this service made (L{authsrv.tokens.new_token})."""
    return value is not None and bool(_DEVICE.match(value))


def form_token(device_secret: str, request_id: str) -> str:
    return hmac.new(device_secret.encode(), request_id.encode(), hashlib.sha256).hexdigest()


def form_token_valid(stored: str, sent: str | None, device_secret: str | None, request_id: str) -> bool:
    """The form's token is the stored one and this browser's device cookie derives it (constant time)."""
    if sent is None:
        return False
    sent_ok = hmac.compare_digest(stored.encode(), sent.encode())
    return kept_for(stored, device_secret, request_id) and sent_ok


def kept_for(stored: str, device_secret: str | None, request_id: str) -> bool:
    """
    Whether this browser's device cookie derives the request's stored form
    token, so the request was kept for this browser (constant time): what
    lets only that browser open the request's pages, as its forms post.
    """
    if not valid_device_secret(device_secret):
        return False
    return hmac.compare_digest(stored.encode(), form_token(device_secret, request_id).encode())


def tab_key(request_id: str) -> str:
    """The name, within its cookie's, of a request's copy of a new device secret (a cookie-safe prefix of its id)."""
    return request_id[:16]


def session_form_token(cookie_value: str, purpose: bytes) -> str:
    """
    The CSRF token of a form for the signed-in browser: an HMAC of C{purpose}
    keyed by the session cookie's value itself, so only a page this service
    rendered for that browser (the cookie is HttpOnly) can produce it, with
    no state kept.
    """
    return hmac.new(cookie_value.encode(), purpose, hashlib.sha256).hexdigest()


def session_form_token_valid(cookie_value: str | None, purpose: bytes, sent: str | None) -> bool:
    if not cookie_value or sent is None:
        return False
    return hmac.compare_digest(session_form_token(cookie_value, purpose).encode(), sent.encode())
