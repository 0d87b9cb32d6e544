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

from authsrv.sealing import Sealer, Unsealable, key_from_text, new_key_text

ACCESS = "access"
REFRESH = "refresh"
__all__ = ["ACCESS", "REFRESH", "TokenCipher", "UndecryptableToken", "key_from_text", "new_key_text"]

UndecryptableToken = Unsealable
"""A stored token that this key cannot open (another key, or tampered with)."""


class TokenCipher:
    """Seals and opens provider tokens for one linked account at a time (L{authsrv.sealing})."""

    def __init__(self, key: bytes):
        self._sealer = Sealer(key)

    @staticmethod
    def _associated(account_id: str, kind: str) -> bytes:
        return f"authsrv chat token\x00{kind}\x00{account_id}".encode()

    def encrypt(self, token: str, account_id: str, kind: str) -> bytes:
        """Version byte, nonce, then ciphertext with its tag."""
        return self._sealer.seal(token.encode("utf-8"), self._associated(account_id, kind))

    def decrypt(self, blob: bytes, account_id: str, kind: str) -> str:
        """The token, or L{UndecryptableToken}."""
        return self._sealer.open(blob, self._associated(account_id, kind)).decode("utf-8")
