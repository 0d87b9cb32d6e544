"""
Random secrets and how they are stored.

Tokens, codes, session ids and client secrets carry at least 256 bits of
entropy, so a plain SHA-256 is a sound and fast way to store them (docs/design.md,
Client authentication): a slow password hash would cost every request.

Client secrets live longer than any token and some are chosen by operators,
so theirs is keyed as well: an HMAC-SHA-256, under a server key kept in the
store, of the secret's SHA-256. A stolen copy of the clients table alone then
lets nobody test guesses offline. Hashing the digest rather than the secret
lets a stored plain SHA-256 (the legacy form, no prefix) be turned into the
keyed form without knowing the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import string
from collections.abc import Sequence

KEYED_PREFIX = "hmac-sha256:"
"""Marks a client secret hash keyed with the server key; a bare hex digest is the legacy form."""
CLIENT_SECRET_KEY = "client-secrets"
"""The name of the server key that client secret hashes are keyed with."""
STRONG_BITS = 128
"""The least entropy a configured secret must have outside a loopback demo."""


def new_token(nbytes: int = 32) -> str:
    """A URL-safe random string with C{nbytes} of entropy (default 256 bits)."""
    return secrets.token_urlsafe(nbytes)


def token_hash(token: str) -> str:
    """The SHA-256 hex digest under which a token is stored and looked up."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def fingerprint(token: str) -> str:
    """Eight hex digits naming a token in logs without revealing it."""
    return token_hash(token)[:8]


def _keyed(digest: str, key: bytes) -> str:
    return KEYED_PREFIX + hmac.digest(key, digest.encode("ascii"), "sha256").hex()


def client_secret_hash(secret: str, key: bytes) -> str:
    """The keyed form under which a client secret is stored."""
    return _keyed(token_hash(secret), key)


def keyed_form(stored_hash: str, key: bytes) -> str:
    """C{stored_hash} in the keyed form: a legacy plain SHA-256 is keyed, a keyed one kept."""
    return stored_hash if stored_hash.startswith(KEYED_PREFIX) else _keyed(stored_hash, key)


def secret_matches(secret: str, stored_hashes: Sequence[str], key: bytes) -> list[bool]:
    """
    Whether C{secret} is each of C{stored_hashes} (a client's current and
    previous secret, say), in either form, every one compared in constant
    time: one SHA-256 for all and, where any is keyed, one HMAC.
    """
    digest = token_hash(secret)
    keyed = None
    matches = []
    for stored_hash in stored_hashes:
        if stored_hash.startswith(KEYED_PREFIX):
            if keyed is None:
                keyed = _keyed(digest, key)
            matches.append(hmac.compare_digest(keyed, stored_hash))
        else:
            matches.append(hmac.compare_digest(digest, stored_hash))
    return matches


_CLASSES = (string.ascii_lowercase, string.ascii_uppercase, string.digits)


def entropy_bits(secret: str) -> float:
    """
    A conservative estimate of a secret's entropy: its length times log2 of
    the size of the character classes it uses (lower case, upper case,
    digits, other printable ASCII; anything else counts as a class of 128),
    as if every character were drawn at random from them.
    """
    alphabet = sum(len(c) for c in _CLASSES if any(ch in c for ch in secret))
    if any(ch in string.punctuation or ch == " " for ch in secret):
        alphabet += len(string.punctuation) + 1
    if any(not ch.isascii() for ch in secret):
        alphabet += 128
    return len(secret) * math.log2(alphabet) if alphabet > 1 else 0.0


def weak_secret_problem(secret: str) -> str | None:
    """Why C{secret} is too weak to configure outside a loopback demo, or None."""
    bits = entropy_bits(secret)
    if bits >= STRONG_BITS:
        return None
    return (
        f"is too weak (about {int(bits)} bits, at least {STRONG_BITS} needed); make one with"
        ' python3 -c "import secrets; print(secrets.token_urlsafe(32))"'
    )
