"""
Random secrets and how they are stored.

Tokens, codes, session ids and client secrets carry at least 256 bits of
entropy, so a plain SHA-256 is a sound and fast way to store them (docs/design.md,
Client authentication): a slow password hash would cost every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


def new_token(nbytes: int = 32) -> str:
    """A URL-safe random string with C{nbytes} of entropy (default 256 bits)."""
    return secrets.token_urlsafe(nbytes)


def token_hash(token: str) -> str:
    """The SHA-256 hex digest under which a token is stored and looked up."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def fingerprint(token: str) -> str:
    """Eight hex digits naming a token in logs without revealing it."""
    return token_hash(token)[:8]


def secret_matches(secret: str, stored_hash: str) -> bool:
    """Whether C{secret} hashes to C{stored_hash}, compared in constant time."""
    return hmac.compare_digest(token_hash(secret), stored_hash)
