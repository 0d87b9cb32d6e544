"""
RFC 7636 with S256 only (OAuth 2.1 section 4.1.1: plain is not offered).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re

_VERIFIER = re.compile(r"[A-Za-z0-9\-._~]{43,128}")
_CHALLENGE = re.compile(r"[A-Za-z0-9\-_]{43}")
"""
Matched whole (C{fullmatch}): C{$} would also match before a final newline,
so a challenge or verifier ending in one would pass (RFC 7636 section 4.1
allows unreserved characters only).
"""


def valid_challenge(challenge: str) -> bool:
    """Whether C{challenge} can be an S256 challenge: 43 base64url characters."""
    return bool(_CHALLENGE.fullmatch(challenge))


def valid_verifier(verifier: str) -> bool:
    return bool(_VERIFIER.fullmatch(verifier))


def s256(verifier: str) -> str:
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def verify(verifier: str, challenge: str) -> bool:
    """Whether C{verifier} matches an S256 C{challenge} (constant-time)."""
    return valid_verifier(verifier) and hmac.compare_digest(s256(verifier), challenge)
