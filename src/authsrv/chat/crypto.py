"""
Provider tokens encrypted at rest: the store only ever holds ciphertext, so a
leaked database or backup yields no usable chat-platform token without the
key from the config (C{[chat] encryption_key_env} or C{_file}).

AES-256-GCM, a random 96-bit nonce per value, and as associated data the
linked account's id and which token it is: a ciphertext copied to another
account's row, or from the refresh column to the access column, fails to
decrypt instead of being handed out.
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
VERSION = b"\x01"
ACCESS = "access"
REFRESH = "refresh"
_BASE64URL = re.compile(r"^[A-Za-z0-9_-]+$")


class UndecryptableToken(Exception):
    """A stored value that this key cannot open (another key, or tampered with)."""


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


class TokenCipher:
    """Seals and opens provider tokens for one linked account at a time."""

    def __init__(self, key: bytes):
        self._aead = AESGCM(key)

    @staticmethod
    def _associated(account_id: str, kind: str) -> bytes:
        return f"authsrv chat token\x00{kind}\x00{account_id}".encode()

    def encrypt(self, token: str, account_id: str, kind: str) -> bytes:
        """Version byte, nonce, then ciphertext with its tag."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, token.encode("utf-8"), self._associated(account_id, kind))
        return VERSION + nonce + sealed

    def decrypt(self, blob: bytes, account_id: str, kind: str) -> str:
        """The token, or L{UndecryptableToken}."""
        blob = bytes(blob)
        if blob[:1] != VERSION or len(blob) < 1 + NONCE_BYTES + 16:
            raise UndecryptableToken("not a sealed token of this version")
        nonce, sealed = blob[1:1 + NONCE_BYTES], blob[1 + NONCE_BYTES:]
        try:
            plain = self._aead.decrypt(nonce, sealed, self._associated(account_id, kind))
        except InvalidTag:
            raise UndecryptableToken("wrong key, or the value was altered") from None
        return plain.decode("utf-8")
