"""
The sealed copy of a refresh response kept for the grace window (docs/design.md,
Refresh tokens): a client that lost the answer to a rotation presents the
same refresh token again and must get the very same successor. The copy
holds the ID token as its claims, signed again on a replay
(L{authsrv.flows.issue.Minted.replayable}).

The copy is encrypted with AES-256-GCM under a key derived by HKDF-SHA256
from the presented refresh token itself, not from a server-side key. Only
that token's SHA-256 is stored, so the store (or a dump of it) cannot open
the copy and learn the successor tokens, while the replay, which needs the
presented token anyway, can. Nothing is shared between instances and no key
has to be provisioned or rotated; the token's 256 random bits make the
derived key as strong as a generated one, and a fresh nonce per seal keeps
it sound even though one token seals at most one response.
"""

from __future__ import annotations

import json
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from authsrv.compactjson import compact

_INFO = b"authsrv refresh replay v1"
_NONCE_BYTES = 12


def _key(refresh_token: str) -> AESGCM:
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO).derive(
        refresh_token.encode("utf-8")
    )
    return AESGCM(key)


def seal(response: dict, refresh_token: str) -> bytes:
    """The token response, encrypted for whoever presents C{refresh_token} again."""
    nonce = os.urandom(_NONCE_BYTES)
    plain = compact(response)
    return nonce + _key(refresh_token).encrypt(nonce, plain, _INFO)


def unseal(blob: bytes, refresh_token: str) -> dict | None:
    """The response sealed with C{refresh_token}, or None if it does not open."""
    try:
        plain = _key(refresh_token).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], _INFO)
    except (InvalidTag, ValueError):
        return None
    return json.loads(plain)
