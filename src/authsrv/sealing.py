"""
Values the server must read back in plain, kept sealed at rest: AES-256-GCM
under a key from the config (never from the store), a random 96-bit nonce
per value, and associated data naming what the value belongs to, so a
sealed value copied to another row fails to open instead of being used.
Chat-platform tokens, keystore keys and client_secret_jwt secrets use it.
"""

from __future__ import annotations

import base64
import binascii
import os
import re

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
VERSION = b"\x01"
_BASE64URL = re.compile(r"^[A-Za-z0-9_-]+$")


class Unsealable(Exception):
    """A stored value that this key cannot open (another key, another owner, or tampered with)."""


def key_from_text(text: str) -> bytes:
    """
    The key from its base64url text (padding optional); raises
    L{ValueError} saying what is wrong, never echoing the text.
    """
    compact = text.strip().rstrip("=")
    if not _BASE64URL.match(compact):
        raise ValueError("must be base64url text")
    try:
        key = base64.urlsafe_b64decode(compact + "=" * (-len(compact) % 4))
    except binascii.Error:
        raise ValueError("must be base64url text") from None
    if len(key) != KEY_BYTES:
        raise ValueError(f"must be {KEY_BYTES} bytes encoded as base64url, not {len(key)} bytes")
    return key


def new_key_text() -> str:
    """A fresh key as an operator writes it into a secret file."""
    return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).rstrip(b"=").decode("ascii")


class Sealer:
    """Seals and opens values under one key; C{owner} is the associated data."""

    def __init__(self, key: bytes):
        self._aead = AESGCM(key)

    def seal(self, plain: bytes, owner: bytes) -> bytes:
        """Version byte, nonce, then ciphertext with its tag."""
        nonce = os.urandom(NONCE_BYTES)
        return VERSION + nonce + self._aead.encrypt(nonce, plain, owner)

    def open(self, blob: bytes, owner: bytes) -> bytes:
        """The plain value, or L{Unsealable}."""
        blob = bytes(blob)
        if blob[:1] != VERSION or len(blob) < 1 + NONCE_BYTES + TAG_BYTES:
            raise Unsealable("not a sealed value of this version")
        try:
            return self._aead.decrypt(blob[1:1 + NONCE_BYTES], blob[1 + NONCE_BYTES:], owner)
        except InvalidTag:
            raise Unsealable("wrong key, or the value was altered") from None
